"""What every sparktune DAG shares: retries with exponential backoff on every task."""

from __future__ import annotations

from datetime import timedelta

# Transient faults (a lost executor, a busy MLflow server) get two more tries; deterministic
# failures raise AirflowFailException and skip them.
RETRY_DEFAULTS = {
    "retries": 2,
    "retry_delay": timedelta(seconds=30),
    "retry_exponential_backoff": True,
    "max_retry_delay": timedelta(minutes=10),
}
