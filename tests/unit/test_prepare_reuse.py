"""The key under which prepare_data's output is found again without Spark (sparktune.data.prepare_reuse)."""

from __future__ import annotations

import os

from sparktune.core.params import parse_params
from sparktune.data.fingerprint import source_signature
from sparktune.data.prepare_reuse import find_prepared, inputs_key, record_prepared


def _tokenizer(folder):
    folder.mkdir()
    (folder / "tokenizer.json").write_text('{"model": "a"}')
    return str(folder)


def test_the_key_follows_the_files_the_preparation_params_and_the_tokenizer(tmp_path):
    source = tmp_path / "tickets.jsonl"
    source.write_text('{"message": "hi", "intent_label": "a"}\n')
    tokenizer = _tokenizer(tmp_path / "tok")
    params = parse_params({"source_uri": str(source)})

    def key_of(prepared_with):  # the source listed anew each time, as each run lists it
        return inputs_key(source_signature(str(source)), prepared_with, tokenizer)

    key = key_of(params)
    assert key and key == key_of(params)
    # Training params do not change the prepared rows.
    assert key_of(params.model_copy(update=dict(learning_rate=1e-5, lora_r=4))) == key
    assert key_of(params.model_copy(update=dict(min_chars=3))) != key
    assert key_of(params.model_copy(update=dict(source_format="json"))) != key
    (tmp_path / "tok" / "tokenizer.json").write_text('{"model": "b"}')
    assert key_of(params) != key
    (tmp_path / "tok" / "tokenizer.json").write_text('{"model": "a"}')
    stat = source.stat()
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # rewritten in place
    assert key_of(params) != key
    # A catalog table has no listing to sign: always prepared by Spark.
    assert source_signature("sales.tickets") is None
    assert inputs_key(None, params.model_copy(update=dict(source_uri="sales.tickets")), tokenizer) is None


def test_a_recorded_summary_is_found_while_its_folders_are_complete(tmp_path):
    lake = str(tmp_path / "lake")
    prepared, quarantine = tmp_path / "lake" / "prepared" / "f1", tmp_path / "lake" / "quarantine" / "f1"
    summary = {"data_fingerprint": "f1", "prepared_uri": str(prepared), "quarantine_uri": str(quarantine)}
    assert find_prepared(lake, "k") is None
    record_prepared(lake, "k", summary)
    assert find_prepared(lake, "k") is None  # the folders are not there
    for folder in (prepared, quarantine):
        folder.mkdir(parents=True)
        (folder / "_SUCCESS").write_text("")
    assert find_prepared(lake, "k") == summary
    assert find_prepared(lake, "other") is None
    (prepared / "_SUCCESS").unlink()  # a crashed rewrite, or a clean-up of the lake
    assert find_prepared(lake, "k") is None
    (prepared / "_SUCCESS").write_text("")
    (tmp_path / "lake" / "prepare_index" / "k.json").write_text("{not json")
    assert find_prepared(lake, "k") is None


def test_the_record_keeps_the_quality_report_for_the_same_rules_only():
    from sparktune.data.prepare_reuse import QUALITY_RULES_KEY, recorded_summary, reused_summary

    report = {"success": False, "evaluated": 26}
    params = parse_params({})
    job = {"data_fingerprint": "f0", "quality": report}
    recorded = recorded_summary(job, params)
    assert recorded["quality"] == report and recorded[QUALITY_RULES_KEY]
    summary, kept = reused_summary(recorded, parse_params({"learning_rate": 1e-5}))
    assert kept == report and summary == {"data_fingerprint": "f0"}
    assert reused_summary(recorded, parse_params({"min_train_rows": 5000})) == (summary, None)
    # A gate that could not run leaves nothing to reuse.
    failed = recorded_summary({"data_fingerprint": "f0", "quality_error": "boom"}, params)
    assert failed == {"data_fingerprint": "f0"} and reused_summary(failed, params) == (failed, None)
