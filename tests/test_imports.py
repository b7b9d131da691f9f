"""The packages import one another without circles, counting imports inside functions too:
a circle means two modules that cannot be read (or moved) one without the other."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# folder -> the package it installs as (setup.py)
PACKAGES = {"semjobs": "semjobs", "semspec": "semspec", "worker": "semjobs.worker", "jobs": "semjobs.jobs",
            "cli": "semjobs.cli", "db": "semjobs.db", "migrations": "semjobs.migrations"}


def _modules() -> dict[str, Path]:
    found = {}
    for folder, package in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = (package, *path.relative_to(ROOT / folder).with_suffix("").parts)
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imported_names(module: str, path: Path):
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)  # a submodule, or a name in base


def import_graph() -> dict[str, set[str]]:
    """Each module of ours -> the modules of ours it imports, with the packages around them
    (importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__``)."""
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for name in _imported_names(module, path):
            while name and name not in modules:
                name = name.rpartition(".")[0]
            while name:
                if name != module:
                    graph[module].add(name)
                name = name.rpartition(".")[0]
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while not group or group[-1] != v:
                group.append(stack.pop())
            if len(group) > 1:
                found.append(sorted(group))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    assert circles(import_graph()) == []


def test_what_a_worker_runs_never_imports_what_builds_artifacts_or_the_benchmark():
    """Draft training and the bench run once, on a workstation: no module a worker runs (its
    tasks, jobs and database code, the engine adapter, the models, the semantic layer)
    imports them. (Probe calibration is a job workers run, so it is not among them. The
    `semjobs` command itself registers `semjobs draft`, whose options take their defaults
    from semspec.draft.config, a module of dataclasses, in every semjobs process.)"""
    builders = ("semspec.draft", "semspec.benchmark")
    graph = import_graph()
    runs_in_a_worker = [m for m in graph if m.startswith(("semjobs.worker", "semjobs.jobs", "semjobs.db", "semspec"))
                        and not m.startswith(builders)]
    assert {m: sorted(d for d in graph[m] if d.startswith(builders)) for m in runs_in_a_worker
            if any(d.startswith(builders) for d in graph[m])} == {}


def test_the_circle_finder_finds_one():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_graph_counts_imports_inside_functions_and_the_packages_around_them():
    graph = import_graph()
    assert "semspec.engine.step_engine" in graph["semjobs.worker.tasks"]  # imported inside calibration_models() only
    assert {"semspec.models", "semspec"} <= graph["semspec.head"]  # around semspec.models.loaded
