"""OpenLineage inputs and outputs of the sparktune operators, built from what their ``execute`` returned.

The OpenLineage provider calls ``get_openlineage_facets_on_complete(task_instance)`` on an operator
after a successful ``execute`` in the same process; the operators keep their result on ``self``
and hand it to the functions here, which need no running Airflow (unit-tested on plain dicts).

The chain of one ``llm_finetune`` run, each dataset versioned by the run's data fingerprint
(``DatasetVersionDatasetFacet``):

    source --prepare_data--> prepared/<fp>/split=train|validation|test
           --materialize_dataset--> datasets/<fp>
           --train--> mlflow: runs/<run id>/model
           --register--> mlflow: models/<name>/<version>
    source + models/<name>/<version> --batch_inference--> predictions

Naming follows the OpenLineage dataset naming spec as the Airflow providers apply it: a local
path is namespace ``file`` with the absolute path as name; ``s3://bucket/key`` is namespace
``s3://bucket``, name ``key`` (likewise gs, abfss, wasbs); other URIs keep ``scheme://authority``
as namespace and the path as name; a Spark catalog table is namespace ``spark_catalog``. MLflow
objects are namespace ``mlflow://<tracking host>`` (``mlflow://local`` for a SQLite or file
store) with names ``runs/<run id>/model`` and ``models/<name>/<version>``.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

if TYPE_CHECKING:  # imported where used: a DAG file importing the operators pays nothing for them
    from openlineage.client.event_v2 import InputDataset, OutputDataset


# Object stores: the bucket (container) is the namespace, the key without its leading "/" the name.
OBJECT_STORE_SCHEMES = ("s3", "s3a", "s3n", "gs", "gcs", "abfs", "abfss", "wasb", "wasbs", "r2")
TABLE_NAMESPACE = "spark_catalog"
PREPARED_SPLITS = ("train", "validation", "test")


def dataset_name(uri: str) -> tuple[str, str]:
    """``(namespace, name)`` of a path, URI or catalog table after the OpenLineage naming spec."""
    uri = str(uri).strip()
    if not uri:
        raise ValueError("an empty URI has no lineage name")
    if "://" not in uri and not uri.startswith(("/", "file:", "dbfs:")):
        return TABLE_NAMESPACE, uri  # resolve_source_uri makes every local path absolute
    parsed = urlparse(uri)
    scheme = parsed.scheme.lower()
    if scheme in ("", "file"):
        return "file", (parsed.path or uri).rstrip("/") or "/"
    if scheme == "dbfs":
        return "dbfs", parsed.path.rstrip("/")
    if scheme in OBJECT_STORE_SCHEMES:
        return f"{scheme}://{parsed.netloc}", parsed.path.strip("/")
    return f"{scheme}://{parsed.netloc}", parsed.path.rstrip("/")


def mlflow_namespace(tracking_uri: str | None) -> str:
    """``mlflow://<host[:port]>`` of an MLflow server, ``mlflow://databricks`` on Databricks,
    ``mlflow://local`` for the embedded SQLite or file store."""
    parsed = urlparse(str(tracking_uri or ""))
    if parsed.scheme in ("http", "https") and parsed.netloc:
        return f"mlflow://{parsed.netloc}"
    if str(tracking_uri or "").startswith(
        "databricks"
    ):  # "databricks", "databricks-uc", "databricks://profile"
        return "mlflow://databricks"
    return "mlflow://local"


def _facets(version: str | None, description: str | None = None) -> dict[str, Any]:
    from openlineage.client.facet_v2 import dataset_version_dataset, documentation_dataset

    facets: dict[str, Any] = {}
    if version:
        facets["version"] = dataset_version_dataset.DatasetVersionDatasetFacet(datasetVersion=str(version))
    if description:
        facets["documentation"] = documentation_dataset.DocumentationDatasetFacet(description=description)
    return facets


def input_dataset(uri: str, version: str | None, description: str | None = None) -> InputDataset:
    from openlineage.client.event_v2 import InputDataset

    namespace, name = dataset_name(uri)
    return InputDataset(namespace=namespace, name=name, facets=_facets(version, description))


def output_dataset(uri: str, version: str | None, description: str | None = None) -> OutputDataset:
    from openlineage.client.event_v2 import OutputDataset

    namespace, name = dataset_name(uri)
    return OutputDataset(namespace=namespace, name=name, facets=_facets(version, description))


def split_uris(
    prepared_uri: str, splits: Iterable[str] = PREPARED_SPLITS, split_column: str = "split"
) -> list[str]:
    """The Hive-style partition folders a prepared dataset's splits live in."""
    root = str(prepared_uri).rstrip("/")
    return [f"{root}/{split_column}={split}" for split in splits]


def has_split_folders(uri: str, split_column: str = "split", storage_options: dict | None = None) -> bool:
    """Whether ``uri`` is a folder partitioned by ``split_column`` (``<uri>/split=train/...``).

    One listing; a catalog table, a file or an unreadable URI answers False (lineage then names
    the source itself)."""
    if dataset_name(uri)[0] == TABLE_NAMESPACE:
        return False
    try:
        from fsspec.core import url_to_fs

        fs, path = url_to_fs(str(uri), **(storage_options or {}))
        return any(
            posixpath.basename(str(entry).rstrip("/")).startswith(f"{split_column}=")
            for entry in fs.ls(path, detail=False)
        )
    except Exception:  # lineage must never fail the task; the listener would only log it anyway
        return False


def run_model_name(run_id: str, artifact_path: str = "model") -> str:
    return f"runs/{run_id}/{artifact_path}"


def model_version_name(model_name: str, version: str | int) -> str:
    return f"models/{model_name}/{version}"


def _mlflow(output: bool, tracking_uri: str | None, name: str, version: str | None, description: str):
    from openlineage.client.event_v2 import InputDataset, OutputDataset

    dataset_cls = OutputDataset if output else InputDataset
    return dataset_cls(
        namespace=mlflow_namespace(tracking_uri), name=name, facets=_facets(version, description)
    )


# --- per operator: (inputs, outputs) from the operator's own result


def prepare_lineage(summary: Mapping[str, Any]) -> tuple[list[InputDataset], list[OutputDataset]]:
    """``PrepareDataOperator``: the source -> one output per prepared split, all at the fingerprint."""
    fingerprint = summary["data_fingerprint"]
    splits = list((summary.get("split_counts") or {}).keys()) or list(PREPARED_SPLITS)
    inputs = [input_dataset(summary["source_uri"], fingerprint, "training source")]
    outputs = [
        output_dataset(uri, fingerprint, f"prepared {split} split")
        for split, uri in zip(splits, split_uris(summary["prepared_uri"], splits), strict=True)
    ]
    return inputs, outputs


def materialize_lineage(
    summary: Mapping[str, Any], source: str, *, split_column: str | None = "split", partitioned: bool = True
) -> tuple[list[InputDataset], list[OutputDataset]]:
    """``MaterializeDatasetOperator``: the prepared splits (or the whole source when it is not
    partitioned by ``split_column``) -> the Arrow ``DatasetDict``. Streaming mode reads the
    Parquet in place: the same inputs, and the prepared folder as the dataset training reads."""
    fingerprint = summary.get("data_fingerprint")
    splits = list((summary.get("rows") or {}).keys()) or list(PREPARED_SPLITS)
    if split_column and partitioned:
        inputs = [
            input_dataset(uri, fingerprint, "prepared split")
            for uri in split_uris(source, splits, split_column)
        ]
    else:
        inputs = [input_dataset(source, fingerprint, "dataset source")]
    description = "Hugging Face DatasetDict (Arrow)"
    if summary.get("dataset_mode") == "streaming":
        description = "Parquet splits streamed by training"
    outputs = [output_dataset(summary["dataset_uri"], fingerprint, description)]
    return inputs, outputs


def train_lineage(
    result: Mapping[str, Any], dataset_uri: str, data_fingerprint: str | None, tracking_uri: str | None
) -> tuple[list[InputDataset], list[OutputDataset]]:
    """``TrainModelOperator``: the dataset -> the model the MLflow run logged."""
    inputs = [input_dataset(dataset_uri, data_fingerprint, "training dataset")]
    name = run_model_name(result["mlflow_run_id"])
    outputs = [_mlflow(True, tracking_uri, name, data_fingerprint, "model logged by the MLflow run")]
    return inputs, outputs


def register_lineage(
    run_id: str, model_name: str, version: str | int, data_fingerprint: str | None, tracking_uri: str | None
) -> tuple[list[InputDataset], list[OutputDataset]]:
    """``RegisterModelOperator``: the run's model -> the registered model version."""
    inputs = [
        _mlflow(
            False, tracking_uri, run_model_name(run_id), data_fingerprint, "model logged by the MLflow run"
        )
    ]
    outputs = [
        _mlflow(
            True,
            tracking_uri,
            model_version_name(model_name, version),
            data_fingerprint,
            "registered model version",
        )
    ]
    return inputs, outputs


def batch_inference_lineage(
    summary: Mapping[str, Any], source_uri: str, tracking_uri: str | None
) -> tuple[list[InputDataset], list[OutputDataset]]:
    """``BatchInferenceOperator``: the texts + the model version -> predictions (and the review rows).

    The predictions carry the scoring model's data fingerprint as version (each row holds it too)."""
    model = summary["model"]
    fingerprint = model.get("data_fingerprint") or None
    inputs = [
        input_dataset(source_uri, None, "texts scored"),
        _mlflow(
            False,
            tracking_uri,
            model_version_name(model["name"], model["version"]),
            fingerprint,
            f"registered model version (@{model.get('alias')})",
        ),
    ]
    outputs = [
        output_dataset(
            summary["output_uri"], fingerprint, f"predictions, partition {summary.get('partition')}"
        )
    ]
    if summary.get("feedback_uri"):
        outputs.append(
            output_dataset(
                f"{str(summary['feedback_uri']).rstrip('/')}/predictions", fingerprint, "rows for review"
            )
        )
    return inputs, outputs


def operator_lineage(lineage: tuple[list[InputDataset], list[OutputDataset]] | None):
    """The provider's ``OperatorLineage`` of ``(inputs, outputs)``; an empty one when there is none
    (a failed or skipped ``execute`` left nothing to report)."""
    from airflow.providers.openlineage.extractors import OperatorLineage

    if not lineage:
        return OperatorLineage()
    inputs, outputs = lineage
    return OperatorLineage(inputs=list(inputs), outputs=list(outputs))


class ReportsLineage:
    """Mixin of the operators that report lineage: ``execute`` returns ``self._keep(result)``, and
    ``get_openlineage_facets_on_complete`` (the provider calls it after ``execute``, in the same
    process) builds the datasets from ``self._lineage_result``."""

    _lineage_result: Any = None

    def _keep(self, result: Any) -> Any:
        self._lineage_result = result
        return result

    def _lineage(self) -> tuple[list[InputDataset], list[OutputDataset]] | None:
        raise NotImplementedError

    def get_openlineage_facets_on_complete(self, task_instance: Any):
        return operator_lineage(self._lineage() if self._lineage_result else None)
