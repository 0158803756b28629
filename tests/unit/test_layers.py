"""The layer rules and the absence of import cycles, read from the source (``ast``), not by importing.

``core`` imports neither Airflow nor Spark, nor any other part of the provider; the Airflow adapters
(hooks, operators, sensors, triggers, plugins) never import the spark-submit applications; those
import ``core``, the table formats' adapters (``tables``) and each other only; the adapters import
``core`` only, never Airflow; no module of the provider, of ``spark_apps/`` or of the MongoDB
simulator takes part in an import cycle. Imports inside functions count like the others: a cycle
hidden behind a deferred import is still a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "airflow_provider_mongocdc"
SPARK_APPS = f"{PACKAGE}.spark_apps"  # spark_apps/ ships as airflow_provider_mongocdc.spark_apps
ADAPTERS = tuple(f"{PACKAGE}.{layer}" for layer in ("hooks", "operators", "sensors", "triggers", "plugins"))


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[0] == "spark_apps":
        parts = [PACKAGE, *parts]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def source_modules() -> dict[str, Path]:
    paths = [
        *REPO.glob(f"{PACKAGE}/**/*.py"),
        *REPO.glob("spark_apps/**/*.py"),
        *REPO.glob("devtools/mongosim/**/*.py"),
    ]
    return {module_name(path): path for path in paths}


MODULES = source_modules()


def imports(name: str, path: Path) -> set[str]:
    """Every module ``name`` imports, anywhere in the file (``from pkg import sub`` names ``pkg.sub``
    when that is a module of the tree, else ``pkg``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, base] if base else package)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in MODULES else base)
    found.discard(name)
    return found


IMPORTS = {name: imports(name, path) for name, path in MODULES.items()}


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def violations(rule) -> list[str]:
    return sorted(
        f"{name} imports {target}" for name, targets in IMPORTS.items() for target in rule(name, targets)
    )


def test_the_tree_is_read():
    assert f"{PACKAGE}.core.gap.checker" in MODULES, sorted(MODULES)
    assert f"{SPARK_APPS}.snapshot" in MODULES, sorted(MODULES)
    assert "devtools.mongosim.server" in MODULES, sorted(MODULES)
    assert f"{PACKAGE}.core.config.connector" in IMPORTS[f"{PACKAGE}.core.gap.checker"]


def test_core_imports_neither_airflow_nor_spark_nor_the_adapters():
    def rule(name, targets):
        if not within(name, f"{PACKAGE}.core"):
            return []
        return [
            target
            for target in targets
            if target.split(".")[0] in ("airflow", "pyspark")
            or (within(target, PACKAGE) and not within(target, f"{PACKAGE}.core") and target != PACKAGE)
        ]

    found = violations(rule)
    assert not found, (
        "core must import neither Airflow nor pyspark nor another part of the provider (move the "
        "shared piece into core): " + "; ".join(found)
    )


def test_core_imports_no_table_library():
    """core/apply is the apply's logic; delta-rs, pyiceberg (and the Arrow tables they take) stay in
    the table formats' adapters (airflow_provider_mongocdc/tables/)."""

    def rule(name, targets):
        if not within(name, f"{PACKAGE}.core"):
            return []
        return [
            target
            for target in targets
            if target.split(".")[0] in ("deltalake", "pyarrow", "polars", "pyiceberg")
        ]

    found = violations(rule)
    assert not found, "core must not import delta-rs, pyiceberg or Arrow (use tables/): " + "; ".join(found)


def test_the_table_formats_adapters_import_only_core():
    def rule(name, targets):
        if not within(name, f"{PACKAGE}.tables"):
            return []
        return [
            target
            for target in targets
            if target.split(".")[0] == "airflow"
            or (
                within(target, PACKAGE)
                and target != PACKAGE
                and not within(target, f"{PACKAGE}.core")
                and not within(target, f"{PACKAGE}.tables")
            )
        ]

    found = violations(rule)
    assert not found, "tables/ must import only core (and each other), never Airflow: " + "; ".join(found)


def test_the_airflow_adapters_never_import_the_spark_applications():
    def rule(name, targets):
        if not any(within(name, layer) for layer in ADAPTERS):
            return []
        return [target for target in targets if within(target, SPARK_APPS) or within(target, "spark_apps")]

    found = violations(rule)
    assert not found, (
        "hooks, operators, sensors, triggers and plugins must not import spark_apps (move what they "
        "share into core): " + "; ".join(found)
    )


def test_the_spark_applications_import_only_core_and_each_other():
    def rule(name, targets):
        if not within(name, SPARK_APPS):
            return []
        return [
            target
            for target in targets
            if target.split(".")[0] == "airflow"
            or (
                within(target, PACKAGE)
                and target != PACKAGE
                and not within(target, f"{PACKAGE}.core")
                and not within(target, f"{PACKAGE}.tables")
                and not within(target, SPARK_APPS)
            )
        ]

    found = violations(rule)
    assert not found, "spark_apps must import only core, tables and each other, never Airflow: " + "; ".join(
        found
    )


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycles_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle():
    graph = {name: {target for target in targets if target in MODULES} for name, targets in IMPORTS.items()}
    found = cycles(graph)
    assert not found, "import cycles (move the shared piece into a module of its own): " + "; ".join(
        " <-> ".join(component) for component in found
    )


# -- core's floors and one import path per name ----------------------------------------------------

# core's sub-packages from the ground up: each imports only its own floor and those below it.
# ``jobspec`` (the job-spec contract between operators and Spark applications) is core's one module
# outside a sub-package.
CORE_FLOORS = (
    "base",
    "config",
    "kafka",
    "events",
    "offsets",
    "mongo",
    "jobspec",
    "gap",
    "snapshot",
    "window",
    "apply",
    "health",
    "watch",
)


def floor(module: str) -> str | None:
    """The floor of a module of core (its sub-package, or ``jobspec``), else None."""
    if not within(module, f"{PACKAGE}.core") or module == f"{PACKAGE}.core":
        return None
    return module.split(".")[2]


def test_core_is_sub_packages_by_concept_plus_the_job_spec():
    core = REPO / PACKAGE / "core"
    loose = sorted(path.name for path in core.glob("*.py") if path.name not in ("__init__.py", "jobspec.py"))
    assert not loose, f"core modules outside a sub-package (move each into its concept's): {loose}"
    packages = sorted(path.name for path in core.iterdir() if path.is_dir() and path.name != "__pycache__")
    assert packages == sorted(set(CORE_FLOORS) - {"jobspec"}), packages
    for init in [core / "__init__.py", *core.glob("*/__init__.py")]:
        assert not ast.parse(init.read_text(encoding="utf-8")).body or init == core / "__init__.py", (
            f"{init.relative_to(REPO)} must stay empty: names are imported from the module that defines them"
        )


def test_core_imports_only_downward():
    def rule(name, targets):
        mine = floor(name)
        if mine is None:
            return []
        return [
            target
            for target in targets
            if floor(target) is not None and CORE_FLOORS.index(floor(target)) > CORE_FLOORS.index(mine)
        ]

    found = violations(rule)
    assert not found, (
        "a core module imports a higher floor (" + " < ".join(CORE_FLOORS) + "): " + "; ".join(found)
    )


def defined_names(path: Path) -> set[str]:
    """The names a module binds at its top level by definition (not by import)."""
    names: set[str] = set()

    def visit(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    names.update(sub.id for sub in ast.walk(target) if isinstance(sub, ast.Name))
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(getattr(node, "orelse", []))

    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    return names


DEFINED = {name: defined_names(path) for name, path in MODULES.items()}
IMPORTING_FILES = [
    *REPO.glob(f"{PACKAGE}/**/*.py"),
    *REPO.glob("spark_apps/**/*.py"),
    *REPO.glob("dags/**/*.py"),
    *REPO.glob("bench/**/*.py"),
    *REPO.glob("tests/**/*.py"),
]


def test_every_name_is_imported_from_the_module_that_defines_it():
    found = []
    for path in IMPORTING_FILES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if not isinstance(node, ast.ImportFrom) or node.level or node.module not in MODULES:
                continue
            if not within(node.module, PACKAGE):  # the simulator keeps its public face (devtools.mongosim)
                continue
            for alias in node.names:
                if f"{node.module}.{alias.name}" in MODULES:
                    continue  # a module of the package
                if alias.name not in DEFINED[node.module]:
                    found.append(
                        f"{path.relative_to(REPO)}:{node.lineno} imports {alias.name} from {node.module}"
                    )
    assert not found, (
        "names imported through a module that does not define them (import them from their home): "
        + ("; ".join(found))
    )


def test_no_module_level_alias_of_an_imported_name():
    found = []
    for name, path in MODULES.items():
        if not within(name, PACKAGE):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = {
            alias.asname or alias.name
            for node in tree.body
            if isinstance(node, ast.ImportFrom)
            for alias in node.names
            if node.module and within(node.module, PACKAGE)
        }
        for node in tree.body:
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Name)
                and node.value.id in imported
            ):
                found.append(f"{path.relative_to(REPO)}:{node.lineno} {ast.unparse(node)}")
    assert not found, "second names for the provider's own names (use the original): " + "; ".join(found)


def test_the_wheel_lists_every_package_of_the_provider():
    """setuptools ships only the packages pyproject.toml lists: a sub-package missing there would be
    missing from the installed provider and from the executors' archive built from it."""
    import tomllib

    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    present = {module_name(init.parent / "__init__.py") for init in REPO.glob(f"{PACKAGE}/**/__init__.py")}
    present |= {SPARK_APPS}
    # Folders of data files only (the page's templates): packages of their package-data entry.
    present |= {
        name
        for name in setuptools["package-data"]
        if (REPO / name.replace(".", "/")).is_dir()
        and not (REPO / name.replace(".", "/") / "__init__.py").exists()
    }
    assert present == listed, (
        f"in the tree but not listed: {sorted(present - listed)}; listed, absent: {sorted(listed - present)}"
    )


def test_spark_submit_operators_private_attributes_are_written_in_one_place():
    # SparkSubmitOperator's _conn_id and _hook are upstream internals: one method writes them
    # (operators/spark_options.py, checked against the Spark provider's version named there).
    writes = []
    for path in sorted((REPO / PACKAGE).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = node.targets if isinstance(node, ast.Assign) else []
            if isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                targets = [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and target.attr in {"_conn_id", "_hook"}:
                    writes.append(f"{path.relative_to(REPO)}:{node.lineno} {target.attr}")
    files = {write.split(":")[0] for write in writes}
    assert files == {f"{PACKAGE}/operators/spark_options.py"} and len(writes) == 2, writes
