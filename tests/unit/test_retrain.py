"""The decision to skip a retraining run that would train the champion again."""

from __future__ import annotations

from sparktune.release.retrain import retrain_decision

CHAMPION_TAGS = {"data_fingerprint": "fp1", "config_hash": "cfg1", "code_fingerprint": "c0de"}


def decide(**changes):
    values = {"data_fingerprint": "fp1", "config_hash": "cfg1", "code_fingerprint": "c0de", **changes}
    return retrain_decision(champion_version="4", champion_tags=CHAMPION_TAGS, **values)


def test_same_data_config_and_code_skips_and_says_why():
    decision = decide()
    assert not decision.train
    assert (
        "champion v4" in decision.reason and "fp1" in decision.reason and "force_retrain" in decision.reason
    )


def test_any_change_trains_and_names_it():
    for field, value in (("data_fingerprint", "fp2"), ("config_hash", "cfg2"), ("code_fingerprint", "c0de2")):
        decision = decide(**{field: value})
        assert decision.train, field
        assert f"{field} {CHAMPION_TAGS[field]} -> {value}" in decision.reason


def test_no_champion_or_untagged_champion_or_force_trains():
    assert retrain_decision(
        champion_version=None, champion_tags={}, data_fingerprint="a", config_hash="b", code_fingerprint="c"
    ).train
    untagged = retrain_decision(
        champion_version="1", champion_tags={}, data_fingerprint="a", config_hash="b", code_fingerprint="c"
    )
    assert untagged.train and "(not recorded)" in untagged.reason
    assert decide(force=True).train


def test_code_fingerprint_follows_the_package_sources_only(tmp_path):
    import shutil
    from pathlib import Path

    import sparktune
    from sparktune.core.provenance import code_fingerprint

    copy = tmp_path / "sparktune"
    shutil.copytree(Path(sparktune.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert code_fingerprint(copy) == code_fingerprint()
    (copy / "NOTES.txt").write_text("docs do not train models")
    assert code_fingerprint(copy) == code_fingerprint()
    (copy / "release/gate.py").write_text((copy / "release/gate.py").read_text() + "\n# changed\n")
    assert code_fingerprint(copy) != code_fingerprint()


def test_the_same_source_files_skip_before_spark_and_an_unlisted_source_goes_on():
    tags = {**CHAMPION_TAGS, "source_signature": "sig1"}
    same = retrain_decision(
        champion_version="4", champion_tags=tags, source_signature="sig1", config_hash="cfg1",
        code_fingerprint="c0de",
    )  # fmt: skip
    assert not same.train and "same source files sig1" in same.reason
    touched = retrain_decision(
        champion_version="4", champion_tags=tags, source_signature="sig2", config_hash="cfg1",
        code_fingerprint="c0de",
    )  # fmt: skip
    assert touched.train and "source_signature sig1 -> sig2" in touched.reason
    table = retrain_decision(
        champion_version="4",
        champion_tags=tags,
        source_signature=None,
        config_hash="cfg1",
        code_fingerprint="c0de",
    )
    assert table.train and "content fingerprint decides" in table.reason


def test_a_source_signature_follows_the_listing_not_the_reading(tmp_path):
    import os

    from sparktune.data.fingerprint import source_signature

    folder = tmp_path / "tickets"
    folder.mkdir()
    (folder / "part-0.parquet").write_bytes(b"a" * 10)
    (folder / "part-1.parquet").write_bytes(b"b" * 10)
    first = source_signature(str(folder))
    assert first and first == source_signature(str(folder)) == source_signature(f"file://{folder}")
    assert source_signature(str(folder / "*.parquet")) is not None
    os.utime(folder / "part-1.parquet", ns=(1, 1))  # rewritten: same bytes, another time
    assert source_signature(str(folder)) != first
    (folder / "part-2.parquet").write_bytes(b"c")  # a new file
    assert source_signature(str(folder / "part-0.parquet")) is not None
    assert source_signature("sales.tickets") is None  # a table: Spark's to read
    assert source_signature(str(tmp_path / "missing")) is None
    (tmp_path / "empty").mkdir()
    assert source_signature(str(tmp_path / "empty")) is None
