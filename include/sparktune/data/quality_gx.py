"""Great Expectations plumbing of the data-quality gate: the file context under ``gx_root``, one
checkpoint per validated batch (suite, validation definition), one Data Docs build for all of a
gate's results, and the Data Docs pages of its results.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparktune.data.quality_report import EXAMPLES_PER_FAILURE
from sparktune.data.quality_rules import LABEL_COUNTS, ROWS, QualityRule

if TYPE_CHECKING:
    from great_expectations import Checkpoint
    from great_expectations.core.batch_definition import BatchDefinition
    from great_expectations.core.expectation_validation_result import ExpectationSuiteValidationResult
    from great_expectations.core.run_identifier import RunIdentifier
    from great_expectations.data_context import AbstractDataContext
    from pandas import DataFrame as PandasFrame
    from pyspark.sql import DataFrame

DATASOURCE_NAME = "sparktune_spark"
# Batches already in the driver's memory (the per-label counts, a few rows) are validated by pandas:
# on Spark each of their expectations ran as its own small jobs, 27 jobs for a table of a few labels.
PANDAS_DATASOURCE_NAME = "sparktune_pandas"
DATA_DOCS_SITE = "local_site"
# Latest validation results listed in the Data Docs index (three per pipeline run).
DATA_DOCS_RESULTS_LIMIT = 300
# Index columns GX reports beside each unexpected value, so a failure names the offending rows.
_INDEX_COLUMNS = {ROWS: ["example_id", "split"], LABEL_COUNTS: ["label"]}


def run_identifier(run_id: str | None) -> RunIdentifier:
    """GX's id of this validation run: ``run_id`` made safe for paths, and the time now."""
    from great_expectations.core.run_identifier import RunIdentifier

    return RunIdentifier(run_name=_safe_name(run_id) if run_id else None, run_time=datetime.now(UTC))


def run_folder(identifier: RunIdentifier) -> str:
    """The folder name of a run's results (GX's own for a run without a name)."""
    return identifier.run_name or "__none__"


def _safe_name(run_id: str) -> str:
    # Airflow run ids carry ':' and '+', which end up in file paths and file:// URIs.
    return re.sub(r"[^A-Za-z0-9._-]+", "_", run_id)


def gx_context(gx_root: Path) -> AbstractDataContext:
    """The file-backed GX project under ``gx_root`` (created on first use), without progress bars and
    with a Data Docs index of bounded length."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    gx_root.mkdir(parents=True, exist_ok=True)
    context = gx.get_context(mode="file", project_root_dir=gx_root)
    bars = context.variables.progress_bars
    # Read back from the YAML file it is a dict, freshly set a ProgressBarsConfig.
    if bars is not None and not isinstance(bars, Mapping):
        bars = {"globally": bars.globally, "metric_calculations": bars.metric_calculations}
    # tqdm bars fill Airflow task logs with carriage-return noise; switch them off once.
    if bars is None or bars.get("globally", True) or bars.get("metric_calculations", True):
        context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
        context.variables.save()
    # Unlimited, every Data Docs update re-reads every validation result ever stored: a run
    # would get slower each day. Keep the index (and section rebuilds) to the latest results.
    sites = copy.deepcopy(context.variables.data_docs_sites or {})
    index_builder = sites.get(DATA_DOCS_SITE, {}).get("site_index_builder")
    if index_builder is not None and index_builder.get("validation_results_limit") != DATA_DOCS_RESULTS_LIMIT:
        index_builder["validation_results_limit"] = DATA_DOCS_RESULTS_LIMIT
        context.variables.data_docs_sites = sites
        context.variables.save()
    return context


def data_docs_dir(context: AbstractDataContext) -> Path:
    """The folder of the local Data Docs site."""
    site = (context.variables.data_docs_sites or {}).get(DATA_DOCS_SITE, {})
    base = site.get("store_backend", {}).get("base_directory", f"uncommitted/data_docs/{DATA_DOCS_SITE}/")
    return Path(context.root_directory) / base


def _is_pandas(frame: Any) -> bool:
    return type(frame).__module__.startswith("pandas.")


def _batch_definition(context: AbstractDataContext, asset_name: str, *, pandas: bool) -> BatchDefinition:
    # Get-or-add each level: add_or_update on the data source would drop its assets and give
    # the batch definitions new ids, making the stored validation definitions stale.
    name = PANDAS_DATASOURCE_NAME if pandas else DATASOURCE_NAME
    try:
        source = context.data_sources.get(name)
    except KeyError:
        # persist=False: this module caches and unpersists the DataFrames itself.
        source = (
            context.data_sources.add_pandas(name)
            if pandas
            else context.data_sources.add_spark(name, persist=False)
        )
    try:
        asset = source.get_asset(asset_name)
    except LookupError:
        asset = source.add_dataframe_asset(asset_name)
    try:
        return asset.get_batch_definition("whole_dataframe")
    except KeyError:
        return asset.add_batch_definition_whole_dataframe("whole_dataframe")


def run_batch(
    context: AbstractDataContext,
    name: str,
    batch: str,
    rules: list[QualityRule],
    frame: DataFrame | PandasFrame,
    identifier: RunIdentifier,
) -> tuple[Any, ExpectationSuiteValidationResult]:
    """Validate one batch (a Spark or a pandas DataFrame); when the row table fails, validate it
    again with the offending rows named.

    Naming the offending rows (SUMMARY with index columns) costs extra Spark jobs per
    expectation even when it passes, so the common, passing run on the row table asks for
    observed values only (BASIC). The detailed rerun keeps the run id, so its result replaces
    the first one in the store and in Data Docs. The label counts table is tiny: it gets
    details at once. The raw input has no row key to name.
    """
    pandas = _is_pandas(frame)
    checkpoint = _checkpoint(
        context, name, f"{name}_checkpoint", batch, rules, detailed=batch == LABEL_COUNTS, pandas=pandas
    )
    key, result = _run(checkpoint, frame, identifier)
    if not result.success and batch == ROWS:
        checkpoint = _checkpoint(
            context, name, f"{name}_detailed_checkpoint", batch, rules, detailed=True, pandas=pandas
        )
        key, result = _run(checkpoint, frame, identifier)
    return key, result


def _run(
    checkpoint: Checkpoint, frame: DataFrame | PandasFrame, identifier: RunIdentifier
) -> tuple[Any, ExpectationSuiteValidationResult]:
    outcome = checkpoint.run(batch_parameters={"dataframe": frame}, run_id=identifier)
    ((key, result),) = outcome.run_results.items()
    return key, result


def _checkpoint(
    context: AbstractDataContext,
    name: str,
    checkpoint_name: str,
    batch: str,
    rules: list[QualityRule],
    *,
    detailed: bool,
    pandas: bool = False,
) -> Checkpoint:
    import great_expectations as gx

    suite = gx.ExpectationSuite(name=name, expectations=[rule.to_expectation() for rule in rules])
    data = _batch_definition(context, name, pandas=pandas)
    definition = gx.ValidationDefinition(name=name, data=data, suite=suite)
    # BASIC still shows observed values in Data Docs; BOOLEAN_ONLY would save about a Spark job
    # per expectation but leaves the passing run's page reading "unknown % not null".
    result_format: dict[str, Any] = {
        "result_format": "BASIC",
        "partial_unexpected_count": EXAMPLES_PER_FAILURE,
    }
    if detailed:
        result_format = {
            "result_format": "SUMMARY",
            "partial_unexpected_count": EXAMPLES_PER_FAILURE,
            "unexpected_index_column_names": _INDEX_COLUMNS[batch],
        }
    # No UpdateDataDocsAction: each would rebuild the index (up to DATA_DOCS_RESULTS_LIMIT results)
    # after its own batch; the gate builds Data Docs once for all its batches (update_data_docs).
    checkpoint = gx.Checkpoint(
        name=checkpoint_name, validation_definitions=[definition], actions=[], result_format=result_format
    )
    # Cascades: stores (or overwrites) the suite and validation definition by name too.
    return context.checkpoints.add_or_update(checkpoint)


def update_data_docs(context: AbstractDataContext, keys: list[Any]) -> None:
    """One Data Docs build for these validation results: their pages, their suites' pages and the
    index (what GX's ``UpdateDataDocsAction`` builds after each checkpoint, once for all of them)."""
    resources = [resource for key in keys for resource in (key, key.expectation_suite_identifier)]
    context.build_data_docs(site_names=[DATA_DOCS_SITE], resource_identifiers=resources, build_index=True)


def page_url(context: AbstractDataContext, key: Any) -> str:
    """The Data Docs page of the validation result ``key``, or the site's index when it has none."""
    urls = context.get_docs_sites_urls(resource_identifier=key, site_name=DATA_DOCS_SITE)
    if urls and urls[0].get("site_url"):
        return str(urls[0]["site_url"])
    index = context.get_docs_sites_urls(site_name=DATA_DOCS_SITE, only_if_exists=False)
    return str(index[0]["site_url"])
