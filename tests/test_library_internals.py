"""The private and deep names of torch, transformers, TRL and peft that wim uses exist in the
installed versions and take what we pass (wim/library_internals.py). An upgrade that moves one
fails here, by name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from wim.library_internals import INTERNALS, Internal, problems

ROOT = Path(__file__).resolve().parents[1]
LIBRARIES = ("torch", "transformers", "trl", "peft")


@pytest.mark.parametrize("internal", INTERNALS, ids=lambda i: i.path)
def test_each_internal_exists_with_the_signature_we_call(internal: Internal) -> None:
    assert problems(internal) == []


def test_a_renamed_internal_is_reported_by_name() -> None:
    gone = Internal("trl:DPOTrainer._precompute_ref_logps_renamed", ("self",), "here")
    reshaped = Internal("trl:DPOTrainer._precompute_ref_logps", ("self", "dataset", "split"), "x")
    assert "gone" in problems(gone)[0] and "_precompute_ref_logps_renamed" in problems(gone)[0]
    assert "no longer takes split" in problems(reshaped)[0]


def _used_internals() -> set[str]:
    """`module:name` for every import from a library's submodule and every private attribute
    (`._x`) read off a library object, in wim/, data_gen/ and training/."""
    found = set()
    for folder in ("wim", "data_gen", "training"):
        for path in (ROOT / folder).rglob("*.py"):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module and \
                        node.module.split(".")[0] in LIBRARIES and "." in node.module:
                    found |= {f"{node.module}:{a.name}" for a in node.names}
                if isinstance(node, ast.Attribute) and node.attr.startswith("_") and \
                        not node.attr.startswith("__"):
                    base = node.value
                    while isinstance(base, ast.Attribute):
                        base = base.value
                    if isinstance(base, ast.Name) and base.id in (*LIBRARIES, "GenerationConfig"):
                        found.add(node.attr)
    return found


def test_every_internal_in_the_code_is_listed() -> None:
    listed = [i.path for i in INTERNALS]
    attrs = {part for path in listed for part in path.split(":")[1].split(".")}
    unlisted = sorted(name for name in _used_internals()
                      if not any(path == name or path.startswith(name + ".") for path in listed)
                      and name not in attrs)
    assert unlisted == [], "add these to wim/library_internals.py"
