"""Finds a ``champion`` alias that did not get where it is through this pipeline: set by hand in the
MLflow UI or API instead of by ``promote_champion``, ``rollback_champion`` or an adoption.

The registry's audit log records every move the pipeline makes; a champion that differs from the
version the log's last champion move leaves was moved outside it. A move under way (its record not
yet closed) is not one.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlflow.tracking import MlflowClient
from sparktune.release.registry import CHAMPION, alias_version, audited_champion


@dataclass(frozen=True)
class ChampionCheck:
    model_name: str
    champion: str | None
    audited: str | None
    under_way: bool

    @property
    def moved_outside(self) -> bool:
        return self.champion != self.audited and not self.under_way

    def describe(self) -> str:
        if not self.moved_outside:
            return f"{self.model_name}@{CHAMPION} is v{self.champion}, as the audit log says"
        expected = f"v{self.audited}" if self.audited else "no champion"
        return (
            f"{self.model_name}@{CHAMPION} is v{self.champion}, but the audit log's last move leaves "
            f"{expected}: it was moved outside the pipeline"
        )


def check_champion(client: MlflowClient, model_name: str) -> ChampionCheck:
    audited, under_way = audited_champion(client, model_name)
    return ChampionCheck(model_name, alias_version(client, model_name, CHAMPION), audited, under_way)


def check_champions(client: MlflowClient, model_names: list[str] | None = None) -> list[ChampionCheck]:
    """One check per model: the ``model_names`` given, else every registered model."""
    names = model_names or sorted(m.name for m in client.search_registered_models())
    return [check_champion(client, name) for name in names]
