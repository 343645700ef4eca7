-- Runs once, when the postgres-db volume is first created (docker-entrypoint-initdb.d).
-- Airflow's database ("airflow") comes from POSTGRES_DB; MLflow and Marquez get their own.
CREATE DATABASE mlflow;
CREATE DATABASE marquez;
