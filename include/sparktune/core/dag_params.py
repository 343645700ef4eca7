"""The params of the DAGs around the pipeline (batch_inference, review_queue, record_corrections,
rollback_champion), in the same :class:`ParamSpec` form as the pipeline's own.

Functions, not constants: their defaults are paths under ``SPARKTUNE_HOME`` and the lake, read
when a DAG file is parsed.
"""

from __future__ import annotations

from dataclasses import replace

from sparktune.core.config import DEFAULT_MODEL_NAME, settings
from sparktune.core.params import SPECS_BY_NAME, ParamSpec

SCORING = "Scoring"
MODEL = "Model"
REVIEW = "Review"


def batch_inference_specs() -> tuple[ParamSpec, ...]:
    """What the batch_inference trigger form asks: the texts, where predictions go, the model."""
    return (
        ParamSpec(
            "source_uri",
            "string",
            str(settings().incoming_source_path),
            "Table name or path (Parquet, CSV, JSON Lines) of the texts to score.",
            section=SCORING,
            min_length=1,
        ),
        ParamSpec(
            "source_format",
            "string",
            "auto",
            "How to read source_uri.",
            enum=SPECS_BY_NAME["source_format"].enum,
            section=SCORING,
        ),
        ParamSpec("text_column", "string", "message", "Column with the text.", section=SCORING, min_length=1),
        ParamSpec(
            "id_column",
            "string",
            "message_hash",
            "Column identifying each row.",
            section=SCORING,
            min_length=1,
        ),
        ParamSpec(
            "output_uri",
            "string",
            f"{settings().lake_uri}/predictions",
            "Parquet root of the predictions; each run writes <output_uri>/date=<day>.",
            section=SCORING,
            min_length=1,
        ),
        ParamSpec(
            "min_score",
            "number",
            0.0,
            "Keep predictions whose confidence is at least this (0 keeps all).",
            minimum=0.0,
            maximum=1.0,
            section=SCORING,
        ),
        ParamSpec(
            "batch_size", "integer", 32, "Texts per forward pass.", minimum=1, maximum=4096, section=SCORING
        ),
        ParamSpec(
            "feedback_uri",
            "string",
            settings().feedback_uri,
            "Feedback table that receives the scored rows for review; empty: none.",
            section=SCORING,
        ),
        ParamSpec(
            "model_name",
            "string",
            DEFAULT_MODEL_NAME,
            "Registered model (a champion-alias event that triggers the run names its own).",
            section=MODEL,
            min_length=1,
        ),
        ParamSpec("model_alias", "string", "champion", "Alias to score with.", section=MODEL, min_length=1),
        replace(SPECS_BY_NAME["trust_remote_code"], section=MODEL),
    )


def record_corrections_specs() -> tuple[ParamSpec, ...]:
    """The corrections file and the model whose labels they use."""
    return (
        ParamSpec(
            "corrections_uri",
            "string",
            None,  # no default: every run names its file
            "Path of the corrections (Parquet, CSV or JSON Lines) with columns id and label.",
            section="Corrections",
            min_length=1,
        ),
        ParamSpec(
            "model_name",
            "string",
            DEFAULT_MODEL_NAME,
            "Model whose champion's labels the corrections use.",
            section=MODEL,
            min_length=1,
        ),
    )


def review_queue_specs() -> tuple[ParamSpec, ...]:
    """Whose scored rows to queue for review, how many, and where the files go."""
    return (
        ParamSpec(
            "model_name",
            "string",
            DEFAULT_MODEL_NAME,
            "Registered model whose scored rows to queue. Empty: the rows of every model.",
            section=MODEL,
        ),
        ParamSpec(
            "queue_size",
            "integer",
            100,
            "How many rows the queue holds: the distinct, uncorrected texts the model is least sure of.",
            minimum=1,
            maximum=10_000,
            section=REVIEW,
        ),
        ParamSpec(
            "output_uri",
            "string",
            f"{settings().feedback_uri}/review_queue",
            "Folder of the queues; each run writes <output_uri>/<run id>/review_queue.csv and .parquet.",
            section=REVIEW,
            min_length=1,
        ),
    )


def rollback_specs() -> tuple[ParamSpec, ...]:
    """Which model's champion to move back, to which version, and why."""
    return (
        ParamSpec(
            "model_name",
            "string",
            DEFAULT_MODEL_NAME,
            "Registered model name in MLflow whose champion to roll back.",
            section=MODEL,
            min_length=1,
        ),
        ParamSpec(
            "to_version",
            "string",
            "",
            "Version number to make champion. Empty: the version the previous_champion alias points at.",
            section=MODEL,
            pattern=r"^\s*[0-9]*\s*$",
        ),
        ParamSpec(
            "reason",
            "string",
            "",
            "Why you roll back; recorded in the audit log. Empty: 'rollback requested by' this DAG run.",
            section=MODEL,
        ),
    )


def champion_guard_specs() -> tuple[ParamSpec, ...]:
    """Which model's champion to check against the audit log."""
    return (
        ParamSpec(
            "model_name",
            "string",
            "",
            "Registered model whose champion to check against the audit log. Empty: every registered model.",
            section=MODEL,
        ),
    )
