"""sparktune_airflow.core.spark_submit: the Spark provider's submit operator, without the OpenLineage listener
at import, and with the provider's OpenLineage helpers still the real ones when a task calls them.

Each check runs in a fresh interpreter: in this test session another module may have imported the
provider first, and then there is nothing to defer.
"""

from __future__ import annotations

import json
import subprocess
import sys
from textwrap import dedent

LISTENER = "airflow.providers.openlineage.plugins.listener"


def _run(code: str) -> object:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_importing_the_operators_loads_no_openlineage_listener_or_databricks_hook():
    loaded = _run(
        "import json, sys\n"
        "import sparktune_airflow\n"
        "watched = ['airflow.providers.openlineage.plugins.listener', 'airflow.models.taskinstance',\n"
        "           'openlineage.client', 'airflow.providers.databricks.hooks.databricks', 'aiohttp']\n"
        "print(json.dumps([m for m in watched if m in sys.modules]))\n"
    )
    assert loaded == []


def test_the_provider_calls_the_real_openlineage_helpers():
    outcome = _run(
        dedent(f"""
        import json, sys
        from sparktune_airflow.core import spark_submit
        provider = sys.modules[spark_submit.PROVIDER_MODULE]
        same_class = spark_submit.SparkSubmitOperator is provider.SparkSubmitOperator
        listener_before = {LISTENER!r} in sys.modules
        import airflow.providers.common.compat.openlineage.utils.spark as compat
        calls = []
        for name in spark_submit.DEFERRED_HELPERS:
            fake = lambda props, context, name=name: calls.append(name) or {{**props, name: 1}}
            setattr(compat, name, fake)
        parent = provider.inject_parent_job_information_into_spark_properties({{"a": "b"}}, {{}})
        transport = provider.inject_transport_information_into_spark_properties({{}}, {{}})
        print(json.dumps({{
            "same_class": same_class, "listener_before": listener_before,
            "compat_is_real": hasattr(compat, "__file__"), "calls": calls,
            "parent": parent, "transport": transport,
        }}))
        """)
    )
    parent, transport = (
        "inject_parent_job_information_into_spark_properties",
        "inject_transport_information_into_spark_properties",
    )
    assert outcome == {
        "same_class": True,
        "listener_before": False,
        "compat_is_real": True,
        "calls": [parent, transport],
        "parent": {"a": "b", parent: 1},
        "transport": {transport: 1},
    }


def test_an_operator_module_imported_first_is_left_as_it_is():
    outcome = _run(
        dedent("""
        import json, sys
        import airflow.providers.apache.spark.operators.spark_submit as provider
        real = provider.inject_parent_job_information_into_spark_properties
        from sparktune_airflow.core import spark_submit
        print(json.dumps({
            "untouched": provider.inject_parent_job_information_into_spark_properties is real,
            "same_class": spark_submit.SparkSubmitOperator is provider.SparkSubmitOperator,
        }))
        """)
    )
    assert outcome == {"untouched": True, "same_class": True}
