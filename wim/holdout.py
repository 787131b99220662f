"""Held-out prompts: kept out of generation, judging and training, for `wim eval`.

`prompts.holdout` prompts are chosen from the whole prompt set, before `prompts.limit`: within
each domain they are ranked by a fixed hash of their id (no seed, so runs with other seeds or
settings hold out the same prompts), and the domains take turns, so the held-out set covers
them all. The split is written to `DIR/split.json` when samples are generated; `wim eval`
reads it and checks that no held-out prompt has a sample.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path

from wim.errors import InputError
from wim.prompts import Prompt, load_prompts
from wim.records import write_atomic
from wim.rundir import SPLIT

RULE = ("prompts.holdout prompts, ranked within each domain by sha256('wim-holdout:' + id), "
        "domains taking turns; chosen before prompts.limit")


def _rank(prompt: Prompt) -> str:
    return hashlib.sha256(f"wim-holdout:{prompt.id}".encode()).hexdigest()


def split_prompts(prompts: list[Prompt], holdout: int) -> tuple[list[Prompt], list[Prompt]]:
    """(training prompts in their order, held-out prompts)."""
    if holdout <= 0:
        return list(prompts), []
    if holdout >= len(prompts):
        raise InputError(
            f"prompts.holdout is {holdout} but the prompt set has only {len(prompts)} prompts; "
            "hold out fewer, so that some are left to train on."
        )
    ranked = sorted(prompts, key=lambda p: (p.domain, _rank(p)))
    queues = [list(group) for _, group in itertools.groupby(ranked, key=lambda p: p.domain)]
    # zip_longest takes the domains in turns: every domain's first, then every second, ...
    turns = itertools.zip_longest(*queues)
    held = [p for turn in turns for p in turn if p is not None][:holdout]
    held_ids = {p.id for p in held}
    return [p for p in prompts if p.id not in held_ids], held


def load_split(source: str, split: str, limit: int | None,
               holdout: int) -> tuple[list[Prompt], list[Prompt]]:
    """(training prompts, at most `limit`; held-out prompts) of a prompts config."""
    if holdout <= 0:
        return load_prompts(source, split=split, limit=limit), []
    train, held = split_prompts(load_prompts(source, split=split), holdout)
    return train[:limit], held


def write_split(folder: Path, train: list[Prompt], held: list[Prompt]) -> None:
    data = {"rule": RULE, "holdout": [p.id for p in held], "train": [p.id for p in train]}
    path = Path(folder) / SPLIT
    write_atomic(path, [json.dumps(data, indent=1)])


def read_split(folder: Path) -> dict | None:
    path = Path(folder) / SPLIT
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except ValueError:
        raise InputError(f"{path} is not valid JSON; delete it and run `wim generate` "
                         "again to rewrite it.") from None
    if not isinstance(data, dict) or not isinstance(data.get("holdout"), list):
        raise InputError(f"{path} has no 'holdout' list of prompt ids.")
    return data
