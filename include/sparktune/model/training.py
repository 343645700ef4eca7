"""Supervised fine-tuning (LoRA, QLoRA or full) of a causal LM on the materialized dataset, logged to MLflow.

Every backend runs this through ``sparktune.jobs.train`` (a local process, TorchDistributor
ranks on Spark executors, a Databricks job) so that torch and the model live and die with one
process. :func:`train` is keyed on ``TrainRequest.train_key`` (:mod:`sparktune.model.train_runs`):

- a FINISHED run with that key and a verified model is returned as is, so a retry after a
  successful training never trains, or registers, a second model;
- otherwise the trainer resumes from the key's last checkpoint (saved every ``checkpoint_steps``
  under ``<output_dir>/checkpoints``) into the MLflow run the crashed attempt left behind, so
  finished steps are not redone and the loss curve continues in one run.

Under torch.distributed (``WORLD_SIZE`` > 1) rank 0 alone talks to MLflow. The inputs are checked
in :mod:`sparktune.model.train_inputs`, the trainer is built in :mod:`sparktune.model.sft_trainer`
(or :mod:`sparktune.model.classification`), and the model is logged and verified in
:mod:`sparktune.model.logged_model`.
"""

from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparktune.core.params import PipelineParams, parse_params
from sparktune.core.prompt_format import effective_prompt_template
from sparktune.core.provenance import code_fingerprint, code_version
from sparktune.model.logged_model import (
    MODEL_ARTIFACT,
    log_adapter_model,
    log_label_model,
    merge_trained,
    to_stored_dtype,
    verify_logged_model,
)
from sparktune.model.process_setup import using_tracking_uri
from sparktune.model.sft_trainer import (
    all_ranks_sum,
    check_packing_isolation,
    count_params,
    make_trainer_classes,
    sft_config,
)
from sparktune.model.train_inputs import (
    check_hardware,
    load_train_dataset,
    load_train_tokenizer,
    training_splits,
)
from sparktune.model.train_request import TrainRequest, TrainResult
from sparktune.model.train_runs import (
    MODEL_URI_TAG,
    RESULT_ARTIFACT,
    RESUMED_FROM_TAG,
    TRAIN_KEY_TAG,
    close_abandoned_runs,
    experiment_id_for,
    find_finished_run,
    finished_result,
    first_logged_loss,
    last_checkpoint,
    load_finished_result,
    unfinished_runs,
    write_result,
)
from sparktune.model.training_setup import load_base_model, lora_config_from_params, without_autocast

if TYPE_CHECKING:
    from sparktune.model.recipes import ResolvedRecipe

# Named explicitly: run as `python -m`, __name__ would be "__main__".
logger = logging.getLogger("sparktune.model.training")

CODE_VERSION_TAG = "sparktune.code_version"
CODE_FINGERPRINT_TAG = "sparktune.code_fingerprint"


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def train(request: TrainRequest) -> TrainResult:
    """Fine-tune ``request.base_model`` on the dataset, log everything and the merged model to MLflow.

    Returns the result of an earlier FINISHED run with the same ``train_key`` (``reused=True``)
    instead of training again; resumes from the key's last checkpoint when there is one.
    """
    params = parse_params(request.params)
    check_hardware(params)
    resolved = resolve_recipe(params, request.base_model)
    params = resolved.params
    output_dir = Path(request.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    with using_tracking_uri(request.mlflow_tracking_uri):
        result = _train_or_reuse(request, params, output_dir, resolved.summary())
    if _rank() == 0:
        write_result(output_dir, result)
    return result


def resolve_recipe(params: PipelineParams, base_model: str) -> ResolvedRecipe:
    """Fill the recipe fields the run left unset from the base model's recipe, and say so."""
    from sparktune.model import recipes

    resolved = recipes.resolve(
        params, recipes.describe_base_model(base_model, trust_remote_code=params.trust_remote_code)
    )
    for line in recipes.format_recipe(resolved.summary()):
        logger.info(line)
    return resolved


def _train_or_reuse(
    request: TrainRequest, params: PipelineParams, output_dir: Path, recipe: dict[str, Any]
) -> TrainResult:
    import mlflow
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=request.mlflow_tracking_uri)
    experiment_id = experiment_id_for(client, request)
    previous = find_finished_run(client, experiment_id, request.train_key)
    if previous is not None:
        logger.info("Reusing finished run %s for train_key %s: nothing trained.", previous, request.train_key)
        return finished_result(previous)

    checkpoint = last_checkpoint(output_dir)
    if _rank() != 0:
        # Every rank trains; only rank 0 owns the MLflow run.
        splits = training_splits(request, params)
        return _train_in_run(None, request, params, splits, output_dir, checkpoint, recipe)

    unfinished = unfinished_runs(client, experiment_id, request.train_key)
    resume_run = unfinished[0] if unfinished and checkpoint is not None else None
    close_abandoned_runs(client, [r for r in unfinished if r is not resume_run], request.train_key)
    train_ds, val_ds, n_train = training_splits(request, params)
    if resume_run is not None:
        logger.info(
            "Resuming run %s of train_key %s from %s (step %d).",
            resume_run.info.run_id,
            request.train_key,
            checkpoint[0].name,
            checkpoint[1],
        )
        run_context = mlflow.start_run(run_id=resume_run.info.run_id)
    else:
        if checkpoint is not None:
            logger.info("No MLflow run left to resume; a new run continues from %s.", checkpoint[0].name)
        tags = {
            **{k: str(v) for k, v in request.tags.items()},
            TRAIN_KEY_TAG: request.train_key,
            CODE_VERSION_TAG: code_version(),
            CODE_FINGERPRINT_TAG: code_fingerprint(),
            "sparktune.base_model": request.base_model,
            "sparktune.peft_method": params.peft_method,
            "sparktune.dataset_path": request.dataset_path,
        }
        run_context = mlflow.start_run(
            experiment_id=experiment_id, run_name=request.run_name or None, tags=tags
        )
    with run_context as run:
        result = _train_in_run(
            run.info.run_id, request, params, (train_ds, val_ds, n_train), output_dir, checkpoint, recipe
        )
        mlflow.log_dict(result.to_dict(), RESULT_ARTIFACT)
        # Set last: find_finished_run only trusts runs that got this far.
        mlflow.set_tag(MODEL_URI_TAG, result.model_uri)
    return result


def _train_in_run(
    run_id: str | None,
    request: TrainRequest,
    params: PipelineParams,
    splits: tuple[Any, Any, int],
    output_dir: Path,
    checkpoint: tuple[Path, int] | None,
    recipe: dict[str, Any],
) -> TrainResult:
    """Train (resuming from ``checkpoint``), then on rank 0 (``run_id`` set) log and verify the model."""
    import mlflow

    main_process = run_id is not None
    classify = params.task == "sequence_classification"
    train_ds, val_ds, n_train = splits
    streaming = params.dataset_mode == "streaming"
    step_logger = make_trainer_classes()[1]()
    trainer, tokenizer, labels = build_trainer(request, params, splits, output_dir, callbacks=[step_logger])
    trainable, total = count_params(trainer.model)
    world_size = trainer.args.world_size
    # What the param precision resolved to on this device (auto: bf16 where it computes bf16 natively).
    precision = "bf16" if trainer.args.bf16 else "float32"
    if main_process:
        # The params the run was sent (the sections training reads), recipe values filled in.
        sent = request.params
        logged = {k: _param_value(v) for k, v in params.to_dict().items() if not sent or k in sent}
        mlflow.log_params(logged)
        mlflow.log_params(
            {
                "base_model_resolved": request.base_model,
                "recipe": recipe["name"],
                # Which of the logged recipe values the run set (the rest came from the recipe).
                "recipe_set_by_user": ",".join(sorted(recipe["set_by_user"])) or "(none)",
                "dataset_path": request.dataset_path,
                "n_train": n_train,
                "n_validation": len(val_ds),
                "train_key": request.train_key,
                "precision_resolved": precision,
            }
        )
        mlflow.log_metrics(
            {
                "trainable_params": trainable,
                "total_params": total,
                "trainable_percent": 100.0 * trainable / total,
                "world_size": world_size,
            }
        )
        if checkpoint is not None:
            mlflow.set_tag(RESUMED_FROM_TAG, str(checkpoint[1]))
            mlflow.log_metric("resumed_from_step", checkpoint[1], step=checkpoint[1])
    logger.info(
        "Training %s (%s, %s, world size %d): %d of %d parameters trainable (%.3f%%), %d train / %d "
        "validation examples%s.",
        request.base_model,
        params.peft_method,
        precision,
        world_size,
        trainable,
        total,
        100.0 * trainable / total,
        n_train,
        len(val_ds),
        f", resuming from {checkpoint[0].name}" if checkpoint else "",
    )

    started = time.perf_counter()
    train_output = trainer.train(resume_from_checkpoint=str(checkpoint[0]) if checkpoint else None)
    train_seconds = time.perf_counter() - started
    global_steps = int(train_output.global_step)

    real_tokens, padded_tokens = all_ranks_sum(trainer.real_tokens, trainer.padded_tokens)
    tokens_per_second = real_tokens / train_seconds if train_seconds > 0 else 0.0
    padding_efficiency = real_tokens / padded_tokens if padded_tokens else 1.0
    # Collective under DDP: every rank evaluates its share of the validation split.
    val_loss = float(trainer.evaluate()["eval_loss"])
    if not main_process:
        return TrainResult(
            mlflow_run_id="",
            model_uri="",
            trainable_params=trainable,
            total_params=total,
            trainable_percent=100.0 * trainable / total,
            train_loss=float("nan"),
            initial_loss=float("nan"),
            tokens_per_second=tokens_per_second,
            padding_efficiency=padding_efficiency,
            train_seconds=train_seconds,
            global_steps=global_steps,
            val_loss=val_loss,
            recipe=recipe,
            precision=precision,
        )

    if not step_logger.losses and checkpoint is None:
        raise RuntimeError("Training logged no loss: the dataset yielded no training steps.")
    # After a resume the curve's start is in the run already, from the attempt that crashed.
    initial_loss = first_logged_loss(run_id) if checkpoint else None
    if initial_loss is None:
        initial_loss = step_logger.losses[0][1]
    final_loss = step_logger.losses[-1][1] if step_logger.losses else initial_loss
    steps_this_attempt = global_steps - (checkpoint[1] if checkpoint else 0)
    mlflow.log_metrics(
        {
            "initial_loss": initial_loss,
            "final_train_loss": final_loss,
            "val_perplexity": math.exp(min(val_loss, 50.0)),
            "tokens_per_second": tokens_per_second,
            "padding_efficiency": padding_efficiency,
            "train_seconds": train_seconds,
            "seconds_per_step": train_seconds / max(steps_this_attempt, 1),
            "global_steps": global_steps,
            "steps_this_attempt": steps_this_attempt,
            "train_tokens": real_tokens,
        }
    )
    logger.info(
        "Trained %d steps (%d in this attempt) in %.1f s (%.3f s/step): loss %.4f -> %.4f, val_loss %.4f "
        "(perplexity %.3g), %.0f tokens/s, padding efficiency %.3f.",
        global_steps,
        steps_this_attempt,
        train_seconds,
        train_seconds / max(steps_this_attempt, 1),
        initial_loss,
        final_loss,
        val_loss,
        math.exp(min(val_loss, 50.0)),
        tokens_per_second,
        padding_efficiency,
    )

    trainer.model = without_autocast(trainer.model)
    sample = val_ds.take(4) if streaming else val_ds.select(range(min(4, len(val_ds))))
    texts = [row["text"] if classify else row["prompt"] + row["completion"] for row in sample]
    # The label set the model answers in: the head's order for a classifier, the candidates a
    # causal LM is scored on (labels it never saw in training could not be its answers).
    from sparktune.model import classification

    if not classify:
        # The training splits hold prompt and completion only here; the labels are on disk.
        if streaming:
            labels = classification.label_names(None, None, request.dataset_path, streaming)
        else:
            on_disk = load_train_dataset(request.dataset_path, ("label",))
            labels = classification.label_names(
                on_disk["train"], on_disk["validation"], request.dataset_path, streaming
            )
    spec = {
        "task": params.task,
        "labels": list(labels),
        # The template prepare_data built the rows with: the same function over the same label set
        # (the dataset's, sorted) and tokenizer gives the same string.
        "prompt_template": ""
        if classify
        else effective_prompt_template(params.prompt_template, tokenizer, labels),
        # Whoever loads the model loads it as training did: its own code only if trusted here.
        "trust_remote_code": params.trust_remote_code,
    }
    adapter_uri = ""
    if params.peft_method != "full":
        # Before merging: merge_and_unload folds the adapter into the base, in place.
        adapter_uri = log_adapter_model(run_id, trainer, request, params, output_dir, texts, spec)
    merged = merge_trained(
        trainer, params, request, output_dir, **(classification.model_kwargs(labels) if classify else {})
    )
    merged = to_stored_dtype(merged, request.base_model, trust_remote_code=params.trust_remote_code)
    merged.eval()
    from sparktune.model import label_pyfunc

    merged_dir = output_dir / "merged"
    merged.save_pretrained(str(merged_dir), safe_serialization=True)
    tokenizer.save_pretrained(str(merged_dir))
    model_uri = log_label_model(
        MODEL_ARTIFACT, {label_pyfunc.MERGED_ARTIFACT: merged_dir}, {**spec, "dtype": "auto"}
    )
    diff = verify_logged_model(
        model_uri, merged, tokenizer, texts, trust_remote_code=params.trust_remote_code
    )
    mlflow.log_metric("logged_model_max_logit_diff", diff)
    logger.info("Logged model %s reloads with max logit difference %.2g.", model_uri, diff)

    return TrainResult(
        mlflow_run_id=run_id,
        model_uri=model_uri,
        trainable_params=trainable,
        total_params=total,
        trainable_percent=100.0 * trainable / total,
        train_loss=final_loss,
        initial_loss=initial_loss,
        tokens_per_second=tokens_per_second,
        padding_efficiency=padding_efficiency,
        train_seconds=train_seconds,
        global_steps=global_steps,
        reused=False,
        val_loss=val_loss,
        adapter_model_uri=adapter_uri,
        recipe=recipe,
        precision=precision,
    )


def build_trainer(
    request: TrainRequest,
    params: PipelineParams,
    splits: tuple[Any, Any, int],
    output_dir: Path,
    callbacks: list[Any],
) -> tuple[Any, Any, list[str] | None]:
    """The tokenizer, the base model and the trainer over ``splits``, as every run trains them:
    ``(trainer, tokenizer, labels)``, ``labels`` the classifier's head order (None for a causal LM).

    Nothing here talks to MLflow (``callbacks`` report the steps), so a check of the training path
    on other hardware (``benchmarks/gpu_check.py``) runs this same function without it.
    """
    from transformers import PrinterCallback, set_seed

    classify = params.task == "sequence_classification"
    train_ds, val_ds, n_train = splits
    streaming = params.dataset_mode == "streaming"
    set_seed(params.seed)
    # The one switch for the base's own code (auto_map); weights load as safetensors only.
    trust = params.trust_remote_code
    tokenizer = load_train_tokenizer(request.base_model, trust_remote_code=trust, task=params.task)
    labels = None
    if classify:
        from sparktune.model import classification

        labels = classification.label_names(train_ds, val_ds, request.dataset_path, streaming)
        # Saved with the tokenizer: evaluation and serving truncate texts as training did.
        tokenizer.model_max_length = params.max_length
        model = classification.load_classifier(
            request.base_model, tokenizer, params.peft_method, labels, trust_remote_code=trust
        )
    else:
        model = load_base_model(request.base_model, tokenizer, params.peft_method, trust_remote_code=trust)
        if params.packing:
            check_packing_isolation(model, tokenizer)

    trainer_cls = make_trainer_classes()[0]
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    stream_shards = getattr(train_ds, "num_shards", 0) if streaming else 0
    if classify:
        trainer = classification.build_trainer(
            model,
            tokenizer,
            params,
            output_dir,
            train_ds,
            val_ds,
            n_train,
            stream_shards=stream_shards,
            world_size=world_size,
            callbacks=callbacks,
        )
    else:
        trainer = trainer_cls(
            model=model,
            args=sft_config(params, output_dir, n_train, stream_shards, world_size=world_size),
            train_dataset=train_ds,
            eval_dataset=val_ds,
            processing_class=tokenizer,
            peft_config=lora_config_from_params(params) if params.peft_method in ("lora", "qlora") else None,
            callbacks=callbacks,
        )
    if streaming:
        from sparktune.data.streaming import shuffle_stream

        in_workers = trainer.args.dataloader_num_workers > 0
        trainer.train_dataset = shuffle_stream(
            trainer.train_dataset, params.seed, read_in_worker_processes=in_workers
        )
    # The step logger writes each logging step to the task log already; PrinterCallback would repeat it.
    trainer.remove_callback(PrinterCallback)
    return trainer, tokenizer, labels


def _param_value(value: Any) -> Any:
    # MLflow caps a param value at 6000 characters; a long prompt template would fail the run.
    if isinstance(value, str) and len(value) > 500:
        return value[:497] + "..."
    return value


# --------------------------------------------------------------------------------------------
# CLI


def summary_line(result: TrainResult) -> str:
    return (
        f"sparktune-train {'reused' if result.reused else 'trained'} run={result.mlflow_run_id} "
        f"model_uri={result.model_uri} steps={result.global_steps} "
        f"loss={result.initial_loss:.4f}->{result.train_loss:.4f} "
        f"trainable={result.trainable_params}/{result.total_params} ({result.trainable_percent:.2f}%) "
        f"tokens_per_s={result.tokens_per_second:.0f} padding_efficiency={result.padding_efficiency:.3f}"
        f" precision={result.precision or '?'}"
    )


# load_finished_result: sparktune_airflow reads a finished run's result through this module.
__all__ = [
    "CODE_FINGERPRINT_TAG",
    "CODE_VERSION_TAG",
    "build_trainer",
    "load_finished_result",
    "resolve_recipe",
    "summary_line",
    "train",
]
