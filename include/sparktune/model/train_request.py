"""What a training process is asked and what it answers: :class:`TrainRequest` in, :class:`TrainResult`
out, both as JSON, whatever runs the training (a local process, TorchDistributor ranks, a Databricks job).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from sparktune.model.training_setup import TrainingInputError


@dataclass
class TrainRequest:
    dataset_path: str
    base_model: str
    output_dir: str
    params: dict[str, Any]
    mlflow_tracking_uri: str
    experiment_name: str
    train_key: str
    tags: dict[str, str] = field(default_factory=dict)
    run_name: str = ""
    # Where a newly created experiment keeps its artifacts. Empty: beside a local SQLite
    # tracking database (``<db folder>/artifacts``), else the tracking server's default.
    artifact_location: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TrainRequest:
        raw = json.loads(text)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise TrainingInputError(
                f"Unknown train request fields {unknown}; expected only {sorted(known)}."
            )
        missing = sorted(
            f.name
            for f in fields(cls)
            if f.name not in raw and f.name not in ("tags", "run_name", "artifact_location")
        )
        if missing:
            raise TrainingInputError(f"Train request is missing fields {missing}.")
        return cls(**raw)


@dataclass
class TrainResult:
    mlflow_run_id: str
    model_uri: str
    trainable_params: int
    total_params: int
    trainable_percent: float
    train_loss: float
    initial_loss: float
    tokens_per_second: float
    padding_efficiency: float
    train_seconds: float
    global_steps: int
    reused: bool = False
    val_loss: float | None = None
    # The adapter over its base, as a pyfunc model (LoRA and QLoRA runs); "" for full fine-tuning.
    adapter_model_uri: str = ""
    # sparktune.model.recipes.ResolvedRecipe.summary(): the recipe and which values came from it.
    recipe: dict[str, Any] = field(default_factory=dict)
    # The arithmetic training ran in: "bf16" (autocast) or "float32"; "" in results recorded before.
    precision: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TrainResult:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known})
