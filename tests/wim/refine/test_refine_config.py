"""The refine: section: help text on every field, checks that name the key, the shipped YAML."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from wim.config import ConfigError, load_config


def test_every_refine_field_has_help_text():
    import wim.config.refine as module

    tree = ast.parse(Path(module.__file__).read_text())
    undocumented = []
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        for i, node in enumerate(cls.body):
            if isinstance(node, ast.AnnAssign):
                nxt = cls.body[i + 1] if i + 1 < len(cls.body) else None
                if not (isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)):
                    undocumented.append(f"{cls.name}.{node.target.id}")
    assert not undocumented and len(tree.body) > 3


def test_refine_yaml_has_the_paper_defaults():
    r = load_config("configs/refine.yaml").refine
    assert (r.gamma, r.tau_c, r.max_attempts) == (0.02, 0.05, 8)
    assert (r.vrr.k, r.vrr.tau) == (5, 0.0)
    from wim.config import Config

    v = Config().refine.vrr  # the defaults are the paper's; the CPU config halves M
    assert (v.m, v.k, v.tau, v.delta) == (8, 5, 0.0, 5)
    assert load_config("configs/refine.yaml").prompts.limit == 8


@pytest.mark.parametrize("override,key", [
    ("refine.gamma=1.5", "'refine.gamma'"),
    ("refine.dynamic.reject_streak=0", "'refine.dynamic.reject_streak'"),
    ("refine.vrr.alpha=-0.1", "'refine.vrr.alpha'"),
    ("refine.penalties={truncated: {coherence: 2}}", "'refine.penalties.truncated.coherence'"),
    ("refine.test=sign", "'refine.test'"),
    ("refine.dynamic.windows=3", "'refine.dynamic.windows'"),
])
def test_bad_refine_values_name_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config("configs/refine.yaml", [override])
