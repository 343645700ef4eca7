"""PrepareDataOperator starts no Spark job when the lake holds its output for the same inputs.

spark-submit is replaced by a recorder that publishes what a job would (the summary, the two
folders with their _SUCCESS); the e2e failure paths (tests/e2e/test_llm_finetune_failures.py) show
the shortcut on real jobs.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
from sparktune_airflow import PrepareDataOperator
from sparktune_airflow.data import prepare


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKTUNE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SPARKTUNE_LAKE_URI", raising=False)
    return tmp_path


@pytest.fixture
def submits(home, monkeypatch):
    calls: list[str] = []

    def publish(operator, context, summary_path, job):
        fingerprint = f"f{len(calls)}"
        calls.append(fingerprint)
        folders = {}
        for kind in ("prepared", "quarantine"):
            folder = home / "home" / "lake" / kind / fingerprint
            folder.mkdir(parents=True)
            (folder / "_SUCCESS").write_text("")
            folders[f"{kind}_uri"] = str(folder)
        return {"steps": [], "data_fingerprint": fingerprint, "reused": False, "tokenizer": "t", **folders}

    monkeypatch.setattr(prepare, "submit_and_read_summary", publish)
    return calls


def _data_sections(flat: dict) -> dict:
    from sparktune.core.params import by_section

    sections = by_section(flat)
    return {key: sections[key] for key in ("source", "preparation", "quality")}


def _run(source, tokenizer, try_number=1, **params):
    ti = SimpleNamespace(dag_id="llm_finetune", run_id=f"manual__{try_number}", task_id="prepare_data",
                         try_number=try_number)  # fmt: skip
    run_params = {"source_uri": str(source), **params}
    operator = PrepareDataOperator(
        task_id="prepare_data", tokenizer=str(tokenizer), **_data_sections(run_params)
    )
    return operator.execute({"params": run_params, "ti": ti})


def test_a_run_on_the_same_inputs_takes_the_published_output_without_spark(home, submits, capsys):
    source = home / "tickets.jsonl"
    source.write_text('{"message": "hi", "intent_label": "a"}\n')
    tokenizer = home / "tok"
    tokenizer.mkdir()
    (tokenizer / "tokenizer.json").write_text("{}")

    first = _run(source, tokenizer)
    assert submits == ["f0"] and first["reused"] is False
    # Another learning rate on the same data: the same prepared rows, no Spark job.
    again = _run(source, tokenizer, try_number=2, learning_rate=1e-5)
    assert submits == ["f0"]
    assert again["data_fingerprint"] == "f0" and again["prepared_uri"] == first["prepared_uri"]
    assert again["reused"] is True and again["tokenizer"] == str(tokenizer)
    assert "no Spark job" in capsys.readouterr().out
    # A changed preparation param, or the same file rewritten, goes to Spark again.
    _run(source, tokenizer, try_number=3, min_chars=3)
    assert submits == ["f0", "f1"]
    stat = source.stat()
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    _run(source, tokenizer, try_number=4)
    assert submits == ["f0", "f1", "f2"]
    # Published data that is gone is prepared again.
    (home / "home" / "lake" / "prepared" / "f2" / "_SUCCESS").unlink()
    _run(source, tokenizer, try_number=5)
    assert submits == ["f0", "f1", "f2", "f3"]


def test_a_reused_version_keeps_its_quality_report_only_under_the_same_rules(home, monkeypatch):
    """validate_quality asks the job for the gate under this run's id. The lake records the report
    with the key of the rules it checked: a run on the same inputs under the same rules takes it (the
    same data checked the same way), one with another threshold gets none and validate_data
    validates again."""
    seen: list[list[str]] = []
    report = {"success": True, "evaluated": 26, "data_docs_uri": "file:///gx/run1.html"}

    def publish(operator, context, summary_path, job):
        seen.append(list(operator.application_args))
        for kind in ("prepared", "quarantine"):
            folder = home / "home" / "lake" / kind / "f0"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "_SUCCESS").write_text("")
        return {"steps": [], "data_fingerprint": "f0", "reused": False, "tokenizer": "t",
                "prepared_uri": str(home / "home" / "lake" / "prepared" / "f0"),
                "quarantine_uri": str(home / "home" / "lake" / "quarantine" / "f0"),
                "quality": report}  # fmt: skip

    monkeypatch.setattr(prepare, "submit_and_read_summary", publish)
    source = home / "tickets.jsonl"
    source.write_text('{"message": "hi", "intent_label": "a"}\n')
    (home / "tok").mkdir()
    (home / "tok" / "tokenizer.json").write_text("{}")

    def run(try_number, **params):
        ti = SimpleNamespace(dag_id="llm_finetune", run_id=f"manual__{try_number}", task_id="prepare_data",
                             try_number=try_number)  # fmt: skip
        run_params = {"source_uri": str(source), **params}
        operator = PrepareDataOperator(
            task_id="prepare_data",
            tokenizer=str(home / "tok"),
            validate_quality=True,
            gx_root="/gx",
            **_data_sections(run_params),
        )
        context = {"params": run_params, "ti": ti, "run_id": ti.run_id}
        return operator.execute(context)

    first = run(1)
    # Another learning rate: the same rules. A gate threshold changed: other rules.
    same_rules, other_rules = run(2, learning_rate=1e-5), run(3, min_train_rows=5000)
    (args,) = seen  # the later runs reused the published data: one job
    assert args[args.index("--gx-root") + 1] == "/gx"
    assert args[args.index("--quality-run-id") + 1] == "manual__1"
    assert first["quality"] == report
    assert same_rules["reused"] is True and same_rules["quality"] == report
    assert other_rules["reused"] is True and "quality" not in other_rules
    assert "quality_rules_key" not in same_rules
