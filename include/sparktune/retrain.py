"""Whether a scheduled or data-triggered run needs to train at all.

A run whose data fingerprint, training config and code are all the current champion's would
train the same model again: it is skipped, and the reason names the champion version and the
three values. The champion's registered version carries them as tags (``data_fingerprint``,
``config_hash``, ``code_fingerprint``: a hash of the ``sparktune`` sources, so a docs-only commit
does not count as new code; the register step writes them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

DATA_FINGERPRINT_TAG = "data_fingerprint"
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
    data_fingerprint: str,
    config_hash: str,
    code_fingerprint: str,
    force: bool = False,
) -> RetrainDecision:
    """Train unless the champion was trained on the same data, config and code (or ``force``)."""
    if force:
        return RetrainDecision(
            True, "force_retrain is set: training whatever the champion is", champion_version
        )
    if champion_version is None:
        return RetrainDecision(True, "there is no champion yet", None)
    current = {
        DATA_FINGERPRINT_TAG: data_fingerprint,
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
        f"nothing changed since champion v{champion_version}: same data fingerprint {data_fingerprint}, "
        f"config {config_hash} and code {code_fingerprint}. Training skipped; set force_retrain=true to "
        "train anyway.",
        champion_version,
    )
