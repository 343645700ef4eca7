"""A new, empty MLflow tracking store (SQLite) for a test, as MLflow creates one at its first call.

Creating the schema (MLflow's Alembic migrations) costs 3-6 s of CPU per store on 2 busy cores, and
the fast suite made some 30 stores; a copy of a store created once per process costs 0.1 s and is
the same file. Creating a store at first use stays proven by every DAG run's first MLflow call
(tests/e2e, tests/stack) and by the session's own store (tests/conftest.py).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

_template: Path | None = None


def new_store(path: Path) -> str:
    """Make ``path`` an empty MLflow store (its tables and default experiment); its ``sqlite:///`` URI."""
    global _template
    if _template is None:
        from mlflow.tracking import MlflowClient

        template = Path(tempfile.mkdtemp(prefix="sparktune-mlflow-template-")) / "mlflow.db"
        MlflowClient(f"sqlite:///{template}").search_experiments(max_results=1)  # creates the tables
        _template = template
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_template, path)
    return f"sqlite:///{path}"
