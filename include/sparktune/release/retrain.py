"""Whether a scheduled or data-triggered run needs to train at all.

A run whose data, training config and code are all the current champion's would train the same
model again: it is skipped, and the reason names the champion version and the three values. The
data is compared twice: by the source files' signature before any Spark job (seconds), then by
the prepared rows' content fingerprint (a source rewritten with the same rows). The champion's
registered version carries them as tags (``source_signature``, ``data_fingerprint``,
``config_hash``, ``code_fingerprint``: a hash of the ``sparktune`` sources, so a docs-only commit
does not count as new code; the register step writes them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

DATA_FINGERPRINT_TAG = "data_fingerprint"
# The source files' listing (sparktune.data.fingerprint.source_signature): compared before any Spark job.
SOURCE_SIGNATURE_TAG = "source_signature"
CONFIG_HASH_TAG = "config_hash"
CODE_FINGERPRINT_TAG = "code_fingerprint"


@dataclass(frozen=True)
class RetrainDecision:
    train: bool
    reason: str
    champion_version: str | None

    def to_summary(self) -> dict[str, Any]:
        return asdict(self)


def retrain_decision(
    *,
    champion_version: str | None,
    champion_tags: Mapping[str, str],
    config_hash: str,
    code_fingerprint: str,
    data_fingerprint: str | None = None,
    source_signature: str | None = None,
    force: bool = False,
) -> RetrainDecision:
    """Train unless the champion was trained on the same data, config and code (or ``force``).

    The data is compared by its content fingerprint (after prepare_data) or, before any Spark job,
    by the source files' signature; exactly one of the two is given. A source whose signature is
    unknown (``source_signature`` of None with no fingerprint: a catalog table) trains on to
    prepare_data, where the content fingerprint decides.
    """
    if force:
        return RetrainDecision(
            True, "force_retrain is set: training whatever the champion is", champion_version
        )
    if data_fingerprint is None and source_signature is None:
        return RetrainDecision(
            True,
            "the source's files cannot be listed (a catalog table?): prepare_data runs and its content "
            "fingerprint decides",
            champion_version,
        )
    data_tag, data_value, data_name = (
        (DATA_FINGERPRINT_TAG, data_fingerprint, "data fingerprint")
        if data_fingerprint is not None
        else (SOURCE_SIGNATURE_TAG, source_signature, "source files")
    )
    if champion_version is None:
        return RetrainDecision(True, "there is no champion yet", None)
    current = {
        data_tag: data_value,
        CONFIG_HASH_TAG: config_hash,
        CODE_FINGERPRINT_TAG: code_fingerprint,
    }
    changed = [
        f"{name} {champion_tags.get(name) or '(not recorded)'} -> {value}"
        for name, value in current.items()
        if champion_tags.get(name) != value
    ]
    if changed:
        return RetrainDecision(
            True, f"changed since champion v{champion_version}: " + "; ".join(changed), champion_version
        )
    return RetrainDecision(
        False,
        f"nothing changed since champion v{champion_version}: same {data_name} {data_value}, "
        f"config {config_hash} and code {code_fingerprint}. Training skipped; set force_retrain=true to "
        "train anyway.",
        champion_version,
    )
