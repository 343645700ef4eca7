"""``EvaluateModelOperator``: challenger, champion, the TF-IDF baseline and the base model before
fine-tuning scored on the same test rows, and the paired comparisons the promotion gate decides on."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException
from sparktune_airflow.core.domain_cli import raise_for_exit_code, run_module
from sparktune_airflow.core.mlflow import UsesMLflowConnection
from sparktune_airflow.core.task_context import task_scratch_dir, templated_bool


class EvaluateModelOperator(UsesMLflowConnection, BaseOperator):
    """Challenger and current champion on the same frozen test split; metrics to the challenger's run.

    Returns both models' flat metrics and versions, and the paired comparison of the two on the same
    rows (differences of accuracy and macro F1 with their bootstrap intervals); the champion's
    metrics and the comparison are None when there is no champion. ``label_change`` says which
    labels the challenger added and removed against the champion (each model's label set from its
    evaluation, else its version's ``labels`` tag; None without a champion); when they differ, the
    comparison covers only the rows whose label both know (None when there is no such row), while
    the champion's own metrics stay those of every row. ``baseline`` holds the TF-IDF +
    logistic regression baseline's metrics and the paired differences to it. ``base_model`` says
    what fine-tuning added (:mod:`sparktune.release.base_model_eval`, information for people, no gate
    rule): the base model's status (scored, not_applicable, not_scored, skipped), the base model, the
    reason it has no numbers, or its ``base_model_*`` and paired ``vs_base_model_*`` metrics.

    :param model_name: (templated) the registered model name; its ``champion`` alias is the baseline.
    :param version: (templated) the challenger's version.
    :param dataset_uri: (templated) the ``DatasetDict`` whose ``test`` split both are scored on.
    :param run_id: (templated) the MLflow run that receives the metrics (the champion's prefixed
        ``champion_``, the paired differences ``vs_champion_``), the result JSONs and confusion
        matrices under ``evaluation/``.
    :param trust_remote_code: (templated) load models that ship their own code (default False: such
        a model is refused).
    :param evaluate_base_model: (templated) also score the base model the challenger was fine-tuned
        from (default True).
    :param base_model: (templated) the folder or hub id the challenger was fine-tuned from; None: the
        one its training run records (tag ``sparktune.base_model``).
    """

    template_fields: Sequence[str] = (
        "model_name",
        "version",
        "dataset_uri",
        "run_id",
        "trust_remote_code",
        "evaluate_base_model",
        "base_model",
    )

    def __init__(
        self,
        *,
        model_name: str,
        version: str,
        dataset_uri: str,
        run_id: str,
        trust_remote_code: bool = False,
        evaluate_base_model: bool = True,
        base_model: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.model_name = model_name
        self.version = version
        self.dataset_uri = dataset_uri
        self.run_id = run_id
        self.trust_remote_code = trust_remote_code
        self.evaluate_base_model = evaluate_base_model
        self.base_model = base_model

    @staticmethod
    def _files(work: Path, label: str) -> list[Path]:
        """Where a model's evaluation files go, in the order the run's ``evaluation/`` folder lists
        them: the result JSON (per-example outcomes included), the per-row predictions CSV
        (``example_id, label, prediction, score``: what the served model answers) and the confusion
        matrix PNG."""
        if label == "challenger":
            return [work / "eval_challenger.json", work / "predictions.csv", work / "confusion_matrix.png"]
        return [
            work / f"eval_{label}.json",
            work / f"{label}_predictions.csv",
            work / f"{label}_confusion_matrix.png",
        ]

    def execute(self, context: Any) -> dict[str, Any]:
        from sparktune.release import base_model_eval
        from sparktune.release.registry import CHAMPION, alias_version

        client = self.mlflow_hook.get_conn()
        work = task_scratch_dir(context)
        trust = templated_bool(self.trust_remote_code)
        evaluate_base_model = templated_bool(self.evaluate_base_model)
        champion_version = alias_version(client, self.model_name, CHAMPION)
        against_champion = champion_version is not None and champion_version != str(self.version)
        challenger_uri = f"models:/{self.model_name}/{self.version}"
        files = self._files(work, "challenger")
        command = [
            *("--model-uri", challenger_uri, "--dataset-path", self.dataset_uri, "--split", "test"),
            *("--output", str(files[0]), "--predictions", str(files[1]), "--confusion-matrix", str(files[2])),
            *("--trust-remote-code", "true" if trust else "false"),
        ]
        # The cheap model it must beat, on the same rows, in the same process (sparktune.release.baseline).
        baseline_file = work / "eval_baseline.json"
        command += ["--baseline-output", str(baseline_file)]
        # What fine-tuning added: the base model, scored as the challenger is, after it in the same process.
        base_files: list[Path] = []
        trained_from = self._trained_from(client) if evaluate_base_model else None
        base_outcome = _base_model_request(evaluate_base_model, trained_from, self.run_id)
        if base_outcome is None:
            base_files = self._files(work, "base_model")
            command += [
                *("--base-model", str(trained_from)),
                *("--base-model-output", str(base_files[0])),
                *("--base-model-predictions", str(base_files[1])),
                *("--base-model-confusion-matrix", str(base_files[2])),
            ]
        champion_files: list[Path] = []
        if against_champion:
            # Both models in one process, on the same rows: the imports are paid once.
            champion_files = self._files(work, "champion")
            command += [
                *("--champion-model-uri", f"models:/{self.model_name}/{champion_version}"),
                *("--champion-output", str(champion_files[0])),
                *("--champion-predictions", str(champion_files[1])),
                *("--champion-confusion-matrix", str(champion_files[2])),
            ]
        result = run_module("sparktune.jobs.evaluate", *command, env=self.mlflow_hook.process_env())
        # Exit 2 (a refused model, an unusable dataset) fails at once: a retry would refuse it again.
        what = challenger_uri + (f" and champion v{champion_version}" if against_champion else "")
        raise_for_exit_code(f"evaluating {what}", result.exit_code, result.output)
        challenger = json.loads(files[0].read_text())["metrics"]
        champion = comparison = change = None
        if against_champion:
            champion = json.loads(champion_files[0].read_text())["metrics"]
            comparison, change = _versus_champion(
                client, self.model_name, (str(self.version), champion_version), files[0], champion_files[0]
            )
            if change.changed:
                self.log.warning(
                    "label set changed vs champion v%s: added %s, removed %s; compared on the %d of %d "
                    "test rows whose label both know",
                    champion_version,
                    change.added,
                    change.removed,
                    change.n_shared_rows,
                    change.n_rows,
                )
            files += champion_files
        baseline = _baseline_metrics(files[0], baseline_file)
        files.append(baseline_file)
        if base_outcome is None:
            base_outcome = _base_model_outcome(files[0], base_files[0], str(trained_from))
            # Not scored: the JSON says why, and there are no predictions or matrix to log.
            files += base_files if base_outcome.status == base_model_eval.SCORED else base_files[:1]
        for name, value in challenger.items():
            client.log_metric(self.run_id, name, value)
            self.log.info("challenger v%s %-22s %.4f", self.version, name, value)
        for name, value in baseline.items():
            client.log_metric(self.run_id, name, value)
            self.log.info("baseline (TF-IDF + logistic regression) %-28s %+.4f", name, value)
        for name, value in base_outcome.metrics.items():
            client.log_metric(self.run_id, name, value)
            self.log.info("base model (before fine-tuning) %-30s %+.4f", name, value)
        for key, value in base_outcome.tags().items():
            client.set_tag(self.run_id, key, value)
        self.log.info("%s", base_model_eval.describe(base_outcome))
        for name, value in (champion or {}).items():
            client.log_metric(self.run_id, f"champion_{name}", value)
            self.log.info("champion   v%s %-22s %.4f", champion_version, name, value)
        for name, value in (comparison.metrics() if comparison else {}).items():
            client.log_metric(self.run_id, name, value)
            self.log.info("paired vs champion v%s %-30s %+.4f", champion_version, name, value)
        for name in ("eval_loss", "eval_accuracy", "eval_macro_f1"):
            if name in challenger:
                client.set_model_version_tag(
                    self.model_name, str(self.version), name, f"{challenger[name]:.6f}"
                )
        for path in files:
            if path.is_file():
                client.log_artifact(self.run_id, str(path), "evaluation")
            else:  # the CLI logged why; the metrics still decide the gate
                self.log.warning("evaluation left no %s to log", path.name)
        # XCom: the flat metrics and intervals only; per-example outcomes stay in the logged JSON.
        return {
            "model_name": self.model_name,
            "challenger_version": str(self.version),
            "champion_version": champion_version,
            "challenger": challenger,
            "champion": champion,
            "comparison": comparison.to_summary() if comparison else None,
            "label_change": change.to_summary() if change else None,
            "baseline": baseline,
            "base_model": base_outcome.to_summary(),
        }

    def _trained_from(self, client: Any) -> str | None:
        """The base model the challenger was fine-tuned from: ``base_model``, else its training run's tag."""
        from sparktune.release.base_model_eval import TRAINED_FROM_TAG

        if self.base_model:
            return str(self.base_model)
        return client.get_run(self.run_id).data.tags.get(TRAINED_FROM_TAG) or None


def _paired(challenger_json: Path, other_json: Path) -> Any:
    """The paired comparison of two result files the evaluation CLI wrote on one split."""
    from sparktune.release.comparison import ComparisonInputError, compare_result_files

    try:
        return compare_result_files(challenger_json, other_json)
    except ComparisonInputError as exc:  # both were scored on one split: a bug, not a fault
        raise AirflowFailException(str(exc)) from exc


def _versus_champion(
    client: Any, model_name: str, versions: tuple[str, str], challenger_json: Path, champion_json: Path
) -> tuple[Any, Any]:
    """(the paired comparison or None, the label change) of challenger and champion, ``versions``
    in that order. Models trained on different label sets are compared on the rows whose label both
    know; with no such row there is nothing to pair (None), and the gate says so."""
    from sparktune.release.comparison import ComparisonInputError, label_change, paired_comparison

    challenger, champion = (
        _with_model_labels(client, model_name, version, path)
        for version, path in zip(versions, (challenger_json, champion_json), strict=True)
    )
    try:
        change = label_change(challenger, champion)
        return (paired_comparison(challenger, champion) if change.n_shared_rows else None), change
    except ComparisonInputError as exc:  # both were scored on one split: a bug, not a fault
        raise AirflowFailException(str(exc)) from exc


def _with_model_labels(client: Any, model_name: str, version: str, result_json: Path) -> Any:
    """A result file the evaluation CLI wrote, with the model's label set: as the evaluation
    recorded it, else the version's ``labels`` tag (registration sets it from the prepared data)."""
    from sparktune.release.metrics import EvalResult

    result = EvalResult.from_dict(json.loads(result_json.read_text()))
    if result.model_labels:
        return result
    tag = client.get_model_version(model_name, version).tags.get("labels")
    try:
        labels = json.loads(tag) if tag else None
    except ValueError:  # a hand-edited tag: the split's labels stand in, as before label sets were compared
        labels = None
    return replace(result, model_labels=[str(v) for v in labels]) if isinstance(labels, list) else result


def _baseline_metrics(challenger_json: Path, baseline_json: Path) -> dict[str, float]:
    """The baseline's metrics and the paired (challenger - baseline) differences on the same rows."""
    from sparktune.release.baseline import baseline_metrics
    from sparktune.release.metrics import EvalResult

    baseline = EvalResult.from_dict(json.loads(baseline_json.read_text()))
    return baseline_metrics(baseline, _paired(challenger_json, baseline_json))


def _base_model_request(wanted: bool, trained_from: str | None, run_id: str) -> Any:
    """None when the evaluate job is to score the base model ``trained_from``; else the outcome
    that says why it is not."""
    from sparktune.release.base_model_eval import NOT_SCORED, SKIPPED, TRAINED_FROM_TAG, BaseModelOutcome

    if not wanted:
        return BaseModelOutcome(SKIPPED, reason="evaluate_base_model=false")
    if not trained_from:
        return BaseModelOutcome(
            NOT_SCORED,
            reason=f"the training run {run_id} records no base model (tag {TRAINED_FROM_TAG}); pass "
            "base_model to EvaluateModelOperator",
        )
    return None


def _base_model_outcome(challenger_json: Path, base_json: Path, base_model: str) -> Any:
    """What the evaluate job wrote for the base model: scored (its metrics and the paired
    differences to the challenger on the same rows), or why not."""
    from sparktune.release import base_model_eval

    written = base_model_eval.read_output(base_json)
    if isinstance(written, base_model_eval.BaseModelOutcome):
        return written
    return base_model_eval.scored(base_model, written, _paired(challenger_json, base_json))
