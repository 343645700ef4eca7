from __future__ import annotations

import pytest
from sparktune.gate import decide, gate_rules
from sparktune.params import parse_params

RULES = gate_rules(parse_params({"min_accuracy": 0.8, "max_eval_loss": 1.0, "max_regression": 0.02}))


def test_good_challenger_without_champion_passes():
    decision = decide(RULES, {"eval_accuracy": 0.9, "eval_loss": 0.5}, None, "enabled")
    assert decision.passed and decision.promote
    assert any("no champion" in reason for reason in decision.reasons)


def test_every_failed_rule_is_a_reason():
    decision = decide(RULES, {"eval_accuracy": 0.7, "eval_loss": 2.0}, {"eval_accuracy": 0.95}, "enabled")
    assert not decision.promote
    assert decision.failed_rules == ["min_accuracy", "max_eval_loss", "max_regression"]
    assert sum("FAIL" in r for r in decision.reasons) == 3


def test_regression_against_champion_blocks():
    decision = decide(RULES, {"eval_accuracy": 0.90, "eval_loss": 0.4}, {"eval_accuracy": 0.93}, "enabled")
    assert decision.failed_rules == ["max_regression"]
    within = decide(RULES, {"eval_accuracy": 0.92, "eval_loss": 0.4}, {"eval_accuracy": 0.93}, "enabled")
    assert within.promote


def test_missing_metric_fails_the_rule():
    decision = decide(RULES, {"eval_loss": 0.4}, None, "enabled")
    assert "min_accuracy" in decision.failed_rules


def test_dry_run_records_but_promotes_and_disabled_skips_rules():
    dry = decide(RULES, {"eval_accuracy": 0.1, "eval_loss": 9.0}, None, "dry_run")
    assert not dry.passed and dry.promote and dry.failed_rules
    off = decide(RULES, {"eval_accuracy": 0.1, "eval_loss": 9.0}, None, "disabled")
    assert off.promote and not off.failed_rules


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="not one of"):
        decide(RULES, {}, None, "maybe")
