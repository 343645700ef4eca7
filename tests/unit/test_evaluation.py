"""Evaluation of logged models (runs:/, models:/ and a local folder) on the tiny intent dataset."""

from __future__ import annotations

import json
import math

import pytest

try:
    from tests.unit import tiny_model
except ImportError:  # tests/ is not a package: pytest put this folder on sys.path
    import tiny_model

pytestmark = pytest.mark.usefixtures("torch_single_thread")


@pytest.fixture(scope="module")
def full_run(root):
    return tiny_model.trained(root, "full")


@pytest.fixture(scope="module")
def test_result(root, full_run):
    from sparktune.release.evaluation import evaluate_model

    return evaluate_model(
        full_run.model_uri, str(root / "data"), tracking_uri=tiny_model.tracking_uri(root), batch_size=16
    )


def test_trained_model_beats_chance(test_result):
    # 4 balanced labels: chance is 0.25; the full fine-tune measured 0.94 here.
    assert test_result.n_examples == 48
    assert test_result.eval_accuracy >= 0.6
    assert test_result.eval_macro_f1 >= 0.5
    assert set(test_result.per_class_f1) == set(tiny_model.LABELS)
    assert all(0.0 <= v <= 1.0 for v in test_result.per_class_f1.values())
    assert test_result.perplexity == pytest.approx(math.exp(test_result.eval_loss))
    assert sum(sum(row.values()) for row in test_result.confusion.values()) == 48
    correct = sum(test_result.confusion[label].get(label, 0) for label in tiny_model.LABELS)
    assert correct / 48 == pytest.approx(test_result.eval_accuracy)
    assert test_result.seconds > 0


def test_metric_names(test_result):
    metrics = test_result.metrics()
    assert {"eval_loss", "eval_perplexity", "eval_accuracy", "eval_macro_f1"} <= set(metrics)
    assert {f"eval_f1_{label}" for label in tiny_model.LABELS} <= set(metrics)
    assert all(isinstance(v, float) for v in metrics.values())
    assert json.loads(test_result.to_json())["eval_accuracy"] == test_result.eval_accuracy


def test_eval_loss_is_the_completion_loss_training_reported(root, full_run):
    from sparktune.release.evaluation import evaluate_model

    # Every completion is two tokens (label, eos), so the trainer's per-batch means average to the
    # same per-token mean this computes over the validation split.
    result = evaluate_model(
        full_run.model_uri, str(root / "data"), split="validation", tracking_uri=tiny_model.tracking_uri(root)
    )
    assert result.eval_loss == pytest.approx(full_run.val_loss, abs=1e-3)


def _forward_calls(model):
    """A list that gets one item per call of ``model`` (not of its layers), and its hook's handle."""
    calls = []
    return calls, model.register_forward_pre_hook(lambda module, args: calls.append(1))


def test_a_causal_lm_is_evaluated_in_one_pass_with_the_two_pass_loss(root, full_run):
    """The true label's loss is read from the candidates' scores: evaluating runs the model as
    often as predicting alone, and gives the loss the separate completion_loss pass gave (the
    path kept for a model whose logged scoring predates it)."""
    import dataclasses

    from sparktune.release.eval_inputs import load_split
    from sparktune.release.evaluation import evaluate_model, load_for_evaluation

    data = str(root / "data")
    scorer = load_for_evaluation(
        full_run.model_uri, data, tracking_uri=tiny_model.tracking_uri(root), batch_size=16
    )
    texts = [str(t) for t in load_split(data, "test", None)["text"]]
    calls, hook = _forward_calls(scorer.model)
    try:
        scorer.predict(texts)
        predicting = len(calls)
        calls.clear()
        one_pass = evaluate_model(
            full_run.model_uri, data, scorer=scorer, batch_size=16, bootstrap_resamples=0
        )
        evaluating = len(calls)
        calls.clear()
        two_pass = evaluate_model(
            full_run.model_uri,
            data,
            scorer=dataclasses.replace(scorer, predict_with_loss=None),
            batch_size=16,
            bootstrap_resamples=0,
        )
    finally:
        hook.remove()
    assert evaluating == predicting
    assert len(calls) == predicting + 3  # the loss's own pass: 48 rows in batches of 16
    assert one_pass.y_pred == two_pass.y_pred and one_pass.scores == two_pass.scores
    assert one_pass.example_tokens == two_pass.example_tokens
    assert one_pass.example_loss == pytest.approx(two_pass.example_loss, abs=1e-5)
    assert one_pass.eval_loss == pytest.approx(two_pass.eval_loss, abs=1e-5)


def test_rows_the_candidates_do_not_score_get_their_own_completion_loss(root, full_run, monkeypatch):
    """A row whose prompt is not the one the model builds, or whose completion is no candidate's
    (a label the model lacks, another template), is not what the candidate scoring scored: its
    loss is completion_loss of its own strings, computed for those rows alone."""
    import sparktune.core.label_scoring as scoring
    import torch
    from sparktune.release.eval_inputs import load_split, wrap_label_model
    from sparktune.release.evaluation import load_for_evaluation

    data = str(root / "data")
    loaded = load_for_evaluation(full_run.model_uri, data, tracking_uri=tiny_model.tracking_uri(root))
    spec = scoring.LabelSpec(scoring.CAUSAL_LM, loaded.spec.labels, loaded.spec.prompt_template)
    scorer = wrap_label_model(loaded.model, loaded.tokenizer, spec, 4)
    rows = load_split(data, "test", 10)
    texts = [str(t) for t in rows["text"]]
    targets = list(zip(rows["prompt"], rows["completion"], strict=True))
    targets[1] = (targets[1][0].replace("[INST] ", "[INST]"), targets[1][1])
    targets[4] = (targets[4][0], " cancel")
    targets[7] = (targets[7][0], targets[7][1] + "\n")
    apart = []
    original = scoring.completion_loss

    def counting(model, tokenizer, prompts, completions, batch_size):
        apart.append(list(zip(prompts, completions, strict=True)))
        return original(model, tokenizer, prompts, completions, batch_size)

    monkeypatch.setattr(scoring, "completion_loss", counting)
    predictions, scores, losses, tokens = scorer.predict_with_loss(texts, targets)
    assert apart == [[targets[1], targets[4], targets[7]]]
    assert (predictions, scores) == scorer.predict(texts)
    with torch.inference_mode():
        expected, counts = original(
            loaded.model, loaded.tokenizer, *map(list, zip(*targets, strict=True)), 10
        )
    assert tokens == counts
    assert losses == pytest.approx(expected, abs=1e-5)


def test_registered_model_uri_gives_the_same_deterministic_result(root, full_run, test_result):
    import mlflow
    from sparktune.model.process_setup import using_tracking_uri
    from sparktune.release.evaluation import evaluate_model

    uri = tiny_model.tracking_uri(root)
    with using_tracking_uri(uri):
        version = mlflow.register_model(full_run.model_uri, "tiny-intent-eval").version
    result = evaluate_model(
        f"models:/tiny-intent-eval/{version}", str(root / "data"), tracking_uri=uri, batch_size=7
    )
    # Another batch size, another padding: the same predictions and (to float noise) the same loss.
    assert result.confusion == test_result.confusion
    assert result.eval_accuracy == test_result.eval_accuracy
    assert result.eval_loss == pytest.approx(test_result.eval_loss, abs=1e-5)


def test_streaming_mode_evaluates_the_prepared_parquet_alike(root, full_run, test_result, tmp_path):
    from sparktune.release.evaluation import evaluate_model

    # dataset_mode=streaming hands evaluation the prepared Parquet (string labels), not a dataset.
    prepared = tiny_model.build_prepared_parquet(tmp_path / "prepared")
    result = evaluate_model(full_run.model_uri, str(prepared), tracking_uri=tiny_model.tracking_uri(root))
    assert result.n_examples == test_result.n_examples == 48
    assert result.confusion == test_result.confusion
    assert result.eval_accuracy == test_result.eval_accuracy


def test_untrained_local_folder_scores_lower(root, test_result):
    from sparktune.release.evaluation import evaluate_model

    result = evaluate_model(str(root / "model"), str(root / "data"), max_examples=8)
    assert result.n_examples == 8
    # A random model spreads its probability over the whole vocabulary.
    assert result.eval_loss > 3.0 > test_result.eval_loss
    assert result.eval_accuracy <= 0.5


def test_cli_writes_the_result(root, full_run, tmp_path, capsys):
    from sparktune.jobs.evaluate import main

    output = tmp_path / "eval" / "result.json"
    code = main(
        [
            "--model-uri",
            full_run.model_uri,
            "--dataset-path",
            str(root / "data"),
            "--split",
            "validation",
            "--max-examples",
            "8",
            "--tracking-uri",
            tiny_model.tracking_uri(root),
            "--output",
            str(output),
        ]
    )
    assert code == 0
    written = json.loads(output.read_text())
    assert written["n_examples"] == 8 and written["split"] == "validation"
    assert "sparktune-evaluate" in capsys.readouterr().out


def test_bad_inputs_are_reported(root, tmp_path):
    from sparktune.jobs.evaluate import main
    from sparktune.release.eval_inputs import EvaluationInputError
    from sparktune.release.evaluation import evaluate_model

    with pytest.raises(EvaluationInputError, match="no split 'holdout'"):
        evaluate_model(str(root / "model"), str(root / "data"), split="holdout")
    with pytest.raises(EvaluationInputError, match="neither an MLflow model"):
        evaluate_model(str(tmp_path), str(root / "data"))
    code = main(["--model-uri", str(tmp_path), "--dataset-path", str(root / "data"), "--output", "x.json"])
    assert code == 2


def test_metric_names_are_safe_for_mlflow():
    from sparktune.release.evaluation import EvalResult

    result = EvalResult(
        eval_loss=0.5,
        perplexity=math.exp(0.5),
        eval_accuracy=1.0,
        eval_macro_f1=1.0,
        per_class_f1={"card/lost & stolen": 1.0},
        n_examples=1,
        confusion={},
        seconds=0.1,
        per_class_recall={"card/lost & stolen": 0.5},
    )
    assert "eval_f1_card/lost _ stolen" in result.metrics()
    assert result.metrics()["eval_recall_card/lost _ stolen"] == 0.5


# --------------------------------------------------------------------------------------------
# Confidence intervals and the confusion matrix image

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_all_correct_gives_a_degenerate_interval_at_one():
    from sparktune.release.metrics import (
        accuracy_statistic,
        bootstrap_ci,
        classification_cis,
        macro_f1_statistic,
    )

    labels = [0, 1, 2, 3] * 25
    assert bootstrap_ci(accuracy_statistic(labels, labels), 100) == (1.0, 1.0)
    assert bootstrap_ci(macro_f1_statistic(labels, labels, 4), 100) == (1.0, 1.0)
    cis = classification_cis(labels, labels, 4, [0.5] * 100, [2] * 100)
    assert cis == {"eval_accuracy": (1.0, 1.0), "eval_macro_f1": (1.0, 1.0), "eval_loss": (0.25, 0.25)}


def test_a_fair_coin_gives_the_binomial_interval():
    import numpy as np
    from sparktune.release.metrics import accuracy_statistic, bootstrap_ci

    n = 4000
    correct = np.random.default_rng(7).random(n) < 0.5
    truth = np.ones(n, dtype=int)
    low, high = bootstrap_ci(accuracy_statistic(truth, correct.astype(int)), n)
    point = correct.mean()
    half_width = 1.96 * math.sqrt(point * (1 - point) / n)  # normal approximation: about 0.0155
    assert low < point < high
    assert (high - low) / 2 == pytest.approx(half_width, rel=0.15)
    assert (low + high) / 2 == pytest.approx(point, abs=0.005)
    # A fixed seed: the same interval again; another seed: (slightly) another one.
    assert bootstrap_ci(accuracy_statistic(truth, correct.astype(int)), n) == (low, high)
    assert bootstrap_ci(accuracy_statistic(truth, correct.astype(int)), n, seed=1) != (low, high)


def test_resampled_macro_f1_is_sklearns_with_invalid_predictions():
    import numpy as np
    from sklearn.metrics import f1_score
    from sparktune.release.metrics import macro_f1_statistic

    rng = np.random.default_rng(3)
    truth = rng.integers(0, 5, 200)
    # 5 labels; index 5 is a class outside the labels (an "<invalid>" generation).
    predicted = np.where(rng.random(200) < 0.6, truth, rng.integers(0, 6, 200))
    idx = np.vstack([np.arange(200), rng.integers(0, 200, (3, 200))])
    expected = [
        f1_score(truth[i], predicted[i], labels=range(5), average="macro", zero_division=0) for i in idx
    ]
    assert macro_f1_statistic(truth, predicted, 5)(idx) == pytest.approx(expected)


def test_the_loss_interval_resamples_examples_for_the_per_token_mean():
    import numpy as np
    from sparktune.release.metrics import bootstrap_cis, ratio_statistic

    # Two examples: 1 token of loss 1.0, 3 tokens of total loss 9.0; resamples of both, one or the other.
    statistic = ratio_statistic([1.0, 9.0], [1, 3])
    assert statistic(np.array([[0, 1], [0, 0], [1, 1]])) == pytest.approx([2.5, 1.0, 3.0])
    assert bootstrap_cis({"loss": statistic}, 2)["loss"] == pytest.approx((1.0, 3.0))
    assert bootstrap_cis({"nothing": ratio_statistic([0.0], [0])}, 1) == {}  # undefined: no interval
    with pytest.raises(ValueError, match="at least one example"):
        bootstrap_cis({"loss": statistic}, 0)


def test_bootstrap_costs_well_under_a_second_for_thousands_of_examples():
    import time

    import numpy as np
    from sparktune.release.metrics import classification_cis

    rng = np.random.default_rng(0)
    n = 5000
    truth = rng.integers(0, 8, n)
    predicted = np.where(rng.random(n) < 0.8, truth, rng.integers(0, 9, n))
    started = time.perf_counter()
    cis = classification_cis(truth, predicted, 8, rng.random(n), rng.integers(1, 4, n))
    # ~0.1 s measured on the shared 2-core machine; generous against load.
    assert time.perf_counter() - started < 2.0
    assert set(cis) == {"eval_accuracy", "eval_macro_f1", "eval_loss"}


def test_intervals_bracket_the_point_estimates(test_result):
    assert test_result.ci_resamples == 1000 and test_result.ci_level == 0.95
    assert set(test_result.ci) == {"eval_accuracy", "eval_macro_f1", "eval_loss"}
    for name, (low, high) in test_result.ci.items():
        assert low <= getattr(test_result, name) <= high, name
        assert low < high, name  # 48 examples, not all correct at loss 0: some spread
    metrics = test_result.metrics()
    assert metrics["eval_accuracy_ci_low"] == test_result.ci["eval_accuracy"][0]
    assert metrics["eval_macro_f1_ci_high"] == test_result.ci["eval_macro_f1"][1]
    assert {"eval_loss_ci_low", "eval_loss_ci_high"} <= set(metrics)
    # 48 examples: the interval is wide (binomial half-width ~0.07 at 0.94), not a rounding error.
    assert test_result.ci["eval_accuracy"][1] - test_result.ci["eval_accuracy"][0] > 0.03


def test_per_example_outcomes_reproduce_the_metrics(test_result):
    from sparktune.release.evaluation import EvalResult

    n = test_result.n_examples
    assert len(test_result.y_true) == len(test_result.y_pred) == len(test_result.example_loss) == n
    assert test_result.classes[: len(test_result.labels)] == test_result.labels
    correct = sum(t == p for t, p in zip(test_result.y_true, test_result.y_pred, strict=True))
    assert correct / n == test_result.eval_accuracy
    assert sum(test_result.example_loss) / sum(test_result.example_tokens) == pytest.approx(
        test_result.eval_loss
    )
    assert all(tokens == 2 for tokens in test_result.example_tokens)  # label and eos
    for i, label in enumerate(test_result.labels):
        rows = [p for t, p in zip(test_result.y_true, test_result.y_pred, strict=True) if t == i]
        expected = rows.count(i) / len(rows) if rows else 0.0
        assert test_result.per_class_recall[label] == pytest.approx(expected), label
    # The JSON round-trips, per-example lists included.
    assert EvalResult.from_dict(json.loads(test_result.to_json())) == test_result


def test_confusion_matrix_png(test_result, tmp_path):
    from sparktune.release.evaluation import confusion_matrix_figure

    path = confusion_matrix_figure(test_result, tmp_path / "figures" / "confusion.png")
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 10_000
    assert [p.name for p in path.parent.iterdir()] == ["confusion.png"]  # no partial file left


def test_confusion_columns_end_with_invalid(tmp_path):
    from sparktune.release.evaluation import EvalResult, confusion_columns, confusion_matrix_figure

    result = EvalResult(
        eval_loss=1.0,
        perplexity=math.e,
        eval_accuracy=0.5,
        eval_macro_f1=0.4,
        per_class_f1={"a": 0.5, "b": 0.3},
        n_examples=6,
        confusion={"a": {"a": 2, "<invalid>": 1}, "b": {"c": 1, "b": 1, "a": 1}},
        seconds=0.1,
        labels=["a", "b"],
    )
    assert confusion_columns(result) == ["a", "b", "c", "<invalid>"]
    data = confusion_matrix_figure(result, tmp_path / "small.png", title="t").read_bytes()
    assert data[:8] == PNG_MAGIC


def test_cli_writes_the_confusion_matrix_beside_the_result(root, full_run, tmp_path):
    from sparktune.jobs.evaluate import main

    output = tmp_path / "eval_challenger.json"
    args = ["--model-uri", full_run.model_uri, "--dataset-path", str(root / "data"), "--max-examples", "8"]
    args += ["--tracking-uri", tiny_model.tracking_uri(root), "--output", str(output)]
    assert main([*args, "--bootstrap-resamples", "200"]) == 0
    assert (tmp_path / "eval_challenger_confusion.png").read_bytes()[:8] == PNG_MAGIC
    written = json.loads(output.read_text())
    assert written["ci_resamples"] == 200
    assert {"eval_accuracy_ci_low", "eval_accuracy_ci_high"} <= set(written["metrics"])

    chosen = tmp_path / "elsewhere" / "matrix.png"
    assert main([*args, "--confusion-matrix", str(chosen), "--bootstrap-resamples", "0"]) == 0
    assert chosen.read_bytes()[:8] == PNG_MAGIC
    written = json.loads(output.read_text())
    assert written["ci"] == {} and "eval_accuracy_ci_low" not in written["metrics"]


def test_cli_evaluates_the_champion_in_the_same_process_on_the_same_rows(root, full_run, tmp_path):
    from sparktune.jobs.evaluate import main
    from sparktune.release.comparison import compare_result_files

    args = ["--model-uri", full_run.model_uri, "--dataset-path", str(root / "data"), "--max-examples", "8"]
    args += ["--tracking-uri", tiny_model.tracking_uri(root), "--output", str(tmp_path / "challenger.json")]
    args += ["--bootstrap-resamples", "0", "--champion-model-uri", full_run.model_uri]
    args += ["--champion-output", str(tmp_path / "champion.json")]
    args += ["--champion-predictions", str(tmp_path / "champion.csv")]
    assert main(args) == 0
    challenger, champion = (
        json.loads((tmp_path / f"{m}.json").read_text()) for m in ("challenger", "champion")
    )
    assert champion["metrics"] == challenger["metrics"]  # the same model on the same rows
    assert (tmp_path / "champion.csv").read_text() == (tmp_path / "challenger_predictions.csv").read_text()
    assert (tmp_path / "champion_confusion.png").read_bytes()[:8] == PNG_MAGIC
    assert compare_result_files(tmp_path / "challenger.json", tmp_path / "champion.json").to_summary()
    with pytest.raises(SystemExit):  # where its result goes is not optional
        main([*args[: args.index("--champion-output")]])


def test_cli_scores_the_baseline_from_the_train_split_on_the_same_rows(root, full_run, tmp_path, capsys):
    from sparktune.jobs.evaluate import main
    from sparktune.release.baseline import BASELINE_URI
    from sparktune.release.comparison import compare_result_files

    args = ["--model-uri", full_run.model_uri, "--dataset-path", str(root / "data"), "--max-examples", "16"]
    args += ["--tracking-uri", tiny_model.tracking_uri(root), "--output", str(tmp_path / "challenger.json")]
    args += ["--bootstrap-resamples", "100", "--baseline-output", str(tmp_path / "baseline.json")]
    assert main([*args, "--baseline-max-train-rows", "40"]) == 0
    baseline = json.loads((tmp_path / "baseline.json").read_text())
    challenger = json.loads((tmp_path / "challenger.json").read_text())
    assert baseline["model_uri"] == BASELINE_URI and baseline["n_examples"] == 16
    assert baseline["example_ids"] == challenger["example_ids"] and baseline["labels"] == challenger["labels"]
    assert "eval_accuracy" in baseline["ci"] and "eval_loss" not in baseline["ci"]
    paired = compare_result_files(tmp_path / "challenger.json", tmp_path / "baseline.json")
    assert paired.accuracy.champion == baseline["eval_accuracy"]
    printed = capsys.readouterr().out
    assert "baseline (TF-IDF + logistic regression on 40 train rows) split=test n=16" in printed


# --------------------------------------------------------------------------------------------
# A champion trained on other labels (a label added or removed since): scored, not refused


def _classifier(folder, labels: list[str]) -> str:
    """A randomly initialised 2-layer LLaMA classifier whose head knows ``labels``, saved as a folder."""
    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification

    tokenizer = tiny_model.build_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, num_labels=len(labels),
        id2label=dict(enumerate(labels)), label2id={label: i for i, label in enumerate(labels)},
    )  # fmt: skip
    LlamaForSequenceClassification(config).save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return str(folder)


def test_the_result_records_the_labels_the_model_was_trained_on(test_result):
    assert set(test_result.model_labels) == set(tiny_model.LABELS)


def test_a_classifier_of_other_labels_is_refused_unless_allowed_as_the_champion(root, tmp_path):
    from sparktune.release.eval_inputs import EvaluationInputError
    from sparktune.release.evaluation import evaluate_model

    other = _classifier(tmp_path / "other", ["cancel", "upgrade"])
    with pytest.raises(EvaluationInputError, match="trained on other labels"):
        evaluate_model(other, str(root / "data"), max_examples=8)
    result = evaluate_model(other, str(root / "data"), max_examples=8, allow_other_labels=True)
    assert result.model_labels == ["cancel", "upgrade"] and result.labels == list(tiny_model.LABELS)
    assert result.eval_accuracy == 0.0 and math.isnan(result.eval_loss) and "eval_loss" not in result.ci


def test_a_classifier_is_evaluated_in_one_pass_with_the_two_pass_loss(root, tmp_path):
    """A classifier's loss is its head's log-probability of the true label, which predicting
    computed: no second pass, the same loss as classifier_loss's, no loss on a label it lacks."""
    import torch
    from sparktune.release.eval_inputs import load_split
    from sparktune.release.evaluation import classifier_loss, evaluate_model, load_for_evaluation

    data = str(root / "data")
    folder = _classifier(tmp_path / "classifier", ["billing", "cancel", "login", "shipping"])
    scorer = load_for_evaluation(folder, data, batch_size=8)
    rows = load_split(data, "test", None)
    texts = [str(t) for t in rows["text"]]
    calls, hook = _forward_calls(scorer.model)
    try:
        scorer.predict(texts)
        predicting = len(calls)
        calls.clear()
        result = evaluate_model(folder, data, scorer=scorer, batch_size=8, bootstrap_resamples=0)
    finally:
        hook.remove()
    assert len(calls) == predicting
    with torch.inference_mode():
        truth = [tiny_model.LABELS[i] for i in rows["label"]]
        losses, counts = classifier_loss(scorer.model, scorer.tokenizer, texts, truth, 8)
    assert result.example_tokens == counts and 0 < sum(counts) < len(counts)  # refund: unknown
    assert result.example_loss == pytest.approx(losses, abs=1e-5)


def test_cli_scores_a_champion_of_another_label_set_and_pairs_the_shared_label_rows(root, full_run, tmp_path):
    from sparktune.jobs.evaluate import main
    from sparktune.release.comparison import compare_result_files, label_change
    from sparktune.release.evaluation import EvalResult

    # The champion knew billing and login, and "account", since dropped; shipping and refund are new.
    champion = _classifier(tmp_path / "champion", ["account", "billing", "login"])
    args = ["--model-uri", full_run.model_uri, "--dataset-path", str(root / "data"), "--max-examples", "16"]
    args += ["--tracking-uri", tiny_model.tracking_uri(root), "--output", str(tmp_path / "challenger.json")]
    args += ["--bootstrap-resamples", "0", "--champion-model-uri", champion]
    args += ["--champion-output", str(tmp_path / "champion.json")]
    assert main(args) == 0
    results = [
        EvalResult.from_dict(json.loads((tmp_path / f"{m}.json").read_text()))
        for m in ("challenger", "champion")
    ]
    change = label_change(*results)
    assert (change.added, change.removed) == (["refund", "shipping"], ["account"])
    assert (
        change.n_rows == 16 and change.n_shared_rows == 8
    )  # the labels take turns: half are billing or login
    assert compare_result_files(tmp_path / "challenger.json", tmp_path / "champion.json").n_examples == 8


# --------------------------------------------------------------------------------------------
# What fine-tuning added: the base model scored as the challenger is, on the same rows


def _base_model_args(root, full_run, tmp_path, base_model: str) -> list[str]:
    args = ["--model-uri", full_run.model_uri, "--dataset-path", str(root / "data")]
    args += ["--tracking-uri", tiny_model.tracking_uri(root), "--output", str(tmp_path / "challenger.json")]
    args += ["--base-model", base_model, "--base-model-output", str(tmp_path / "base_model.json")]
    return args


def test_cli_scores_the_base_model_on_the_same_rows_and_the_trained_model_beats_it(
    root, full_run, tmp_path, capsys
):
    from sparktune.jobs.evaluate import main
    from sparktune.release import base_model_eval
    from sparktune.release.comparison import compare_result_files
    from sparktune.release.evaluation import EvalResult

    # The full fine-tune started from root/model: a randomly initialised LLaMA, chance at best.
    base = str(root / "model")
    assert main(_base_model_args(root, full_run, tmp_path, base)) == 0
    challenger = EvalResult.from_dict(json.loads((tmp_path / "challenger.json").read_text()))
    written = base_model_eval.read_output(tmp_path / "base_model.json")
    assert isinstance(written, EvalResult)
    assert written.model_uri == base and written.n_examples == challenger.n_examples == 48
    assert written.example_ids == challenger.example_ids and written.labels == challenger.labels
    # The same constrained scoring over the challenger's labels: every answer is one of them.
    assert written.n_invalid == 0 and set(written.model_labels) == set(tiny_model.LABELS)
    assert written.eval_loss > 3.0 > challenger.eval_loss  # untrained: spread over the vocabulary
    assert (tmp_path / "base_model_predictions.csv").read_text().count("\n") == 49
    assert (tmp_path / "base_model_confusion.png").read_bytes()[:8] == PNG_MAGIC

    # Paired exactly as the baseline is: challenger minus base model, same resamples of the rows.
    paired = compare_result_files(tmp_path / "challenger.json", tmp_path / "base_model.json")
    outcome = base_model_eval.scored(base, written, paired)
    metrics = outcome.metrics
    assert metrics["base_model_accuracy"] == written.eval_accuracy <= 0.5
    assert (
        metrics["base_model_accuracy_ci_low"]
        <= written.eval_accuracy
        <= metrics["base_model_accuracy_ci_high"]
    )
    assert {
        "base_model_macro_f1",
        "base_model_macro_f1_ci_low",
        "base_model_loss",
        "base_model_loss_ci_high",
    } <= set(metrics)
    diff = metrics["vs_base_model_accuracy_diff"]
    assert diff == pytest.approx(challenger.eval_accuracy - written.eval_accuracy)
    # The trained model beats its untrained base, and 48 rows leave no doubt about the sign.
    assert (
        0 < metrics["vs_base_model_accuracy_ci_low"] <= diff <= metrics["vs_base_model_accuracy_ci_high"] <= 1
    )
    assert metrics["vs_base_model_macro_f1_ci_low"] > 0
    assert f"sparktune-evaluate base model (before fine-tuning) model={base} split=test n=48" in (
        capsys.readouterr().out
    )


def test_the_base_model_takes_the_challengers_prompt_template_and_tokenizer(root):
    from sparktune.core.label_scoring import CAUSAL_LM, LabelSpec
    from sparktune.release.eval_inputs import load_base_label_model

    # Not the pipeline's default: the base model must be prompted as the challenger was trained.
    spec = LabelSpec(CAUSAL_LM, tiny_model.LABELS, "Ticket: {text}\nIntent: {label}")
    tokenizer = tiny_model.build_tokenizer()
    scorer = load_base_label_model(str(root / "model"), spec, tokenizer, batch_size=4)
    assert scorer.spec == spec and scorer.tokenizer is tokenizer
    predictions, scores = scorer.predict(["my invoice was charged twice", "where is my parcel"])
    assert set(predictions) <= set(tiny_model.LABELS) and all(0 < s <= 1 for s in scores)


def test_a_classifiers_base_model_is_not_applicable_and_not_loaded(root, tmp_path, capsys):
    from sparktune.jobs.evaluate import main
    from sparktune.release import base_model_eval

    challenger = _classifier(tmp_path / "classifier", list(tiny_model.LABELS))
    args = ["--model-uri", challenger, "--dataset-path", str(root / "data"), "--max-examples", "8"]
    args += ["--output", str(tmp_path / "challenger.json"), "--bootstrap-resamples", "0"]
    # A folder that does not exist: loading it would report "not scored", not "not applicable".
    args += ["--base-model", str(tmp_path / "absent"), "--base-model-output", str(tmp_path / "base.json")]
    assert main(args) == 0
    outcome = base_model_eval.read_output(tmp_path / "base.json")
    assert isinstance(outcome, base_model_eval.BaseModelOutcome)
    assert outcome.status == base_model_eval.NOT_APPLICABLE and outcome.metrics == {}
    assert (
        "task=sequence_classification" in outcome.reason
        and "no trained classification head" in outcome.reason
    )
    assert not (tmp_path / "base_predictions.csv").exists()
    assert "Base model before fine-tuning" in capsys.readouterr().out and "not applicable" in (
        base_model_eval.describe(outcome)
    )


def test_a_base_model_that_cannot_be_loaded_is_reported_and_the_challenger_stands(root, full_run, tmp_path):
    from sparktune.jobs.evaluate import main
    from sparktune.release import base_model_eval

    args = _base_model_args(root, full_run, tmp_path, str(tmp_path / "gone"))
    assert main([*args, "--max-examples", "8", "--bootstrap-resamples", "0"]) == 0
    assert json.loads((tmp_path / "challenger.json").read_text())["n_examples"] == 8
    outcome = base_model_eval.read_output(tmp_path / "base_model.json")
    assert outcome.status == base_model_eval.NOT_SCORED
    assert "does not exist" in outcome.reason and "evaluate_base_model=false" in outcome.reason
    with pytest.raises(SystemExit):  # where its result goes is not optional
        main(args[: args.index("--base-model-output")])
