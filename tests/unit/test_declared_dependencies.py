"""Every distribution the shipped code imports is declared in pyproject.toml.

``pip install .`` installs what ``[project] dependencies`` lists and nothing else: a module the
shipped packages (``include/``) or the DAG files import that only arrives as some other package's
dependency works until that package drops it. Reads the imports with ``ast`` (every ``import``, at
any depth, lazy ones inside functions included) and maps each top-level module to the distributions
that install it with ``importlib.metadata``.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = (ROOT / "include" / "sparktune", ROOT / "include" / "sparktune_airflow", ROOT / "dags")
FIRST_PARTY = {"sparktune", "sparktune_airflow"}
# Modules that only a deployment with an optional extra loads, by that extra: they may import what
# it declares (``pip install .[stack]``), and nothing else imports them.
EXTRA_ONLY = {"include/sparktune_airflow/core/celery_worker.py": "stack"}


def _declared(extra: str | None = None) -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    if extra:
        requirements += project["optional-dependencies"][extra]
    return {canonicalize_name(Requirement(r).name) for r in requirements}


def _imports(path: Path) -> set[str]:
    """Dotted names ``path`` imports absolutely (``from . import x`` is first party)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def _local_modules(folder: Path) -> set[str]:
    """Modules a DAG folder imports from itself (Airflow puts the folder on sys.path)."""
    return {p.stem for p in folder.glob("*.py")} | {p.name for p in folder.iterdir() if p.is_dir()}


def _distributions_of(module: str, installed: dict[str, list[str]]) -> set[str]:
    parts = module.split(".")
    if parts[:2] == ["airflow", "providers"] and len(parts) > 2:
        # One top-level package, many distributions: a provider is the one named after its path.
        for depth in range(len(parts), 2, -1):
            candidate = canonicalize_name("apache-airflow-providers-" + "-".join(parts[2:depth]))
            if any(canonicalize_name(d) == candidate for d in installed.get("airflow", [])):
                return {candidate}
    return {canonicalize_name(d) for d in installed.get(parts[0], [])}


def test_every_distribution_the_shipped_code_imports_is_declared():
    installed = metadata.packages_distributions()
    undeclared: dict[str, set[str]] = {}
    for folder in SHIPPED:
        local = FIRST_PARTY | (_local_modules(folder) if folder.name == "dags" else set())
        for path in sorted(folder.rglob("*.py")):
            declared = _declared(EXTRA_ONLY.get(str(path.relative_to(ROOT))))
            for module in _imports(path):
                top = module.split(".")[0]
                if top in local or top in sys.stdlib_module_names or top == "__future__":
                    continue
                found = _distributions_of(module, installed)
                if not found:
                    undeclared.setdefault(f"{module} (installed by no distribution)", set()).add(
                        str(path.relative_to(ROOT))
                    )
                elif not found & declared:
                    key = f"{module} (from {', '.join(sorted(found))})"
                    undeclared.setdefault(key, set()).add(str(path.relative_to(ROOT)))
    assert not undeclared, (
        "imported by the shipped code but not in pyproject.toml's [project] dependencies; add the "
        "distribution there (with the range the code needs):\n"
        + "\n".join(f"  {module}: {', '.join(sorted(files))}" for module, files in sorted(undeclared.items()))
    )


def test_a_module_of_an_extra_is_imported_by_no_other_shipped_module():
    for relative in EXTRA_ONLY:
        dotted = relative.removeprefix("include/").removesuffix(".py").replace("/", ".")
        importers = [
            str(path.relative_to(ROOT))
            for folder in SHIPPED
            for path in folder.rglob("*.py")
            if any(name == dotted or name.startswith(dotted + ".") for name in _imports(path))
        ]
        assert not importers, f"{dotted} needs an optional extra; {importers} would need it too"
