from __future__ import annotations

import pytest
from sparktune.core.params import parse_params
from sparktune.release.gate import decide, gate_rules

# The per-class rule is off in the tests of other rules: their challengers carry no recalls.
RULES = gate_rules(
    parse_params(
        {"min_accuracy": 0.8, "max_eval_loss": 1.0, "max_regression": 0.02, "max_class_regression": 1.0}
    )
)


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


# --------------------------------------------------------------------------------------------
# Uncertainty: interval lower bounds and the paired comparison with the champion


def _comparison(
    difference: float, low: float, high: float, *, f1: tuple[float, float, float] = (0.0, 0.0, 0.0)
):
    from sparktune.release.comparison import PairedComparison, PairedDifference

    return PairedComparison(
        n_examples=300,
        confidence=0.95,
        n_resamples=1000,
        seed=0,
        accuracy=PairedDifference(0.85 + difference, 0.85, difference, low, high),
        macro_f1=PairedDifference(0.8 + f1[0], 0.8, *f1),
    )


def _challenger(accuracy: float, low: float, high: float, **more: float) -> dict[str, float]:
    return {
        "eval_accuracy": accuracy,
        "eval_accuracy_ci_low": low,
        "eval_accuracy_ci_high": high,
        "eval_loss": 0.4,
        **more,
    }


def _rules(**params: float):
    return gate_rules(
        parse_params(
            {
                "min_accuracy": 0.7,
                "max_eval_loss": 1.0,
                "max_regression": 0.02,
                "max_class_regression": 1.0,
                **params,
            }
        )
    )


def test_min_accuracy_holds_the_interval_lower_bound_to_the_threshold():
    passed = decide(_rules(), _challenger(0.842, 0.801, 0.879), None, "enabled")
    assert passed.promote
    assert (
        passed.reasons[0]
        == "min_accuracy: pass, eval_accuracy 0.842 [95% CI 0.801, 0.879]: lower bound 0.801 >= 0.700"
    )
    # The point estimate clears 0.70, but on this few rows the data cannot tell it from a 0.68 model.
    failed = decide(_rules(), _challenger(0.75, 0.68, 0.81), None, "enabled")
    assert failed.failed_rules == ["min_accuracy"] and not failed.promote
    assert (
        failed.reasons[0]
        == "min_accuracy: FAIL, eval_accuracy 0.750 [95% CI 0.680, 0.810]: lower bound 0.680 < 0.700"
    )


def test_min_accuracy_without_an_interval_says_it_used_the_point_estimate():
    decision = decide(_rules(), {"eval_accuracy": 0.75, "eval_loss": 0.4}, None, "enabled")
    assert decision.promote
    assert "0.750 >= 0.700 (point estimate: the evaluation has no confidence interval)" in decision.reasons[0]


def test_max_regression_reads_the_paired_intervals_lower_bound():
    champion = {"eval_accuracy": 0.85, "eval_loss": 0.4}
    passed = decide(
        _rules(), _challenger(0.862, 0.82, 0.9), champion, "enabled",
        comparison=_comparison(0.012, -0.008, 0.031), champion_version="3",
    )  # fmt: skip
    assert passed.promote
    assert passed.reasons[2] == (
        "max_regression: pass, accuracy vs champion v3: +0.012 [95% CI -0.008, +0.031], allowed drop 0.020"
    )
    # Ahead on the point estimate, yet the drop it may hide is beyond the allowed 0.02: blocked.
    failed = decide(
        _rules(), _challenger(0.855, 0.82, 0.89), champion, "enabled",
        comparison=_comparison(0.005, -0.031, 0.04), champion_version="3",
    )  # fmt: skip
    assert failed.failed_rules == ["max_regression"]
    assert failed.reasons[2] == (
        "max_regression: FAIL, accuracy vs champion v3: +0.005 [95% CI -0.031, +0.040], allowed drop 0.020: "
        "the drop may be as large as 0.031"
    )
    # A lower bound exactly at minus the allowed drop passes.
    edge = decide(
        _rules(), _challenger(0.85, 0.81, 0.89), champion, "enabled", comparison=_comparison(0.0, -0.02, 0.02)
    )
    assert edge.promote and "vs champion: +0.000" in edge.reasons[2]


def test_macro_f1_difference_is_shown_as_information_and_decides_nothing():
    decision = decide(
        _rules(), _challenger(0.86, 0.82, 0.9), {"eval_accuracy": 0.85}, "enabled",
        comparison=_comparison(0.01, -0.005, 0.025, f1=(-0.05, -0.09, -0.01)), champion_version="7",
    )  # fmt: skip
    assert decision.promote and decision.failed_rules == []
    assert decision.reasons[-1] == (
        "macro_f1 (information, no rule): macro_f1 vs champion v7: -0.050 [95% CI -0.090, -0.010]"
    )


def test_without_a_champion_the_comparison_is_ignored_and_the_first_model_is_gated_on_its_interval():
    decision = decide(
        _rules(), _challenger(0.72, 0.66, 0.78), None, "enabled", comparison=_comparison(0.1, 0.05, 0.15)
    )
    assert decision.failed_rules == ["min_accuracy"]
    assert decision.reasons[2] == "max_regression: pass, no champion to compare against"
    assert not any(r.startswith("macro_f1") for r in decision.reasons)


def test_a_real_paired_comparison_blocks_a_challenger_whose_point_estimate_passes():
    from sparktune.release.comparison import paired_comparison
    from sparktune.release.evaluation import EvalResult

    # 300 rows; the models disagree on 40: the challenger is right on 20 of them, the champion on
    # 20 others. Equal accuracy, but 40 coin flips leave room for a drop well beyond 0.02.
    n = 300
    truth = [i % 2 for i in range(n)]
    challenger = [1 - t if 20 <= i < 40 else t for i, t in enumerate(truth)]
    champion = [1 - t if i < 20 else t for i, t in enumerate(truth)]

    def result(predicted: list[int]) -> EvalResult:
        accuracy = sum(t == p for t, p in zip(truth, predicted, strict=True)) / n
        return EvalResult(
            eval_loss=0.3, perplexity=1.35, eval_accuracy=accuracy, eval_macro_f1=accuracy, per_class_f1={},
            n_examples=n, confusion={}, seconds=0.1, labels=["a", "b"], classes=["a", "b"], y_true=truth,
            y_pred=predicted,
        )  # fmt: skip

    comparison = paired_comparison(result(challenger), result(champion))
    challenger_metrics = {"eval_accuracy": comparison.accuracy.challenger, "eval_loss": 0.3}
    champion_metrics = {"eval_accuracy": comparison.accuracy.champion}
    point = decide(_rules(), challenger_metrics, champion_metrics, "enabled")
    assert point.promote  # the old gate: 0.933 vs 0.933 is no regression
    paired = decide(_rules(), challenger_metrics, champion_metrics, "enabled", comparison=comparison)
    assert paired.failed_rules == ["max_regression"]
    assert comparison.accuracy.difference == 0.0 and comparison.accuracy.ci_low < -0.02


def _recalls(**recall: float) -> dict[str, float]:
    return {f"eval_recall_{label}": value for label, value in recall.items()}


def test_max_class_regression_is_on_by_default_and_one_turns_it_off():
    assert "max_class_regression" in [r.name for r in gate_rules(parse_params({}))]
    assert parse_params({}).max_class_regression == 0.25
    assert "max_class_regression" not in [r.name for r in _rules()]
    names = [r.name for r in _rules(max_class_regression=0.1)]
    assert names[names.index("max_regression") + 1] == "max_class_regression"
    with pytest.raises(ValueError, match="max_class_regression"):
        parse_params({"max_class_regression": 1.5})


def test_max_class_regression_names_the_classes_that_lost_most():
    champion = {"eval_accuracy": 0.9, **_recalls(billing=0.95, login=0.9, refund=0.91, shipping=0.8)}
    challenger = _challenger(0.9, 0.86, 0.94, **_recalls(billing=0.9, login=0.78, refund=0.78, shipping=0.85))
    decision = decide(_rules(max_class_regression=0.1), challenger, champion, "enabled", champion_version="3")
    assert decision.failed_rules == ["max_class_regression"]
    assert decision.reasons[3] == (
        "max_class_regression: FAIL, recall fell by more than 0.100 vs champion v3 for 2 of 4 classes; "
        "fell most: refund 0.910 -> 0.780 (-0.130), login 0.900 -> 0.780 (-0.120), "
        "billing 0.950 -> 0.900 (-0.050)"
    )
    within = decide(_rules(max_class_regression=0.15), challenger, champion, "enabled", champion_version="3")
    assert within.promote
    assert within.reasons[3].startswith(
        "max_class_regression: pass, recall vs champion v3 fell most for refund"
    )
    # A drop of exactly the threshold passes (recalls are ratios of counts: no rounding error fails it).
    exact = decide(
        _rules(max_class_regression=0.1), _challenger(0.9, 0.86, 0.94, **_recalls(a=0.7)), _recalls(a=0.8),
        "enabled",
    )  # fmt: skip
    assert exact.promote


def test_max_class_regression_without_a_champion_or_without_recalls():
    rules = _rules(max_class_regression=0.1)
    first = decide(rules, _challenger(0.9, 0.86, 0.94, **_recalls(a=0.5)), None, "enabled")
    assert first.promote and first.reasons[3] == "max_class_regression: pass, no champion to compare against"
    # Without recalls the rule cannot hold the challenger to the champion's: it fails, not passes.
    champion = {"eval_accuracy": 0.9, **_recalls(a=0.5)}
    missing = decide(rules, _challenger(0.9, 0.86, 0.94), champion, "enabled")
    assert missing.failed_rules == ["max_class_regression"]
    assert "no per-class recall (eval_recall_*) metrics" in missing.reasons[3]
    better = decide(rules, _challenger(0.9, 0.86, 0.94, **_recalls(a=0.9)), _recalls(a=0.8), "enabled")
    assert (
        better.reasons[3]
        == "max_class_regression: pass, no class's recall fell vs champion, allowed drop 0.100"
    )


def test_a_blocked_gate_gives_the_failed_reasons_and_a_last_line_naming_the_version():
    from sparktune.release.gate import blocked_promotion_lines

    blocked = decide(_rules(), _challenger(0.75, 0.68, 0.81), None, "enabled")
    summary = {**blocked.to_summary(), "model_name": "support-intent", "challenger_version": "4"}
    lines = blocked_promotion_lines(summary)
    assert lines[-1] == "gate blocked promotion of support-intent v4: min_accuracy"
    assert lines[:-1] == [f"gate: {blocked.reasons[0]}"]
    # Nothing to say when promotion went ahead: passed, dry_run (even with failed rules), disabled.
    for mode in ("dry_run", "disabled"):
        decision = decide(_rules(), _challenger(0.75, 0.68, 0.81), None, mode)
        assert (
            blocked_promotion_lines({**decision.to_summary(), "model_name": "m", "challenger_version": "1"})
            == []
        )
    passed = decide(_rules(), _challenger(0.9, 0.85, 0.95), None, "enabled")
    assert blocked_promotion_lines(passed.to_summary()) == []


# --------------------------------------------------------------------------------------------
# The baseline: the challenger against TF-IDF + logistic regression on the same rows


def _baseline(
    accuracy: float = 0.928,
    ci: tuple[float, float] | None = (0.896, 0.957),
    diff: float = -0.21,
    diff_ci: tuple[float, float] | None = (-0.26, -0.16),
) -> dict[str, float]:
    """What EvaluateModelOperator returns under "baseline" (sparktune.release.baseline.baseline_metrics)."""
    out = {
        "baseline_accuracy": accuracy,
        "baseline_macro_f1": accuracy - 0.01,
        "vs_baseline_accuracy_diff": diff,
    }
    if ci:
        out |= {"baseline_accuracy_ci_low": ci[0], "baseline_accuracy_ci_high": ci[1]}
    if diff_ci:
        out |= {"vs_baseline_accuracy_ci_low": diff_ci[0], "vs_baseline_accuracy_ci_high": diff_ci[1]}
    return out


def _reason(decision, rule: str) -> str:
    [reason] = [r for r in decision.reasons if r.startswith(f"{rule}: ")]
    return reason


def test_min_margin_over_baseline_is_on_by_default_and_off_at_minus_one():
    assert parse_params({}).min_margin_over_baseline == -0.05
    assert "min_margin_over_baseline" in [r.name for r in gate_rules(parse_params({}))]
    off = gate_rules(parse_params({"min_margin_over_baseline": -1}))
    assert "min_margin_over_baseline" not in [r.name for r in off]
    # Off, a challenger the baseline beats by 21 points is not held back by it.
    decision = decide(off, _challenger(0.72, 0.7, 0.75), None, "enabled", baseline=_baseline())
    assert decision.promote and not any("baseline" in r for r in decision.reasons)


def test_min_margin_over_baseline_reads_the_paired_intervals_lower_bound():
    failed = decide(_rules(), _challenger(0.718, 0.7, 0.75), None, "enabled", baseline=_baseline())
    assert failed.failed_rules == ["min_margin_over_baseline"] and not failed.promote
    assert _reason(failed, "min_margin_over_baseline") == (
        "min_margin_over_baseline: FAIL, accuracy vs baseline (TF-IDF + logistic regression, 0.928 "
        "[95% CI 0.896, 0.957]): -0.210 [95% CI -0.260, -0.160]: lower bound -0.260 < -0.050"
    )
    # Trailing the baseline by 2 points, within the allowed 5 even at the interval's lower bound.
    close = _baseline(diff=-0.02, diff_ci=(-0.045, 0.004))
    passed = decide(_rules(), _challenger(0.9, 0.87, 0.93), None, "enabled", baseline=close)
    assert passed.promote
    assert _reason(passed, "min_margin_over_baseline").endswith(
        "): -0.020 [95% CI -0.045, +0.004]: lower bound -0.045 >= -0.050"
    )
    # A positive margin: the challenger must be shown to beat the baseline.
    ahead = decide(
        _rules(min_margin_over_baseline=0.01), _challenger(0.9, 0.87, 0.93), None, "enabled", baseline=close
    )
    assert ahead.failed_rules == ["min_margin_over_baseline"]
    assert "lower bound -0.045 < +0.010" in _reason(ahead, "min_margin_over_baseline")


def test_min_margin_over_baseline_without_baseline_numbers_passes_and_says_why():
    decision = decide(_rules(), _challenger(0.9, 0.87, 0.93), None, "enabled")
    assert decision.promote
    assert _reason(decision, "min_margin_over_baseline") == (
        "min_margin_over_baseline: pass, the evaluation has no baseline numbers "
        "(vs_baseline_accuracy_diff): nothing to compare the challenger with"
    )
    # No interval (evaluated with bootstrap_resamples=0): the point estimate decides, and says so.
    point = decide(
        _rules(), _challenger(0.9, 0.87, 0.93), None, "enabled",
        baseline=_baseline(ci=None, diff=-0.06, diff_ci=None),
    )  # fmt: skip
    assert point.failed_rules == ["min_margin_over_baseline"]
    assert _reason(point, "min_margin_over_baseline") == (
        "min_margin_over_baseline: FAIL, accuracy vs baseline (TF-IDF + logistic regression, 0.928): "
        "-0.060 < -0.050 (point estimate: the evaluation has no confidence interval)"
    )


# --------------------------------------------------------------------------------------------
# Label sets: a challenger trained on other labels than the champion


def _change(added=("refund_request",), removed=("billing",), n_rows=300, n_shared_rows=200):
    from sparktune.release.comparison import LabelChange

    return LabelChange(list(added), list(removed), n_rows, n_shared_rows)


def test_a_changed_label_set_fails_unless_allowed_and_names_the_labels():
    champion = {"eval_accuracy": 0.85}
    decision = decide(
        _rules(), _challenger(0.9, 0.86, 0.94), champion, "enabled",
        comparison=_comparison(0.01, -0.01, 0.03), champion_version="3", label_change=_change(),
    )  # fmt: skip
    assert decision.failed_rules == ["label_set_unchanged"] and not decision.promote
    assert _reason(decision, "label_set_unchanged") == (
        "label_set_unchanged: FAIL, the challenger's labels differ from champion v3's: added "
        "['refund_request'], removed ['billing']; set allow_label_change=true to promote a new label "
        "set under this model name"
    )
    allowed = decide(
        _rules(allow_label_change=True), _challenger(0.9, 0.86, 0.94), champion, "enabled",
        comparison=_comparison(0.01, -0.01, 0.03), champion_version="3", label_change=_change(),
    )  # fmt: skip
    assert allowed.promote and allowed.failed_rules == []
    assert _reason(allowed, "label_set_unchanged") == (
        "label_set_unchanged: pass, the challenger's labels differ from champion v3's: added "
        "['refund_request'], removed ['billing']; the change was allowed (allow_label_change=true); the "
        "champion rules compare the two on the 200 of 300 test rows whose label both know"
    )
    # dry_run records the failure and promotes.
    dry = decide(
        _rules(), _challenger(0.9, 0.86, 0.94), champion, "dry_run", label_change=_change(removed=())
    )
    assert dry.promote and dry.failed_rules == ["label_set_unchanged"]
    assert "added ['refund_request']; set allow_label_change" in _reason(dry, "label_set_unchanged")


def test_the_label_rule_passes_an_unchanged_set_no_champion_and_missing_evidence():
    same = decide(
        _rules(), _challenger(0.9, 0.86, 0.94), {"eval_accuracy": 0.85}, "enabled",
        champion_version="3", label_change=_change(added=(), removed=(), n_shared_rows=300),
    )  # fmt: skip
    assert same.promote
    assert (
        _reason(same, "label_set_unchanged")
        == "label_set_unchanged: pass, the challenger's labels are champion v3's"
    )
    assert "shared-label" not in _reason(same, "max_regression")
    first = decide(_rules(), _challenger(0.9, 0.86, 0.94), None, "enabled", label_change=_change())
    assert first.promote
    assert (
        _reason(first, "label_set_unchanged") == "label_set_unchanged: pass, no champion to compare against"
    )
    unknown = decide(_rules(), _challenger(0.9, 0.86, 0.94), {"eval_accuracy": 0.85}, "enabled")
    assert unknown.promote
    assert _reason(unknown, "label_set_unchanged") == (
        "label_set_unchanged: pass, the evaluation did not report the two models' label sets"
    )


def test_after_a_label_change_the_champion_rules_say_they_compare_shared_label_rows():
    champion = {"eval_accuracy": 0.6, **_recalls(billing=0.9, login=0.9, refund_request=0.0)}
    challenger = _challenger(0.9, 0.86, 0.94, **_recalls(login=0.85, refund_request=0.8, shipping=0.9))
    decision = decide(
        _rules(max_class_regression=0.1, allow_label_change=True), challenger, champion, "enabled",
        comparison=_comparison(-0.005, -0.015, 0.006), champion_version="3",
        label_change=_change(added=("refund_request", "shipping")),
    )  # fmt: skip
    assert decision.promote
    assert _reason(decision, "max_regression") == (
        "max_regression: pass, accuracy vs champion v3 on 200 shared-label rows: -0.005 "
        "[95% CI -0.015, +0.006], allowed drop 0.020"
    )
    # Only login is a label both know: refund_request's recall (0 for a champion that never learned
    # it) and billing's (a label the challenger dropped) are not compared.
    assert _reason(decision, "max_class_regression") == (
        "max_class_regression: pass, recall vs champion v3 on 200 shared-label rows fell most for "
        "login 0.900 -> 0.850 (-0.050); allowed drop 0.100"
    )
    assert decision.reasons[-1].startswith("macro_f1 (information, no rule): macro_f1 vs champion v3 on 200 ")


def test_after_a_label_change_without_shared_rows_the_champions_numbers_are_not_compared():
    # The champion's accuracy over every row includes rows of labels it never learned: no reference.
    # The split's labels are the challenger's: the champion's recall of the new one is 0, not a drop.
    champion = {"eval_accuracy": 0.95, **_recalls(refund_request=0.0)}
    challenger = _challenger(0.9, 0.86, 0.94, **_recalls(refund_request=0.9))
    decision = decide(
        _rules(allow_label_change=True, max_class_regression=0.1), challenger, champion, "enabled",
        champion_version="3", label_change=_change(removed=(), n_shared_rows=0),
    )  # fmt: skip
    assert decision.promote
    assert _reason(decision, "max_regression") == (
        "max_regression: pass, nothing to compare: no paired comparison on the rows whose label both "
        "the challenger and champion v3 know (0 of 300 test rows)"
    )
    assert _reason(decision, "max_class_regression") == (
        "max_class_regression: pass, no label both models know has a recall to compare"
    )


def test_every_default_threshold_blocks_what_a_user_would_not_serve():
    """The defaults, not test-chosen thresholds: each rule's default turns down its own kind of bad model."""
    rules = gate_rules(parse_params({}))
    good = _challenger(0.95, 0.92, 0.97, eval_loss=0.05, **_recalls(a=0.95, b=0.95))
    champion = {"eval_accuracy": 0.95, **_recalls(a=0.95, b=0.95)}
    assert decide(rules, good, champion, "enabled", comparison=_comparison(0.0, -0.01, 0.01)).promote

    # An untrained model's label loss (8.75, perplexity 6,300) passed the old default of 10.
    unsure = {**good, "eval_loss": 8.75}
    assert "max_eval_loss" in decide(rules, unsure, None, "enabled").failed_rules
    # A wrong answer on 4 texts in 10, however lucky the split.
    assert "min_accuracy" in decide(rules, _challenger(0.62, 0.55, 0.69), None, "enabled").failed_rules
    # Worse than the champion: a drop the paired interval cannot rule out.
    worse = decide(rules, good, champion, "enabled", comparison=_comparison(-0.04, -0.06, -0.02))
    assert "max_regression" in worse.failed_rules
    # A better average that lost a class.
    lost = {**good, **_recalls(a=1.0, b=0.6)}
    assert "max_class_regression" in decide(rules, lost, champion, "enabled").failed_rules
