"""``RegisterModelOperator``: one registered model version per training run, with its lineage tags
and the ``candidate`` alias."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator
from sparktune_airflow.core.lineage import ReportsLineage
from sparktune_airflow.core.links import MLflowModelVersionLink
from sparktune_airflow.core.mlflow import UsesMLflowConnection
from sparktune_airflow.core.task_context import audit_actor


def _log_file(client: Any, run_id: str, uri: str, folder: str) -> None:
    """Log a local file, or a copy of a file in the lake (any fsspec URI), as a run artifact."""
    import tempfile

    path = uri.removeprefix("file://")
    if not path or path == "None":
        return
    if Path(path).is_file():
        client.log_artifact(run_id, path, folder)
        return
    if "://" not in path:
        return  # a missing local file: nothing to log
    import fsspec

    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / path.rstrip("/").rsplit("/", 1)[-1]
        try:
            fsspec.filesystem(fsspec.core.split_protocol(path)[0]).get(path, str(local))
        except (OSError, ValueError, ImportError) as exc:
            logging.getLogger(__name__).warning("%s not logged to run %s: %s", uri, run_id, exc)
            return
        client.log_artifact(run_id, str(local), folder)


class RegisterModelOperator(UsesMLflowConnection, ReportsLineage, BaseOperator):
    """One registered version per training run (a retry finds it), lineage tags, alias ``candidate``.

    Returns ``model_name``, ``version`` and the alias move. MLflow is the ``mlflow_conn_id``
    connection's server.

    :param run_id: (templated) the MLflow run whose ``model`` is registered.
    :param model_name: (templated) the registered model name.
    :param tags: (templated) version tags (values made strings); the run's code version and the
        prepared labels are added when known.
    :param run_artifacts: (templated) name -> JSON-able record, logged to the run as
        ``pipeline/<name>.json``.
    :param run_files: (templated) artifact folder -> local files (a list, or a dict whose values are
        the files), logged to the run, e.g. the Data Docs pages; missing files are skipped.
    """

    template_fields: Sequence[str] = ("run_id", "model_name", "tags", "run_artifacts", "run_files")
    operator_extra_links = (MLflowModelVersionLink(),)

    def __init__(
        self,
        *,
        run_id: str,
        model_name: str,
        tags: dict[str, str] | None = None,
        run_artifacts: dict[str, Any] | None = None,
        run_files: dict[str, list[str] | dict[str, str]] | None = None,
        **kwargs: Any,
    ) -> None:
        """``run_artifacts``: name -> JSON-able record; ``run_files``: artifact folder -> local files
        (a list, or a dict whose values are the files), e.g. the run's Data Docs pages."""
        kwargs.setdefault("multiple_outputs", True)  # version is read by the tasks after it
        super().__init__(**kwargs)
        self.run_id = run_id
        self.model_name = model_name
        self.tags = tags or {}
        self.run_artifacts = run_artifacts or {}
        self.run_files = run_files or {}

    def execute(self, context: Any) -> dict[str, Any]:
        from sparktune.release.registry import CANDIDATE, move_alias, register_run_model

        client = self.mlflow_hook.get_conn()
        for name, content in self.run_artifacts.items():
            client.log_dict(self.run_id, content, f"pipeline/{name}.json")
        for folder, files in self.run_files.items():
            for uri in (files.values() if isinstance(files, dict) else files) or []:
                _log_file(client, self.run_id, str(uri or ""), folder)
        prepare = self.run_artifacts.get("prepare_summary") or {}
        for step in prepare.get("steps", []):
            client.log_metric(self.run_id, f"rows_out.{step['step']}", step["rows_out"])
        feedback = self.run_artifacts.get("feedback_summary") or {}
        for name in ("labels_changed", "added_rows"):
            if name in feedback:
                client.log_metric(self.run_id, f"feedback.{name}", feedback[name])
        # A value a run could not tell (a table's source signature) is left out, not tagged "None".
        tags = {k: str(v) for k, v in self.tags.items() if v is not None and str(v) != ""}
        from sparktune.model.training import CODE_FINGERPRINT_TAG, CODE_VERSION_TAG

        run_tags = client.get_run(self.run_id).data.tags
        code_version = run_tags.get(CODE_VERSION_TAG)
        if code_version:
            tags.setdefault("code_version", code_version)
        # With data_fingerprint: what a later run compares to skip retraining (sparktune.release.retrain).
        for run_tag, version_tag in (
            ("sparktune.config_hash", "config_hash"),
            (CODE_FINGERPRINT_TAG, "code_fingerprint"),
        ):
            if run_tags.get(run_tag):
                tags.setdefault(version_tag, run_tags[run_tag])
        if prepare.get("labels"):
            # The label set travels with the version: batch inference scores a causal LM's
            # candidates from it, and the smoke test checks answers against it.
            tags.setdefault("labels", json.dumps(list(prepare["labels"])))
        version = register_run_model(client, self.model_name, self.run_id, tags)
        move = move_alias(
            client,
            self.model_name,
            CANDIDATE,
            version,
            actor=audit_actor(context),
            reason=f"registered from run {self.run_id}",
        )
        self._data_fingerprint = run_tags.get("sparktune.data_fingerprint") or tags.get("data_fingerprint")
        return self._keep(
            {"model_name": self.model_name, "version": version, "alias_move": move.to_summary()}
        )

    def _lineage(self):
        """The MLflow run's model -> the registered model version."""
        from sparktune_airflow.core.lineage import register_lineage

        result = self._lineage_result
        return register_lineage(
            str(self.run_id),
            result["model_name"],
            result["version"],
            getattr(self, "_data_fingerprint", None),
            self.mlflow_hook.tracking_uri(),
        )
