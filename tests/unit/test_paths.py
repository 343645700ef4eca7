"""Allowed roots (SPARKTUNE_ALLOWED_ROOTS): what is inside a root, `..` and symlink tricks included."""

from __future__ import annotations

import os

import pytest
from sparktune.core.config import parse_roots
from sparktune.core.paths import check_allowed_uri, check_table_name, expand_braces, normalize_uri

ROOTS = ("/data", "s3://bucket/lake", "dbfs:/Volumes/main/raw")


@pytest.mark.parametrize(
    "uri",
    [
        "/data",
        "/data/",
        "/data/x.parquet",
        "/data/./x/../y.csv",
        "/data/exports/*.jsonl",
        "/data/{a,b}/part-*.parquet",
        "file:///data/x",
        "file:/data/x",
        "file://localhost/data/x",
        "s3://bucket/lake",
        "s3://bucket/lake/tickets/date=2026-01-01",
        "s3://bucket/lake/a/../b",
        "S3://bucket/lake/x",  # schemes are case-insensitive
        "dbfs:/Volumes/main/raw/tickets",
        "dbfs:///Volumes/main/raw/tickets",
    ],
)
def test_inside_a_root(uri):
    check_allowed_uri("source_uri", uri, ROOTS)


@pytest.mark.parametrize(
    ("uri", "resolves_to"),
    [
        ("/data/../etc/passwd", "/etc/passwd"),
        ("/data/x/../../etc", "/etc"),
        ("/data2/x", None),  # a prefix of the path, not of its segments
        ("/dat", None),
        ("/", None),
        ("/etc/passwd", None),
        ("file:///data/../etc/passwd", "/etc/passwd"),
        ("file:///etc/passwd", "/etc/passwd"),
        ("file://otherhost/data/x", None),  # another host's /data
        ("s3://bucket/lake/../other", "s3://bucket/other"),
        ("s3://bucket/lake/x/../../other", "s3://bucket/other"),
        ("s3://bucket/lake/%2e%2e/other", "s3://bucket/other"),  # percent-escaped ..
        ("s3://bucket/lake?/../../other", "s3://bucket/other"),  # ? is part of a Hadoop path
        ("s3://bucket/lake2", None),
        ("s3://bucket/lakeside/x", None),
        ("s3://other-bucket/lake/x", None),
        ("s3://Bucket/lake/x", None),  # buckets are compared exactly
        ("s3a://bucket/lake/x", None),  # another scheme is another file system
        ("gs://bucket/lake/x", None),
        ("s3:bucket/lake/x", None),  # Hadoop reads a scheme here, not a local file
        ("dbfs:/Volumes/main/raw/../other", "dbfs:/Volumes/main/other"),
        ("/data/{.}{.}/etc/passwd", "/etc/passwd"),  # braces Hadoop expands into ..
        ("/data/{x,../../etc}/passwd", "/etc/passwd"),
        ("s3://bucket/lake/{a,../b}", "s3://bucket/b"),
    ],
)
def test_outside_every_root_is_refused_naming_param_value_roots_and_fix(uri, resolves_to):
    with pytest.raises(ValueError) as caught:
        check_allowed_uri("source_uri", uri, ROOTS)
    message = str(caught.value)
    assert message.startswith(f"source_uri: {uri!r}")
    assert "/data, s3://bucket/lake, dbfs:/Volumes/main/raw" in message
    assert "SPARKTUNE_ALLOWED_ROOTS" in message and "Fix: use a location under one of those roots" in message
    if resolves_to:
        assert f"(resolves to {resolves_to})" in message


def test_no_roots_allow_everything():
    check_allowed_uri("output_uri", "/etc/../anything", ())
    check_table_name("source_uri", "parquet.`/etc`", ())


def test_relative_paths_are_resolved_against_the_current_directory(tmp_path, monkeypatch):
    (tmp_path / "data" / "in").mkdir(parents=True)
    roots = (str(tmp_path / "data"),)
    monkeypatch.chdir(tmp_path / "data")
    check_allowed_uri("source_uri", "in/x.csv", roots)
    check_allowed_uri("source_uri", "./x.csv", roots)
    with pytest.raises(ValueError, match=r"resolves to .*/etc/x\.csv"):
        check_allowed_uri("source_uri", "../etc/x.csv", roots)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="outside the allowed roots"):
        check_allowed_uri("source_uri", "in/x.csv", roots)


def test_a_symlink_under_a_root_that_points_outside_is_refused(tmp_path):
    data, secret = tmp_path / "data", tmp_path / "secret"
    data.mkdir()
    secret.mkdir()
    (secret / "passwd").write_text("x")
    (data / "escape").symlink_to(secret)
    (data / "inside").mkdir()
    (data / "alias").symlink_to(data / "inside")
    roots = (str(data),)

    with pytest.raises(ValueError, match=rf"resolves to {secret}/passwd"):
        check_allowed_uri("source_uri", str(data / "escape" / "passwd"), roots)
    with pytest.raises(ValueError, match="outside the allowed roots"):
        check_allowed_uri("source_uri", str(data / "escape"), roots)
    # A glob that would walk through the symlink is matched against the disk too.
    with pytest.raises(ValueError, match=rf"resolves to {secret}/passwd"):
        check_allowed_uri("source_uri", str(data / "*" / "passwd"), roots)
    # A symlink that stays inside the root is fine.
    check_allowed_uri("source_uri", str(data / "alias" / "x.csv"), roots)


def test_a_root_that_is_itself_a_symlink_compares_by_its_target(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    check_allowed_uri("source_uri", str(tmp_path / "real" / "x"), (str(tmp_path / "link"),))
    check_allowed_uri("source_uri", str(tmp_path / "link" / "x"), (str(tmp_path / "real"),))


def test_normalized_forms():
    assert str(normalize_uri("s3://bucket/a/./b/../c/")) == "s3://bucket/a/c"
    assert str(normalize_uri("file:///data/x/..")) == os.path.realpath("/data")
    assert normalize_uri("S3://bucket/x").scheme == "s3"
    assert normalize_uri("s3://bucket/..").path == "/"
    assert str(normalize_uri("dbfs:/Volumes/../x")) == "dbfs:/x"


def test_brace_expansion():
    assert expand_braces("/a/{b,c{d,e}}/f") == ["/a/b/f", "/a/cd/f", "/a/ce/f"]
    assert expand_braces("/plain") == ["/plain"]
    assert expand_braces("/a/{unbalanced") == ["/a/{unbalanced"]


def test_roots_setting_is_comma_separated_and_blank_means_unrestricted():
    assert parse_roots(" /data , s3://bucket/lake ,,") == ("/data", "s3://bucket/lake")
    assert parse_roots("") == () and parse_roots(None) == ()


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("tickets", True),
        ("db.tickets", True),
        ("catalog.db.tickets", True),
        ("parquet.`/etc/passwd`", False),  # Spark's SQL on files
        ("parquet.tickets", False),  # read as the file "tickets" when no database parquet exists
        ("csv.x", False),
        ("db.`weird name`", False),
        ("a.b.c.d", False),
    ],
)
def test_table_names_must_be_plain_when_roots_are_set(name, ok):
    if ok:
        check_table_name("source_uri", name, ROOTS)
    else:
        with pytest.raises(ValueError, match="not a plain table name"):
            check_table_name("source_uri", name, ROOTS)


# --------------------------------------------------------------------------------------------
# The deployment setting and the pipeline params


def test_settings_read_the_roots_and_always_allow_the_pipelines_own_data(monkeypatch, tmp_path):
    from sparktune.core.config import settings

    monkeypatch.setenv("SPARKTUNE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SPARKTUNE_LAKE_URI", raising=False)
    monkeypatch.delenv("SPARKTUNE_FEEDBACK_URI", raising=False)
    monkeypatch.delenv("SPARKTUNE_ALLOWED_ROOTS", raising=False)
    assert settings().allowed_roots == ()
    monkeypatch.setenv("SPARKTUNE_ALLOWED_ROOTS", "/data, s3://bucket/lake")
    home = settings().home
    assert settings().allowed_roots == (
        "/data",
        "s3://bucket/lake",
        str(home / "lake"),
        f"{home / 'lake'}/feedback",
        str(home / "data"),
    )


@pytest.mark.parametrize(
    ("source_uri", "source_format", "refused"),
    [
        ("/data/../etc/passwd", "auto", True),
        ("s3://bucket/lake/../other/x.parquet", "parquet", True),
        ("/data/tickets.jsonl", "auto", False),
        ("s3://bucket/lake/tickets", "parquet", False),
        ("db.tickets", "auto", False),
        ("parquet.`/etc`", "table", True),
        ("", "auto", False),  # the demo data under SPARKTUNE_HOME
    ],
)
def test_parse_params_refuses_a_source_outside_the_roots_with_every_other_problem(
    monkeypatch, source_uri, source_format, refused
):
    from sparktune.core.params import InvalidParamsError, parse_params

    monkeypatch.setenv("SPARKTUNE_ALLOWED_ROOTS", "/data,s3://bucket/lake")
    raw = {"source_uri": source_uri, "source_format": source_format}
    if not refused:
        assert parse_params(raw).source_uri == source_uri
        return
    with pytest.raises(InvalidParamsError) as caught:
        parse_params({**raw, "min_chars": 50, "max_chars": 10})
    problems = caught.value.problems
    assert any(p.startswith("source_uri: ") and "SPARKTUNE_ALLOWED_ROOTS" in p for p in problems)
    assert any(p.startswith("min_chars") for p in problems)  # reported together


def test_parse_params_allows_anything_when_the_deployment_sets_no_roots(monkeypatch):
    from sparktune.core.params import parse_params

    monkeypatch.delenv("SPARKTUNE_ALLOWED_ROOTS", raising=False)
    assert parse_params({"source_uri": "/data/../etc/passwd"}).source_uri == "/data/../etc/passwd"


def test_a_run_id_becomes_one_folder_name():
    from sparktune.core.paths import path_segment

    assert path_segment("manual__2026-11-23T10:00:00+00:00") == "manual__2026-11-23T10_00_00_00_00"
    assert path_segment("../../etc") == ".._.._etc" and "/" not in path_segment("a/b")
    assert len(path_segment("x" * 500)) == 200
