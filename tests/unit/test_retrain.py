"""The decision to skip a retraining run that would train the champion again."""

from __future__ import annotations

from sparktune.retrain import retrain_decision

CHAMPION_TAGS = {"data_fingerprint": "fp1", "config_hash": "cfg1", "code_version": "0.1.0+gabc"}


def decide(**changes):
    values = {"data_fingerprint": "fp1", "config_hash": "cfg1", "code_version": "0.1.0+gabc", **changes}
    return retrain_decision(champion_version="4", champion_tags=CHAMPION_TAGS, **values)


def test_same_data_config_and_code_skips_and_says_why():
    decision = decide()
    assert not decision.train
    assert (
        "champion v4" in decision.reason and "fp1" in decision.reason and "force_retrain" in decision.reason
    )


def test_any_change_trains_and_names_it():
    for field, value in (("data_fingerprint", "fp2"), ("config_hash", "cfg2"), ("code_version", "0.2.0")):
        decision = decide(**{field: value})
        assert decision.train, field
        assert f"{field} {CHAMPION_TAGS[field]} -> {value}" in decision.reason


def test_no_champion_or_untagged_champion_or_force_trains():
    assert retrain_decision(
        champion_version=None, champion_tags={}, data_fingerprint="a", config_hash="b", code_version="c"
    ).train
    untagged = retrain_decision(
        champion_version="1", champion_tags={}, data_fingerprint="a", config_hash="b", code_version="c"
    )
    assert untagged.train and "(not recorded)" in untagged.reason
    assert decide(force=True).train
