"""The evaluate job: scores a model (and the champion, the TF-IDF baseline and the base model before
fine-tuning) on one split and writes each result JSON, predictions CSV and confusion matrix; what
``EvaluateModelOperator`` runs.

    python -m sparktune.jobs.evaluate --model-uri models:/NAME/3 --dataset-path DATASET --output r.json

Exit codes as for every sparktune job: 0 done, 2 bad input (a retry cannot help), 1 anything else.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from sparktune.core.model_safety import UnsafeModelError
from sparktune.model.process_setup import configure_process_logging
from sparktune.release.eval_inputs import EvaluationInputError, LabelScorer, label_strings, load_split
from sparktune.release.evaluation import (
    BASELINE_MAX_TRAIN_ROWS,
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    confusion_matrix_figure,
    evaluate_model,
    load_for_evaluation,
    write_predictions_csv,
)
from sparktune.release.metrics import EvalResult

logger = logging.getLogger("sparktune.jobs.evaluate")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sparktune.jobs.evaluate",
        description="Evaluate a fine-tuned model on a dataset split.",
    )
    parser.add_argument(
        "--model-uri", required=True, help="models:/name/3, models:/name@alias, runs:/id/model or a folder."
    )
    parser.add_argument(
        "--dataset-path", required=True, help="DatasetDict folder written by the materialize step."
    )
    parser.add_argument("--split", default="test")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-examples", type=int, default=None)
    parser.add_argument(
        "--tracking-uri", default=None, help="MLflow tracking URI (default: MLFLOW_TRACKING_URI)."
    )
    parser.add_argument("--output", required=True, help="Where to write the result JSON.")
    parser.add_argument(
        "--predictions",
        default=None,
        help="Where to write the per-example predictions CSV (default: <output stem>_predictions.csv).",
    )
    parser.add_argument(
        "--prompt-template",
        default=None,
        help="The template of a bare Hugging Face folder's prompts (an MLflow model carries its own).",
    )
    parser.add_argument(
        "--confusion-matrix",
        default=None,
        help="Where to write the confusion matrix PNG (default: <output stem>_confusion.png beside it).",
    )
    parser.add_argument(
        "--bootstrap-resamples",
        type=int,
        default=BOOTSTRAP_RESAMPLES,
        help="Resamples of the test examples for the 95%% confidence intervals (0: none).",
    )
    parser.add_argument("--bootstrap-seed", type=int, default=BOOTSTRAP_SEED)
    parser.add_argument(
        "--trust-remote-code",
        choices=("true", "false"),
        default="false",
        help="Let a model that ships its own Python code (auto_map) load; default false: refused.",
    )
    parser.add_argument(
        "--champion-model-uri",
        default=None,
        help="Also evaluate this model on the same split, in this process (the model it must beat); its "
        "files go to the --champion-* paths.",
    )
    parser.add_argument("--champion-output", default=None, help="The champion's result JSON.")
    parser.add_argument("--champion-predictions", default=None, help="The champion's predictions CSV.")
    parser.add_argument(
        "--champion-confusion-matrix", default=None, help="The champion's confusion matrix PNG."
    )
    parser.add_argument(
        "--baseline-output",
        default=None,
        help="Also score the TF-IDF + logistic regression baseline (sparktune.release.baseline), trained on "
        "the dataset's train split, on the same rows; its result JSON.",
    )
    parser.add_argument(
        "--baseline-max-train-rows",
        type=int,
        default=BASELINE_MAX_TRAIN_ROWS,
        help="The baseline trains on a seeded sample of at most this many train rows.",
    )
    parser.add_argument(
        "--base-model",
        default=None,
        help="Also score this base model (the folder or hub id the model was fine-tuned from) with the "
        "model's own labels, prompt template and tokenizer, on the same rows; its files go to the "
        "--base-model-* paths. A sequence classifier's base (no trained head) is reported as not applicable.",
    )
    parser.add_argument(
        "--base-model-output",
        default=None,
        help="The base model's result JSON, or why it was not scored (sparktune.release.base_model_eval).",
    )
    parser.add_argument("--base-model-predictions", default=None, help="The base model's predictions CSV.")
    parser.add_argument(
        "--base-model-confusion-matrix", default=None, help="The base model's confusion matrix PNG."
    )
    args = parser.parse_args(argv)
    if args.champion_model_uri and not args.champion_output:
        parser.error("--champion-model-uri needs --champion-output")
    if args.base_model and not args.base_model_output:
        parser.error("--base-model needs --base-model-output")
    challenger: LabelScorer | None = None
    if args.base_model:
        # Loaded here rather than inside evaluate_model: the base model is scored with the
        # challenger's label spec (its logged labels and prompt template) and its tokenizer.
        code, challenger = _load(args, args.model_uri)
        if code:
            return code
    # One process for every model: torch, transformers and MLflow are imported once (about 7 s).
    code = _evaluate_and_write(
        args, args.model_uri, args.output, args.predictions, args.confusion_matrix, scorer=challenger
    )
    # Only the challenger's label spec and tokenizer are kept: its weights go before the next model loads.
    kept = (challenger.spec, challenger.tokenizer) if challenger is not None else None
    challenger = None
    if code == 0 and args.champion_model_uri:
        code = _evaluate_and_write(
            args,
            args.champion_model_uri,
            args.champion_output,
            args.champion_predictions,
            args.champion_confusion_matrix,
            # A champion trained before a label-set change is still scored; the gate names the change.
            allow_other_labels=True,
        )
    if code == 0 and args.baseline_output:
        code = _baseline_and_write(args)
    if code == 0 and kept is not None:
        code = _base_model_and_write(args, *kept)
    return code


def _load(args: argparse.Namespace, model_uri: str) -> tuple[int, LabelScorer | None]:
    """(the CLI's exit code, the model loaded as evaluate_model loads it)."""
    try:
        return 0, load_for_evaluation(
            model_uri,
            args.dataset_path,
            split=args.split,
            max_examples=args.max_examples,
            tracking_uri=args.tracking_uri,
            trust_remote_code=args.trust_remote_code == "true",
            prompt_template=args.prompt_template,
            batch_size=args.batch_size,
        )
    except (EvaluationInputError, UnsafeModelError) as err:
        logger.error("%s", err)
        return 2, None
    except Exception:
        logger.exception("Loading %s failed", model_uri)
        return 1, None


def _base_model_and_write(args: argparse.Namespace, spec: Any, tokenizer: Any) -> int:
    """Score the base model as the challenger (``spec``, ``tokenizer``) is scored and write its files,
    or write why it was not scored; the CLI's exit code.

    The numbers are information (no gate rule reads them): a base model that cannot be loaded or
    scored here is reported as not scored, with the reason, and the challenger's numbers stand.
    """
    from sparktune.release import base_model_eval
    from sparktune.release.eval_inputs import load_base_label_model

    reason = base_model_eval.not_applicable_reason(str(spec.task))
    if reason is not None:
        outcome = base_model_eval.BaseModelOutcome(base_model_eval.NOT_APPLICABLE, args.base_model, reason)
    else:
        try:
            scorer = load_base_label_model(
                args.base_model,
                spec,
                tokenizer,
                trust_remote_code=args.trust_remote_code == "true",
                batch_size=args.batch_size,
            )
            result = _evaluate(args, args.base_model, scorer=scorer)
        except Exception as err:
            logger.warning("The base model %s was not scored.", args.base_model, exc_info=True)
            outcome = base_model_eval.BaseModelOutcome(
                base_model_eval.NOT_SCORED,
                args.base_model,
                f"{type(err).__name__}: {err} ({base_model_eval.SKIP_HINT})",
            )
        else:
            _write(
                args,
                args.base_model,
                result,
                args.base_model_output,
                args.base_model_predictions,
                args.base_model_confusion_matrix,
                role="base model (before fine-tuning) ",
            )
            return 0
    base_model_eval.write_outcome(outcome, args.base_model_output)
    print(f"sparktune-evaluate {base_model_eval.describe(outcome)}", flush=True)
    return 0


def _baseline_and_write(args: argparse.Namespace) -> int:
    """Score the baseline on the CLI's split and write its result JSON; the CLI's exit code."""
    from sparktune.release.baseline import evaluate_baseline

    try:
        test = load_split(args.dataset_path, args.split, args.max_examples, required=("label", "text"))
        train = load_split(args.dataset_path, "train", None, required=("label", "text"))
    except EvaluationInputError as err:
        logger.error("%s", err)
        return 2
    if len(train) > args.baseline_max_train_rows:
        train = train.shuffle(seed=args.bootstrap_seed).select(range(args.baseline_max_train_rows))
    names, truth = label_strings(test)
    result = evaluate_baseline(
        [str(t) for t in train["text"]],
        label_strings(train)[1],
        [str(t) for t in test["text"]],
        truth,
        names,
        example_ids=[str(v) for v in test["example_id"]] if "example_id" in test.column_names else None,
        split=args.split,
        bootstrap_resamples=args.bootstrap_resamples,
        bootstrap_seed=args.bootstrap_seed,
    )
    output = Path(args.baseline_output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(result.to_json())
    print(
        f"sparktune-evaluate baseline (TF-IDF + logistic regression on {len(train)} train rows) "
        f"split={args.split} n={result.n_examples} accuracy={result.eval_accuracy:.4f} "
        f"macro_f1={result.eval_macro_f1:.4f}",
        flush=True,
    )
    return 0


def _evaluate_and_write(
    args: argparse.Namespace,
    model_uri: str,
    output_path: str,
    predictions: str | None,
    figure: str | None,
    *,
    allow_other_labels: bool = False,
    scorer: LabelScorer | None = None,
) -> int:
    """Evaluate one model (``scorer``: already loaded) with the CLI's settings and write its files;
    the CLI's exit code."""
    try:
        result = _evaluate(args, model_uri, allow_other_labels=allow_other_labels, scorer=scorer)
    except (EvaluationInputError, UnsafeModelError) as err:
        logger.error("%s", err)
        return 2
    except Exception:
        logger.exception("Evaluation of %s failed", model_uri)
        return 1
    _write(args, model_uri, result, output_path, predictions, figure)
    return 0


def _evaluate(
    args: argparse.Namespace,
    model_uri: str,
    *,
    allow_other_labels: bool = False,
    scorer: LabelScorer | None = None,
) -> EvalResult:
    return evaluate_model(
        model_uri,
        args.dataset_path,
        split=args.split,
        batch_size=args.batch_size,
        max_examples=args.max_examples,
        tracking_uri=args.tracking_uri,
        bootstrap_resamples=args.bootstrap_resamples,
        bootstrap_seed=args.bootstrap_seed,
        trust_remote_code=args.trust_remote_code == "true",
        prompt_template=args.prompt_template,
        allow_other_labels=allow_other_labels,
        scorer=scorer,
    )


def _write(
    args: argparse.Namespace,
    model_uri: str,
    result: EvalResult,
    output_path: str,
    predictions: str | None,
    figure: str | None,
    *,
    role: str = "",
) -> None:
    """One model's result JSON, predictions CSV and confusion matrix PNG, and its line on stdout
    (``role`` names a model that is not the one asked about, as the operator's log shows it)."""
    output = Path(output_path)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(result.to_json())
    write_predictions_csv(result, predictions or output.with_name(f"{output.stem}_predictions.csv"))
    figure_path = Path(figure or output.with_name(f"{output.stem}_confusion.png"))
    try:
        confusion_matrix_figure(result, figure_path)
    except Exception:
        # The metrics decide the gate; a picture that failed to draw must not hold them back.
        logger.exception("Could not draw the confusion matrix %s", figure_path)
    print(
        f"sparktune-evaluate {role}model={model_uri} split={args.split} n={result.n_examples} "
        f"loss={result.eval_loss:.4f} accuracy={result.eval_accuracy:.4f} "
        f"macro_f1={result.eval_macro_f1:.4f}",
        flush=True,
    )


if __name__ == "__main__":
    configure_process_logging()
    sys.exit(main())
