"""An ``MlflowClient`` on one MLflow server that carries that server's credentials itself.

MLflow's HTTP client reads a server's credentials from the process environment only
(``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD`` / ``MLFLOW_TRACKING_TOKEN``, read again
for every request). A process that talks to a server named by configuration (an Airflow connection)
must not write them into its environment: every later request of the process, to any server, and
every process it starts would carry them. :func:`mlflow_client` builds the client's tracking and
registry stores, and the repository of the server's proxied artifacts (``mlflow-artifacts:``), with
the credentials given; it changes neither ``os.environ`` nor MLflow's process-wide settings
(``mlflow.set_tracking_uri``). It builds on MLflow's own classes (``RestStore``, ``MlflowHostCreds``,
the client's tracking and registry services), whose private parts the pinned MLflow version
(``requirements.lock``) fixes; ``tests/operators/test_mlflow_connection.py`` runs it against a real
server behind a proxy that asks for the credentials.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from mlflow.entities import FileInfo
from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository
from mlflow.store.artifact.mlflow_artifacts_repo import MlflowArtifactsRepository
from mlflow.store.model_registry.rest_store import RestStore as RegistryRestStore
from mlflow.store.tracking.rest_store import RestStore as TrackingRestStore
from mlflow.tracking import MlflowClient

# MlflowClient's tracking and registry services: the one way to hand its stores credentials.
from mlflow.tracking._model_registry.client import ModelRegistryClient  # noqa: PLC2701
from mlflow.tracking._tracking_service.client import TrackingServiceClient  # noqa: PLC2701
from mlflow.utils.credentials import get_default_host_creds
from mlflow.utils.rest_utils import MlflowHostCreds, augmented_raise_for_status, http_request
from mlflow.utils.uri import validate_path_is_safe

_SERVER_SCHEMES = ("http", "https")
_ARTIFACTS_ENDPOINT = "/mlflow-artifacts/artifacts"


@dataclass(frozen=True, repr=False)
class Credentials:
    """What an MLflow server asks for: a login and password (HTTP basic) or a bearer token."""

    username: str | None = None
    password: str | None = None
    token: str | None = None

    def __repr__(self) -> str:  # never the secrets themselves, in a log or a traceback
        return f"Credentials(username={self.username!r}, password=..., token=...)"

    def for_host(self, host: str) -> MlflowHostCreds:
        """MLflow's request settings for ``host``: these credentials and nothing else of the
        environment's but its TLS settings (``MLFLOW_TRACKING_INSECURE_TLS``, the cert paths)."""
        tls = get_default_host_creds(host)
        return MlflowHostCreds(
            host=host,
            username=self.username,
            password=self.password,
            token=self.token,
            ignore_tls_verification=tls.ignore_tls_verification,
            client_cert_path=tls.client_cert_path,
            server_cert_path=tls.server_cert_path,
        )


def mlflow_client(tracking_uri: str, credentials: Credentials | None = None) -> MlflowClient:
    """An ``MlflowClient`` whose tracking and registry are ``tracking_uri``.

    ``credentials``: an MLflow server's (``http``/``https``), sent with every request of the client
    and of no one else, and never the environment's; None: MLflow's defaults (the environment's
    variables). Other stores (SQLite, a folder, Databricks) take no MLflow credentials: a plain
    client. Databricks keeps MLflow's registry for it (Unity Catalog).
    """
    if credentials is None or urlparse(tracking_uri).scheme not in _SERVER_SCHEMES:
        registry = None if tracking_uri.startswith("databricks") else tracking_uri
        return MlflowClient(tracking_uri=tracking_uri, registry_uri=registry)
    return _ServerClient(tracking_uri, credentials)


class _ServerClient(MlflowClient):
    """``MlflowClient`` with tracking and registry services that use these credentials."""

    def __init__(self, tracking_uri: str, credentials: Credentials) -> None:
        super().__init__(tracking_uri=tracking_uri, registry_uri=tracking_uri)
        self._tracking_client = _TrackingService(tracking_uri, credentials)
        # The attribute MlflowClient._get_registry_client fills on first use.
        self._registry_client_lazy = _RegistryService(tracking_uri, credentials)


class _TrackingService(TrackingServiceClient):
    def __init__(self, tracking_uri: str, credentials: Credentials) -> None:
        self.credentials = credentials
        self._store = TrackingRestStore(lambda: credentials.for_host(tracking_uri))
        super().__init__(tracking_uri)

    @property
    def store(self) -> Any:
        return self._store

    def _get_artifact_repo(self, resource_id: str, *, resource: str = "run") -> Any:
        # Built for this client each time: MLflow's cache of repositories is shared by every client
        # of the process, keyed by run id alone.
        if resource == "run":
            location = self.get_run(resource_id).info.artifact_uri
        else:
            location = self.get_logged_model(resource_id).artifact_location
        if urlparse(location).scheme == "mlflow-artifacts":
            return _ProxiedArtifacts(location, self.tracking_uri, self.credentials)
        # An object store (S3, GCS, a shared folder): its own credentials, not MLflow's.
        return get_artifact_repository(location, tracking_uri=self.tracking_uri)

    def download_artifacts(self, run_id: str, path: str, dst_path: str | None = None) -> str:
        return self._get_artifact_repo(run_id).download_artifacts(path, dst_path)

    def list_artifacts(self, run_id: str, path: str | None = None) -> list[FileInfo]:
        return self._get_artifact_repo(run_id).list_artifacts(path)


class _RegistryService(ModelRegistryClient):
    def __init__(self, registry_uri: str, credentials: Credentials) -> None:
        self._store = RegistryRestStore(lambda: credentials.for_host(registry_uri))
        super().__init__(registry_uri, registry_uri)

    @property
    def store(self) -> Any:
        return self._store


class _ProxiedArtifacts(MlflowArtifactsRepository):
    """The server's proxied artifacts (``mlflow-artifacts:``) with these credentials.

    MLflow's class takes them from the environment in three places: ``_host_creds`` (uploads,
    downloads), the server-info probe, and ``list_artifacts``, redone here with the same request.
    Multipart transfers (off unless the server offers them) would take them from the environment
    as well, so this repository does not use them.
    """

    def __init__(self, artifact_uri: str, tracking_uri: str, credentials: Credentials) -> None:
        self.credentials = credentials
        super().__init__(artifact_uri, tracking_uri=tracking_uri)

    @property
    def _host_creds(self) -> MlflowHostCreds:
        return self.credentials.for_host(self.artifact_uri)

    @property
    def _artifact_server_host_creds(self) -> MlflowHostCreds:
        server, _, _ = self.artifact_uri.partition("/api/2.0" + _ARTIFACTS_ENDPOINT)
        return self.credentials.for_host(server.rstrip("/"))

    def _is_multipart_upload_enabled(self) -> bool:
        return False

    def _is_multipart_download_enabled(self) -> bool:
        return False

    def list_artifacts(self, path: str | None = None) -> list[FileInfo]:
        url, tail = self.artifact_uri.split(_ARTIFACTS_ENDPOINT, maxsplit=1)
        root = tail.lstrip("/")
        params = {"path": posixpath.join(root, path) if path else root}
        response = http_request(self.credentials.for_host(url), _ARTIFACTS_ENDPOINT, "GET", params=params)
        augmented_raise_for_status(response)
        infos = []
        for entry in response.json().get("files", []):
            name = validate_path_is_safe(entry["path"])
            size = int(entry["file_size"]) if "file_size" in entry else None
            infos.append(FileInfo(posixpath.join(path, name) if path else name, entry["is_dir"], size))
        # As MLflow's: a path that names one file lists nothing.
        one_file = len(infos) == 1 and not infos[0].is_dir and path is not None
        if one_file and infos[0].path == posixpath.join(path, os.path.basename(path)):
            return []
        return sorted(infos, key=lambda info: info.path)
