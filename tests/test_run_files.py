"""The run directory's layout has one owner, wim/rundir.py: no other product module names a
run file (`"eval.json"`, `"stats/generate.json"`) or joins a run folder's name to a path
(`run.path / "rounds"`, `run.file("batch")`). They use RunDir's properties and constants."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from wim import rundir

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("wim", "data_gen", "training")
OWNER = Path("wim/rundir.py")
# peft's name for an adapter's config, in any adapter folder (not only a run's).
NOT_OURS = {rundir.ADAPTER_CONFIG}
_NAMES = {v for k, v in vars(rundir).items() if k.isupper() and isinstance(v, str)
          and k in rundir.__dict__ and not k.startswith("_")} - NOT_OURS
# Files and nested paths: a literal anywhere is a run file named outside the owner.
FILES = {n for n in _NAMES if "." in n or "/" in n}
# Bare folder names ("pairs", "train", ...) are also stage names and metric prefixes: only a
# literal joined to a path counts.
FOLDERS = {n for n in _NAMES if n.isidentifier()}


def _joined(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """The literal is an operand of `/` or the argument of `.file(...)`/`.joinpath(...)`."""
    parent = parents.get(node)
    if isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Div):
        return True
    return (isinstance(parent, ast.Call) and isinstance(parent.func, ast.Attribute)
            and parent.func.attr in ("file", "joinpath") and node in parent.args)


def run_file_literals(source: str) -> list[tuple[int, str]]:
    """(line, literal) of every run-file name written as a string in `source`."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and (node.value in FILES or node.value.startswith(f"{rundir.STATS_FOLDER}/")
                 or (node.value in FOLDERS and _joined(node, parents)))]


def test_the_owner_declares_the_layout():
    assert {"eval.json", "resolved_config.yaml", "rounds", "batch", "split.json"} <= _NAMES
    assert "samples.jsonl" in FILES and "rounds" in FOLDERS


@pytest.mark.parametrize("planted", ['run.path / "eval.json"', 'run.file("rounds")',
                                     'folder = run.path / "batch"', 'run.file("stats/pairs.json")',
                                     'open("resolved_config.yaml")',
                                     'f"stats/{stage}.json"'])
def test_a_planted_run_file_name_is_found(planted):
    assert run_file_literals(f"def f(run):\n    {planted}\n")


def test_metric_keys_and_stage_names_are_not_run_files():
    source = ('m = {"train/steps": 1, "pairs/count": 2}\nrun.write_stats("pairs", m)\n'
              'split = "train"\n')
    assert run_file_literals(source) == []


def test_no_module_outside_rundir_names_a_run_file():
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if rel == OWNER:
                continue
            found += [f"{rel}:{line}: {value!r}"
                      for line, value in run_file_literals(path.read_text())]
    assert not found, ("run-file names outside wim/rundir.py (use RunDir's properties or its "
                       "constants):\n" + "\n".join(found))
