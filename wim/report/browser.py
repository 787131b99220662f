"""The data of the critique browser in report.html, for at most `report.browser_prompts`
prompts (docs/design.md, "The report").

One entry per preference pair, plus one per prompt that gave no pair (its best and worst samples
tied, or too few judgements parsed), built from the run directory alone. Failed judgements come
first, with the judge's raw text and the parse error, so a reader sees what went wrong; then a
seeded sample, so that the page of a 100k-prompt run stays a few MB. The full data stays in the
jsonl files.
"""

from __future__ import annotations

import json
import math
import random
from collections import defaultdict
from typing import Any

from wim.metrics import system_values
from wim.pairs import best_and_worst
from wim.records import RecordIndex, iter_records
from wim.rundir import RunDir
from wim.scoring import is_tie, ten_point_gap, to_ten_point


def _side(record: dict[str, Any], label: str, zeta: float) -> dict[str, Any]:
    values = system_values(record, zeta, [])
    score = record.get("score")
    return {
        "label": label,
        "sample_idx": record.get("sample_idx"),
        "response": str(record.get("response") or ""),
        **{key: record.get(key) for key in ("critique", "rating", "similarity")},
        **{system: values.get(system) for system in ("numeric", "wim", "mixed")},
        "score": to_ten_point(score) if isinstance(score, (int, float)) else None,
        "parse_ok": bool(record.get("parse_ok", True)),
        "parse_error": record.get("parse_error"),
        "raw": record.get("raw_judge_text"),
    }


def browser_entries(run: RunDir, zeta: float, tie_tolerance: float, limit: int | None = None,
                    seed: int = 0) -> tuple[list[dict[str, Any]], int]:
    """(entries, prompts in the run) of the prompts `_choose` picks, in prompt order; only
    their records and pair rows are read. Besides `kind`, `tie` also marks a kept tie
    (`pairs.tie_policy` first/random) and `numeric_tie` a pair whose ratings alone tied."""
    index = RecordIndex(run.scores)
    if not len(index):
        index = RecordIndex(run.judgements)
    ids = index.prompt_ids()
    failed_ids = {str(r["prompt_id"]) for _, r in iter_records(index.path)
                  if not r.get("parse_ok", True)}
    shown = _choose(ids, failed_ids, limit, seed)
    pairs_by_prompt: dict[str, list[dict]] = defaultdict(list)
    for _, p in iter_records(run.pairs):
        if str(p["prompt_id"]) in shown:
            pairs_by_prompt[str(p["prompt_id"])].append(p)
    entries: list[dict[str, Any]] = []
    for group in index.groups():
        pid = str(group[0]["prompt_id"])
        if pid in shown:
            entries += _entries(pid, {int(r["sample_idx"]): r for r in group},
                                pairs_by_prompt.get(pid, []), zeta, tie_tolerance)
    for number, entry in enumerate(entries):
        entry["id"] = number
    return entries, len(ids)


def _choose(ids: list[str], failed: set[str], limit: int | None, seed: int) -> set[str]:
    """All prompts when they fit in `limit` (`report.browser_prompts`), else those with a
    failed judgement first, then a sample of the rest drawn with `seed`."""
    if limit is None or len(ids) <= limit:
        return set(ids)
    first = [pid for pid in ids if pid in failed][:limit]
    others = [pid for pid in ids if pid not in failed]
    return set(first) | set(random.Random(seed).sample(others, limit - len(first)))


def _entries(pid: str, samples: dict[int, dict], pairs: list[dict], zeta: float,
             tie_tolerance: float) -> list[dict[str, Any]]:
    """One prompt's entries: one per pair row, or one `tie` / `unpaired` entry."""
    first = samples[min(samples)]
    failed = [r for r in samples.values() if not r.get("parse_ok", True)]
    base = {"prompt_id": pid, "domain": str(first.get("domain") or ""),
            "prompt": str(first.get("prompt") or "\n\n".join(
                f"{m.get('role')}: {m.get('content')}" for m in first.get("messages") or [])),
            "failed": bool(failed)}
    entries: list[dict[str, Any]] = []
    labels = ("chosen", "rejected")
    for pair in pairs:
        found = [samples.get(int(pair[f"{label}_sample_idx"])) for label in labels]
        if None in found:  # pairs from another scoring: show the row
            found = [{**pair, "response": pair[label][0]["content"],
                      **{key: pair.get(f"{label}_{key}") for key in ("critique", "rating",
                                                                    "score")}}
                     for label in labels]
        gap = ten_point_gap(pair["chosen_score"], pair["rejected_score"])
        sides = [_side(record, label, zeta) for record, label in zip(found, labels, strict=True)]
        numeric = [s["numeric"] for s in sides]
        entries.append({**base, "kind": "pair", "tie": is_tie(gap, tie_tolerance),
                        "numeric_tie": None not in numeric
                        and is_tie(numeric[0] - numeric[1], tie_tolerance),
                        "sides": sides, "failures": _failures(failed, sides, zeta)})
    if pairs:
        return entries
    usable = [r for r in samples.values() if r.get("score") is not None]
    if len(usable) >= 2:
        best, worst = best_and_worst(usable)
        sides = [_side(best, "best", zeta), _side(worst, "worst", zeta)]
        return [{**base, "kind": "tie", "tie": True, "sides": sides,
                 "failures": _failures(failed, sides, zeta)}]
    sides = [_side(r, f"sample {i}", zeta) for i, r in sorted(samples.items())]
    return [{**base, "kind": "unpaired", "tie": False, "sides": sides, "failures": []}]


def _failures(failed: list[dict], sides: list[dict], zeta: float) -> list[dict[str, Any]]:
    """Failed judgements of the prompt that are not already shown as one of the two sides."""
    shown = {s["sample_idx"] for s in sides}
    return [_side(r, f"sample {r.get('sample_idx')} (failed)", zeta) for r in failed
            if r.get("sample_idx") not in shown]


def script_json(data: Any) -> str:
    """JSON that is safe inside a `<script>` element: `<`, `>` and `&` become \\u escapes, so
    no model text can close the element or open a comment (`</script>`, `<!--`)."""
    text = json.dumps(_finite(data), ensure_ascii=True, allow_nan=False, default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _finite(data: Any) -> Any:
    """NaN and infinities (not JSON) as null."""
    if isinstance(data, float) and not math.isfinite(data):
        return None
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite(v) for v in data]
    return data
