"""The params of the DAGs around the pipeline (batch_inference, review_queue, record_corrections,
rollback_champion, champion_guard), typed the same way as the pipeline's own
(:mod:`sparktune.core.params`).

Defaults under ``SPARKTUNE_HOME`` and the lake are read when a DAG file builds its form.
"""

from __future__ import annotations

from typing import Literal

from sparktune.core.config import DEFAULT_MODEL_NAME, settings
from sparktune.core.params import (
    DataSource,
    Integer,
    Number,
    OptionalText,
    ParamGroup,
    RequiredText,
    TrainingRecipe,
    param,
)
from sparktune.core.paths import source_root_problems

SCORING = "Scoring"
MODEL = "Model"
REVIEW = "Review"
LABEL_ISSUES = "Label issues"


class BatchInferenceParams(ParamGroup):
    """What the batch_inference trigger form asks: the texts, where predictions go, the model."""

    source_uri: RequiredText = param(
        None,
        "Table name or path (Parquet, CSV, JSON Lines) of the texts to score.",
        default_factory=lambda: str(settings().incoming_source_path),
        section=SCORING,
    )
    source_format: Literal["auto", "parquet", "csv", "json", "table"] = param(
        "auto", "How to read source_uri.", section=SCORING
    )
    text_column: RequiredText = param("message", "Column with the text.", section=SCORING)
    id_column: RequiredText = param("message_hash", "Column identifying each row.", section=SCORING)
    output_uri: RequiredText = param(
        None,
        "Parquet root of the predictions; each run writes <output_uri>/date=<day>.",
        default_factory=lambda: f"{settings().lake_uri}/predictions",
        section=SCORING,
    )
    min_score: Number = param(
        0.0,
        "Keep predictions whose confidence is at least this (0 keeps all).",
        ge=0.0,
        le=1.0,
        section=SCORING,
    )
    batch_size: Integer = param(64, "Texts per forward pass.", ge=1, le=4096, section=SCORING)
    feedback_uri: OptionalText = param(
        None,
        "Feedback table that receives the scored rows for review; empty: none.",
        default_factory=lambda: settings().feedback_uri,
        section=SCORING,
    )
    model_name: RequiredText = param(
        DEFAULT_MODEL_NAME,
        "Registered model (a champion-alias event that triggers the run names its own).",
        section=MODEL,
    )
    model_alias: RequiredText = param("champion", "Alias to score with.", section=MODEL)
    trust_remote_code: bool = param(
        False, TrainingRecipe.model_fields["trust_remote_code"].description or "", section=MODEL
    )


class RecordCorrectionsParams(ParamGroup):
    """The corrections file and the model whose labels they use."""

    corrections_uri: RequiredText = param(
        ...,  # no default: every run names its file
        "Path of the corrections (Parquet, CSV or JSON Lines) with columns id and label.",
        section="Corrections",
    )
    model_name: RequiredText = param(
        DEFAULT_MODEL_NAME, "Model whose champion's labels the corrections use.", section=MODEL
    )


def _as_trained(name: str) -> str:
    """The description of the training source's param ``name``, for a DAG that reads that source."""
    return f"{DataSource.model_fields[name].description} As in llm_finetune's run."


class ReviewQueueParams(ParamGroup):
    """Whose scored rows to queue for review, how many, the training source whose label issues lead
    the queue, and where the files go."""

    model_name: OptionalText = param(
        DEFAULT_MODEL_NAME,
        "Registered model whose scored rows to queue. Empty: the rows of every model.",
        section=MODEL,
    )
    queue_size: Integer = param(
        100,
        "How many scored rows the queue holds (after the label issues): the distinct, uncorrected "
        "texts the model is least sure of.",
        ge=1,
        le=10_000,
        section=REVIEW,
    )
    output_uri: RequiredText = param(
        None,
        "Folder of the queues; each run writes <output_uri>/<run id>/review_queue.csv and .parquet.",
        default_factory=lambda: f"{settings().feedback_uri}/review_queue",
        section=REVIEW,
    )
    label_issues: Integer = param(
        50,
        "How many label issues lead the queue: rows of the training source whose label "
        "cross-validated TF-IDF + logistic regression contradicts (cleanlab), likeliest wrong first. "
        "0: none, the source is not read.",
        ge=0,
        le=10_000,
        section=LABEL_ISSUES,
    )
    # The training source, with the pipeline's defaults (sparktune.core.params.DataSource).
    source_uri: OptionalText = param(
        DataSource.model_fields["source_uri"].default,
        "Training source to look for label issues in. " + _as_trained("source_uri"),
        section=LABEL_ISSUES,
    )
    source_format: Literal["auto", "parquet", "csv", "json", "table"] = param(
        DataSource.model_fields["source_format"].default, _as_trained("source_format"), section=LABEL_ISSUES
    )
    text_column: RequiredText = param(
        DataSource.model_fields["text_column"].default, _as_trained("text_column"), section=LABEL_ISSUES
    )
    label_column: RequiredText = param(
        DataSource.model_fields["label_column"].default, _as_trained("label_column"), section=LABEL_ISSUES
    )
    id_column: OptionalText = param(
        DataSource.model_fields["id_column"].default,
        "Optional column identifying each row: a label issue's id. Empty: a sha256 of the normalized text.",
        section=LABEL_ISSUES,
    )
    label_issue_max_rows: Integer = param(
        200_000,
        "Distinct texts of the source judged at most (they are collected to the Spark driver); more: "
        "the same sample every run, by text hash.",
        ge=100,
        le=2_000_000,
        section=LABEL_ISSUES,
    )

    def checks(self) -> list[str]:
        return source_root_problems(self.model_dump())  # SPARKTUNE_ALLOWED_ROOTS, when the deployment sets it


class RollbackParams(ParamGroup):
    """Which model's champion to move back, to which version, and why."""

    model_name: RequiredText = param(
        DEFAULT_MODEL_NAME, "Registered model name in MLflow whose champion to roll back.", section=MODEL
    )
    to_version: OptionalText = param(
        "",
        "Version number to make champion. Empty: the version the previous_champion alias points at.",
        section=MODEL,
        pattern=r"^\s*[0-9]*\s*$",
    )
    reason: OptionalText = param(
        "",
        "Why you roll back; recorded in the audit log. Empty: 'rollback requested by' this DAG run.",
        section=MODEL,
    )


class ChampionGuardParams(ParamGroup):
    """Which model's champion to check against the audit log."""

    model_name: OptionalText = param(
        "",
        "Registered model whose champion to check against the audit log. Empty: every registered model.",
        section=MODEL,
    )


MONITOR = "Monitoring"


class MonitorChampionParams(ParamGroup):
    """Whose champion to watch, over which window of traffic, and where drift begins."""

    model_name: RequiredText = param(
        DEFAULT_MODEL_NAME, "Registered model whose champion's traffic to compare.", section=MODEL
    )
    window_hours: Integer = param(
        24,
        "The window compared: texts scored (batch inference, the server) in the hours before the run.",
        ge=1,
        le=24 * 366,
        section=MONITOR,
    )
    min_texts: Integer = param(
        300,
        "Fewer texts than this in the window: nothing is compared, the result says so. Below about "
        "300, chance alone moves the label mix past its threshold.",
        ge=10,
        le=1_000_000,
        section=MONITOR,
    )
    text_threshold: Number = param(
        0.6,
        "Text drift above this: ROC AUC of a classifier telling window from training texts (0.5: alike).",
        ge=0.5,
        le=1.0,
        section=MONITOR,
    )
    label_mix_threshold: Number = param(
        0.1,
        "Label-mix drift above this: Jensen-Shannon distance of predicted labels to training labels.",
        ge=0.0,
        le=1.0,
        section=MONITOR,
    )
    score_threshold: Number = param(
        0.05,
        "Score drift below this: p-value of the K-S test of scores against the champion's test-split scores.",
        ge=0.0,
        le=1.0,
        section=MONITOR,
    )
    review_size: Integer = param(
        50,
        "On drift, how many of the most drifted texts to queue for review (0: none).",
        ge=0,
        le=10_000,
        section=MONITOR,
    )
    max_rows: Integer = param(
        5000,
        "Texts compared from each side at most (a seeded sample beyond): the report's cost.",
        ge=100,
        le=200_000,
        section=MONITOR,
    )
