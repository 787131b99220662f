"""The README's commands must keep working: every `wim ...` line parses, every make target exists,
and every config key it shows is a real config field."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

from wim.cli import build_parser
from wim.config import config_from_dict, read_yaml

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


def _commands() -> list[list[str]]:
    commands = []
    for block in _blocks("bash"):
        for line in block.splitlines():
            line = line.split("  #")[0].strip()
            for part in line.split("&&"):
                words = shlex.split(part)
                if words:
                    commands.append(words)
    return commands


def test_wim_commands_parse() -> None:
    wim = [c[1:] for c in _commands() if c[0] == "wim"]
    assert len(wim) >= 5
    for args in wim:
        build_parser().parse_args(args)  # raises SystemExit on a stale command


def test_make_targets_exist() -> None:
    targets = set(re.findall(r"^([a-z-]+):", (ROOT / "Makefile").read_text(), flags=re.M))
    used = {c[1] for c in _commands() if c[0] == "make"}
    assert {"quickstart", "test"} <= used
    assert used <= targets


def test_yaml_snippets_are_valid_config() -> None:
    base = read_yaml(ROOT / "configs" / "quickstart.yaml")
    for block in _blocks("yaml"):
        snippet = yaml.safe_load(block)
        merged = {**base, **{k: {**base.get(k, {}), **v} for k, v in snippet.items()}}
        config_from_dict(merged, source="README.md")


def test_every_shipped_config_loads() -> None:
    from wim.config import load_config

    configs = sorted((ROOT / "configs").glob("*.yaml"))
    assert len(configs) >= 3
    for path in configs:
        load_config(path)
