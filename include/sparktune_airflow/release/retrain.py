"""``SkipUnchangedOperator``: skips a run that would train the current champion again (the same
data, config and code), a thin shell over ``sparktune.release.retrain``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk.exceptions import AirflowFailException
from sparktune_airflow.core.links import MLflowModelVersionLink
from sparktune_airflow.core.mlflow import UsesMLflowConnection
from sparktune_airflow.core.short_circuit import DecidingShortCircuit
from sparktune_airflow.core.task_context import templated_bool


class SkipUnchangedOperator(UsesMLflowConnection, DecidingShortCircuit):
    """Skips everything downstream when the run would train the current champion again.

    Compares the run's data, config hash and code fingerprint with the champion version's tags;
    when all three match (and ``force_retrain`` is off) the downstream tasks are skipped and the
    reason is logged and returned. Otherwise it returns what changed and the run goes on. The data
    is the prepared rows' content fingerprint (``data_fingerprint``, after ``PrepareDataOperator``)
    or, before any Spark job, the source files' signature (``source_uri``: each file's path, size
    and modification time, see ``sparktune.data.fingerprint.source_signature``), returned as
    ``source_signature`` for the register step to tag the version with.

    :param model_name: the registered model whose champion is compared.
    :param data_fingerprint: (templated) the run's prepared data fingerprint.
    :param source_uri: (templated) the source to sign, when there is no fingerprint yet; a catalog
        table cannot be signed without Spark, and the run goes on.
    :param config_hash: (templated) the hash of what the run trains with
        (``ValidateParamsOperator``'s ``config_hash``, ``sparktune.core.params.config_hash``).
    :param force_retrain: (templated) train even when nothing changed.
    """

    template_fields: Sequence[str] = (
        *DecidingShortCircuit.template_fields,
        "model_name",
        "data_fingerprint",
        "source_uri",
        "config_hash",
        "force_retrain",
    )
    # The champion version the run was compared with: what a skipped run would have trained again.
    operator_extra_links = (MLflowModelVersionLink(),)

    def __init__(
        self,
        *,
        model_name: str,
        data_fingerprint: str | None = None,
        source_uri: str | None = None,
        config_hash: str,
        force_retrain: bool = False,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("multiple_outputs", True)  # source_signature is read by the register task
        super().__init__(**kwargs)
        self.model_name = model_name
        self.data_fingerprint = data_fingerprint
        self.source_uri = source_uri
        self.config_hash = config_hash
        self.force_retrain = force_retrain

    def decide(self, ti: Any = None) -> dict[str, Any] | bool:
        """What changed (the run goes on), or False after pushing why nothing did (the rest is skipped)."""
        from sparktune.core.provenance import code_fingerprint
        from sparktune.data.fingerprint import source_signature
        from sparktune.release.registry import CHAMPION, alias_version
        from sparktune.release.retrain import retrain_decision

        fingerprint = str(self.data_fingerprint or "").strip() or None
        signature = None
        if fingerprint is None:
            if not str(self.source_uri or "").strip():
                raise AirflowFailException("skip_unchanged needs data_fingerprint or source_uri; got neither")
            signature = source_signature(str(self.source_uri))
        client = self.mlflow_hook.get_conn()
        champion = alias_version(client, str(self.model_name), CHAMPION)
        tags = dict(client.get_model_version(str(self.model_name), champion).tags) if champion else {}
        decision = retrain_decision(
            champion_version=champion,
            champion_tags=tags,
            data_fingerprint=fingerprint,
            source_signature=signature,
            config_hash=str(self.config_hash),
            code_fingerprint=code_fingerprint(),
            force=templated_bool(self.force_retrain),
        )
        self.log.info("%s: %s", "training" if decision.train else "skipping training", decision.reason)
        summary = {**decision.to_summary(), "model_name": str(self.model_name), "version": champion}
        if fingerprint is None:
            summary["source_signature"] = signature
        return summary if decision.train else self.stop(ti, summary)
