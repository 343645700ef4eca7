"""The decision to skip a retraining run that would train the champion again."""

from __future__ import annotations

from sparktune.retrain import retrain_decision

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
    from sparktune.training import code_fingerprint

    copy = tmp_path / "sparktune"
    shutil.copytree(Path(sparktune.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert code_fingerprint(copy) == code_fingerprint()
    (copy / "NOTES.txt").write_text("docs do not train models")
    assert code_fingerprint(copy) == code_fingerprint()
    (copy / "gate.py").write_text((copy / "gate.py").read_text() + "\n# changed\n")
    assert code_fingerprint(copy) != code_fingerprint()
