"""The packages depend one way: wim <- data_gen <- training (docs/design.md, "Layout").

Every import counts, the ones inside functions included: a lazy import is still an arrow.
Only wim/cli.py, the command that dispatches to every layer, may reach up.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("wim", "data_gen", "training")
# What each package may not import.
FORBIDDEN = {"wim": ("data_gen", "training"), "data_gen": ("training",), "training": ()}
ALLOWED = {Path("wim/cli.py")}


def imported_packages(source: str) -> list[tuple[int, str]]:
    """(line, top-level package) of every import in the module, at any depth."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


def upward_imports() -> list[str]:
    bad = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if rel in ALLOWED:
                continue
            for line, target in imported_packages(path.read_text()):
                if target in FORBIDDEN[package]:
                    bad.append(f"{rel}:{line} imports {target}")
    return bad


def test_no_module_imports_a_layer_above_it():
    assert upward_imports() == []


@pytest.mark.parametrize("source", ["def f():\n    from training.dpo import x\n",
                                    "import training.online\n",
                                    "class A:\n    def m(self):\n        import training\n"])
def test_the_scan_sees_imports_at_any_depth(source):
    assert [t for _, t in imported_packages(source)] == ["training"]


def test_the_report_is_a_package_of_the_core_library():
    from wim.report import write_report

    assert write_report.__module__.startswith("wim.report.")
    assert not (ROOT / "training" / "report.py").exists()
