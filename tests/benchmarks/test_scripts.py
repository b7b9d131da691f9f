"""The benchmark scripts still name what exists: every semspec/semjobs module and name they
import, also inside functions, resolves (a script is kept only while a doc cites it and it
runs; a rename that breaks one fails here, not the next time someone measures)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
DOCS = [BENCHMARKS.parent / "README.md", *BENCHMARKS.parent.glob("docs/*.md"),
        *BENCHMARKS.parent.glob("semspec/**/README.md")]
SCRIPTS = sorted(p for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_"))  # _common.py: their helpers


def _our_imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("semspec", "semjobs"):
            yield node.module, [alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in ("semspec", "semjobs"):
                    yield alias.name, []


@pytest.mark.parametrize("script", sorted(BENCHMARKS.glob("*.py")), ids=lambda p: p.name)
def test_a_script_imports_only_what_exists(script):
    for module_name, names in _our_imports(script):
        module = importlib.import_module(module_name)
        for name in names:
            if not hasattr(module, name):
                importlib.import_module(f"{module_name}.{name}")  # a submodule, else ImportError


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_a_doc_cites_the_script(script):
    assert any(f"benchmarks/{script.name}" in doc.read_text() for doc in DOCS), script.name


def test_the_import_check_notices_a_missing_name(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def main():\n    from semspec.models.specs import no_such_name\n")
    with pytest.raises(ImportError):
        test_a_script_imports_only_what_exists(bad)
