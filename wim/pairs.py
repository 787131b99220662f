"""Rankings to chosen/rejected pairs in TRL's conversational preference format.

Strategies, over the k samples of one prompt that parsed:
- `best_vs_worst` (default): the highest against the lowest score;
- `best_vs_random`: the highest against a random lower one;
- `all`: every pair of samples with different scores.
Ties (scores within `tie_tolerance` on the 1-10 scale, the rule the report uses too) follow the
tie policy: `drop` (default), `first` (sample order decides) or `random`; each outcome is
counted, so nothing disappears silently.
"""

from __future__ import annotations

import itertools
import random
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from wim.config import PairsConfig
from wim.scoring import is_tie, ten_point_gap


@dataclass
class PairCounts:
    pairs: int = 0
    prompts: int = 0
    prompts_too_few_parsed: int = 0
    """Prompts with fewer than two samples that parsed: no pair possible."""
    ties: int = 0
    ties_dropped: int = 0
    ties_kept_first: int = 0
    ties_kept_random: int = 0

    def as_metrics(self) -> dict[str, int]:
        """Each field as `pairs/<field>`, in field order; `pairs` itself as `pairs/count`."""
        return {f"pairs/{'count' if k == 'pairs' else k}": v for k, v in asdict(self).items()}


def group_by_prompt(scored: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in scored:
        groups[record["prompt_id"]].append(record)
    for records in groups.values():
        records.sort(key=lambda r: r["sample_idx"])
    return dict(groups)


def build_pairs(
    scored: list[dict[str, Any]], cfg: PairsConfig, seed: int = 0
) -> tuple[list[dict[str, Any]], PairCounts]:
    """Pair rows (with audit columns) and the counts of what happened to each prompt."""
    counts = PairCounts()
    return list(pair_rows(group_by_prompt(scored).values(), cfg, counts, seed)), counts


def pair_rows(groups: Iterable[list[dict[str, Any]]], cfg: PairsConfig, counts: PairCounts,
              seed: int = 0) -> Iterator[dict[str, Any]]:
    """Pair rows of each prompt's records (by sample_idx); `counts` is complete when exhausted."""
    rng = random.Random(seed)
    for records in groups:
        counts.prompts += 1
        usable = [r for r in records if r.get("score") is not None]
        if len(usable) < 2:
            counts.prompts_too_few_parsed += 1
            continue
        for a, b in _candidates(usable, cfg, rng):
            chosen, rejected = _order(a, b, cfg, rng, counts)
            if chosen is not None:
                counts.pairs += 1
                yield pair_row(chosen, rejected)


def best_and_worst(usable: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The highest and the lowest scored of two or more records, never the same one: max/min
    keep the first of equal scores, so `first` means sample order; when all scores are equal
    the worst is the first record after the best."""
    best = max(usable, key=lambda r: r["score"])
    worst = min(usable, key=lambda r: r["score"])
    if worst is best:
        worst = next(r for r in usable if r is not best)
    return best, worst


def _candidates(usable, cfg: PairsConfig, rng: random.Random):
    best, worst = best_and_worst(usable)
    if cfg.strategy == "best_vs_worst":
        return [(best, worst)]
    if cfg.strategy == "best_vs_random":
        lower = [r for r in usable if r["score"] < best["score"]
                 and not is_tie(ten_point_gap(best["score"], r["score"]), cfg.tie_tolerance)]
        if lower:
            return [(best, rng.choice(lower))]
        return [(best, next(r for r in usable if r is not best))]
    return list(itertools.combinations(usable, 2))


def choose(a: float, b: float, tolerance: float, tie_policy: str, a_first: bool = True,
           rng: random.Random | None = None) -> tuple[bool | None, bool]:
    """The one tie rule, for offline pairs and online DPO alike: (is `a` chosen, None when
    dropped; was it a tie). On a tie (`is_tie` on the 1-10 scale) the first completion
    (`a_first` says which) or a coin of `rng` wins, or the pair is dropped."""
    if not is_tie(ten_point_gap(a, b), tolerance):
        return a > b, False
    if tie_policy == "drop":
        return None, True
    if tie_policy == "first":
        return a_first, True
    return rng.random() < 0.5, True


def _order(a, b, cfg: PairsConfig, rng: random.Random, counts: PairCounts):
    """(chosen, rejected), or (None, None) when a tie is dropped."""
    a_chosen, tie = choose(a["score"], b["score"], cfg.tie_tolerance, cfg.tie_policy,
                           a_first=a["sample_idx"] < b["sample_idx"], rng=rng)
    if tie:
        counts.ties += 1
        if a_chosen is None:
            counts.ties_dropped += 1
        elif cfg.tie_policy == "first":
            counts.ties_kept_first += 1
        else:
            counts.ties_kept_random += 1
    if a_chosen is None:
        return None, None
    return (a, b) if a_chosen else (b, a)


def pair_row(chosen: dict[str, Any], rejected: dict[str, Any]) -> dict[str, Any]:
    """One TRL conversational preference row plus audit columns."""
    return {
        "prompt": chosen["messages"],
        "chosen": [{"role": "assistant", "content": chosen["response"]}],
        "rejected": [{"role": "assistant", "content": rejected["response"]}],
        "prompt_id": chosen["prompt_id"],
        "domain": chosen.get("domain", ""),
        "chosen_sample_idx": chosen["sample_idx"],
        "rejected_sample_idx": rejected["sample_idx"],
        "chosen_critique": chosen.get("critique"),
        "rejected_critique": rejected.get("critique"),
        "chosen_rating": chosen["rating"],
        "rejected_rating": rejected["rating"],
        "chosen_similarity": chosen.get("similarity"),
        "rejected_similarity": rejected.get("similarity"),
        "chosen_score": chosen["score"],
        "rejected_score": rejected["score"],
        "zeta": chosen["zeta"],
        # Who wrote each side: the policy, or a generation.source response's model.
        "chosen_origin": _origin(chosen),
        "rejected_origin": _origin(rejected),
    }


def _origin(record: dict[str, Any]) -> str:
    return record.get("origin") or record.get("policy") or ""
