"""The metadata tables the embedded runner reads, as Airflow 3.3's migration creates them: the
fake databases of the runner's tests (tests/operators/test_embedded_*.py) start from this."""

# What Airflow 3.3's migration creates for these tables (foreign keys and most task_instance
# columns left out).
SCHEMA = """
create table alembic_version (version_num varchar(32) not null);
insert into alembic_version values ('29ce7909c52b');
create table dag_run (
    id integer not null primary key, dag_id varchar(250) not null, run_id varchar(250) not null,
    run_type varchar(50) not null, state varchar(50), run_after timestamp not null
);
create table task_instance (
    id varchar(36) not null primary key, task_id varchar(250) not null, dag_id varchar(250) not null,
    run_id varchar(250) not null, map_index integer default -1 not null, start_date timestamp,
    state varchar(20), try_number integer
);
create table xcom (
    dag_run_id integer not null, task_id varchar(250) not null, map_index integer default -1 not null,
    "key" varchar(512) not null, dag_result boolean, dag_id varchar(250) not null,
    run_id varchar(250) not null, value json, timestamp timestamp not null,
    primary key (dag_run_id, task_id, map_index, "key")
);
"""
