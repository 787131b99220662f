"""What the data stages share: shards, batches and their seeds, the progress bar, stats.
Batches are what seeds, shards and resume count in, so a resumed run or merged shards hold
exactly the records of one uninterrupted run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from wim.config import PriceConfig
from wim.errors import InputError
from wim.pricing import TokenCounts
from wim.prompts import Prompt, PromptRef
from wim.records import iter_keyed


@dataclass(frozen=True)
class Shard:
    index: int
    count: int

    @classmethod
    def parse(cls, text: str | None) -> Shard | None:
        if not text:
            return None
        try:
            i, n = (int(x) for x in text.split("/"))
        except ValueError:
            i, n = -1, 0
        if not 0 <= i < n:
            raise InputError(f"--shard must look like i/n with 0 <= i < n (e.g. 0/2), got '{text}'")
        return cls(i, n)

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def prompt_batches(prompts: Sequence[Prompt | PromptRef], batch_size: int,
                   shard: Shard | None = None):
    """[(batch index, prompts)], sorted by length, this shard's share only. A `PromptRef`
    (id and length) batches exactly as its `Prompt` would."""
    ordered = sorted(prompts, key=lambda p: (p.length, p.id))
    batches = [ordered[i : i + batch_size] for i in range(0, len(ordered), batch_size)]
    return [(b, batch) for b, batch in enumerate(batches)
            if shard is None or b % shard.count == shard.index]


def batch_seed(seed: int, stage: str, batch_index: int) -> int:
    return (seed * 1_000_003 + batch_index * 7_919 + (1 if stage == "judge" else 0)) % (2**31)


def progress_bar(total: int | None, desc: str, progress: bool, unit: str = "sample"):
    return tqdm(total=total, desc=desc, unit=unit, disable=not progress, dynamic_ncols=True)


def token_stats(path: Path, stage: str, role: str, price: PriceConfig | None = None
                ) -> dict[str, Any]:
    """Records, tokens by kind (and their cost at `price`: wim/pricing.py), empty responses and
    failed parses of a stage file, in one pass."""
    records, empty, failed = 0, 0, 0
    tokens = TokenCounts(role)
    for _, r in iter_keyed(path):
        records += 1
        tokens.add(r)
        empty += not str(r.get("response") or "").strip()
        failed += not r.get("parse_ok", True)
    return {
        f"{stage}/records": records,
        **tokens.result(price),
        **({"generate/empty": empty} if stage == "generate" else {f"{stage}/parse_failed": failed}),
    }


def backend_stats(backend, role: str) -> dict[str, Any]:
    """Request, retry and failure counts of an HTTP backend (`http/judge/retries`, ...); for a
    local model its dtype and the machine it was picked for (wim/precision.py)."""
    counts = getattr(backend, "stats", None) or {}
    stats: dict[str, Any] = {f"http/{role}/{k}": v for k, v in counts.items()}
    if getattr(backend, "dtype", None):
        from wim.precision import machine

        stats[f"dtype/{role}"] = backend.dtype
        stats.update({f"machine/{k}": v for k, v in machine().describe().items()})
    return stats


def budget_stats(counts: dict) -> dict[str, Any]:
    """The stats of judgements whose reply ran out of budget before an answer (wim/reasoning.py):
    present only when there were some, and then the pipeline stops after the stage."""
    if not counts["budget_exhausted"]:
        return {}
    return {"judge/budget_exhausted": counts["budget_exhausted"],
            "judge/budget_note": counts["budget_note"]}
