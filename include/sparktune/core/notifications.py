"""What the team is told when a run needs them: a failed task, an approval waiting, a promotion, a
rollback, an overdue run, a champion moved outside the pipeline, drift in what the champion scores.

Plain values in, one :class:`Notification` out; how it travels (e-mail, a webhook) is the Airflow
package's business (``sparktune_airflow.core.notify``). Each message says what happened, where (DAG,
run, task) and links to the run; a failure also gives the error's first line and, where the error
names one, its fix.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from urllib.parse import quote

TASK_FAILED = "task_failed"
APPROVAL_WAITING = "approval_waiting"
PROMOTED = "promoted"
ROLLED_BACK = "rolled_back"
RUN_OVERDUE = "run_overdue"
CHAMPION_MOVED_OUTSIDE = "champion_moved_outside_pipeline"
DRIFT_DETECTED = "drift_detected"
EVENTS = (
    TASK_FAILED,
    APPROVAL_WAITING,
    PROMOTED,
    ROLLED_BACK,
    RUN_OVERDUE,
    CHAMPION_MOVED_OUTSIDE,
    DRIFT_DETECTED,
)

# Our errors say the cause in their first sentence and the fix in the sentences after it
# ("... is not defined. Create it (type databricks, ...)."); a sentence ends at ". " or "; ".
_SENTENCE_END = re.compile(r"(?<=[.;])\s+(?=[A-Za-z`'\"(])")
# "ValueError: ..." and "airflow.sdk.exceptions.AirflowFailException: ...": the class says nothing
# a reader needs when the message is there.
_EXCEPTION_PREFIX = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Timeout|Exit)\s*:\s*")


@dataclass(frozen=True)
class Notification:
    event: str
    subject: str
    summary: str
    dag_id: str
    run_id: str | None = None
    task_id: str | None = None
    url: str | None = None
    error: str | None = None
    fix: str | None = None
    details: dict[str, str] = field(default_factory=dict)

    def text(self) -> str:
        """The plain-text body: what happened, where, the error and its fix, the details, the link."""
        lines = [self.summary, ""]
        lines.append(f"DAG: {self.dag_id}")
        if self.run_id:
            lines.append(f"Run: {self.run_id}")
        if self.task_id:
            lines.append(f"Task: {self.task_id}")
        if self.error:
            lines.append(f"Error: {self.error}")
        if self.fix:
            lines.append(f"Fix: {self.fix}")
        lines.extend(f"{key}: {value}" for key, value in self.details.items())
        if self.url:
            lines.extend(["", f"Open the run: {self.url}"])
        return "\n".join(lines) + "\n"

    def payload(self) -> dict:
        """The webhook's JSON body: every field, plus ``text`` for chat tools that show one string."""
        return {**asdict(self), "text": self.text()}


def run_url(base_url: str, dag_id: str, run_id: str, task_id: str | None = None) -> str:
    """The Airflow 3 UI page of a DAG run (or of one of its tasks) under ``base_url``."""
    url = f"{base_url.rstrip('/')}/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"
    return f"{url}/tasks/{quote(task_id, safe='')}" if task_id else url


def split_error(message: str) -> tuple[str, str | None]:
    """An exception's first line without its class name, as cause and fix: the first sentence, and
    the sentences after it (None when there are none)."""
    first_line = next((line.strip() for line in message.splitlines() if line.strip()), "")
    first_line = _EXCEPTION_PREFIX.sub("", first_line) or "(no message)"
    sentences = _SENTENCE_END.split(first_line, maxsplit=1)
    if len(sentences) == 1:
        return first_line, None
    return sentences[0], sentences[1]


def task_failed(
    *, dag_id: str, run_id: str, task_id: str, try_number: int, error: str, url: str | None
) -> Notification:
    cause, fix = split_error(error)
    return Notification(
        event=TASK_FAILED,
        subject=f"[sparktune] {dag_id}: {task_id} failed",
        summary=f"Task {task_id} of {dag_id} failed on try {try_number}, with no retry left.",
        dag_id=dag_id,
        run_id=run_id,
        task_id=task_id,
        url=url,
        error=cause,
        fix=fix,
    )


def approval_waiting(
    *,
    dag_id: str,
    run_id: str,
    task_id: str,
    model_name: str,
    version: str,
    url: str | None,
    approvers: list[str],
    deadline: str | None,
    gate_passed: bool = True,
) -> Notification:
    details = {"Approvers": ", ".join(approvers) if approvers else "any user allowed to approve"}
    verdict = (
        "passed its gate and smoke test"
        if gate_passed
        else "FAILED its gate (a dry run lets it through) and passed its smoke test"
    )
    if deadline:
        details["Answer by"] = deadline
    return Notification(
        event=APPROVAL_WAITING,
        subject=f"[sparktune] approve {model_name} v{version} as champion?",
        summary=f"{model_name} v{version} {verdict} and waits for a person to approve or reject it as "
        "champion.",
        dag_id=dag_id,
        run_id=run_id,
        task_id=task_id,
        url=url,
        details=details,
    )


def alias_moved(
    *, dag_id: str, run_id: str, task_id: str, move: Mapping[str, object], url: str | None
) -> Notification:
    """A promotion or a rollback, from the :class:`~sparktune.release.registry.AliasMove` summary."""
    model, alias, to_version = move["model_name"], move["alias"], move["to_version"]
    from_version = move.get("from_version")
    rollback = move.get("kind") == "rollback"
    event = ROLLED_BACK if rollback else PROMOTED
    verb = "rolled back" if rollback else "promoted"
    was = f" (was v{from_version})" if from_version else " (there was none)"
    details = {"Actor": str(move.get("actor") or ""), "Reason": str(move.get("reason") or "")}
    return Notification(
        event=event,
        subject=f"[sparktune] {model} {alias} {verb} to v{to_version}",
        summary=f"{model} @{alias} is now v{to_version}{was}: {verb}.",
        dag_id=dag_id,
        run_id=run_id,
        task_id=task_id,
        url=url,
        details={key: value for key, value in details.items() if value},
    )


def run_overdue(*, dag_id: str, run_id: str, deadline: str, state: str, url: str | None) -> Notification:
    return Notification(
        event=RUN_OVERDUE,
        subject=f"[sparktune] {dag_id} run is past its deadline",
        summary=f"Run {run_id} of {dag_id} was not done by its deadline ({deadline}); it is {state}.",
        dag_id=dag_id,
        run_id=run_id,
        url=url,
        fix="Look at its running task's log; clear or mark it failed if it is stuck.",
    )


def champion_moved_outside(
    *, dag_id: str, run_id: str | None, model_name: str, version: str, expected: str | None, url: str | None
) -> Notification:
    expected_text = f"v{expected}" if expected else "no champion"
    return Notification(
        event=CHAMPION_MOVED_OUTSIDE,
        subject=f"[sparktune] {model_name} champion moved outside the pipeline",
        summary=f"{model_name} @champion is v{version}, but the audit trail's last move leaves "
        f"{expected_text}: someone set the alias by hand.",
        dag_id=dag_id,
        run_id=run_id,
        url=url,
        fix="If it was meant, record it with the rollback_champion DAG (to_version, reason); "
        "otherwise move the alias back the same way.",
    )


def drift_detected(
    *,
    dag_id: str,
    run_id: str | None,
    model_name: str,
    version: str,
    message: str,
    report_uri: str | None,
    review_csv_uri: str | None,
    url: str | None,
) -> Notification:
    details = {"Report": report_uri or "", "Texts to label": review_csv_uri or ""}
    return Notification(
        event=DRIFT_DETECTED,
        subject=f"[sparktune] drift in what {model_name} v{version} scores",
        summary=message,
        dag_id=dag_id,
        run_id=run_id,
        url=url,
        fix="Read the report; label the queued texts and record them with the record_corrections DAG, "
        "so the next llm_finetune run trains on them. Nothing retrains on unlabelled traffic by itself.",
        details={key: value for key, value in details.items() if value},
    )
