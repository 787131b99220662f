"""Tie rate, winner-loser delta and agreement for numeric, WIM and mixed scores.

All systems come from one judging pass: numeric = rating_norm, wim = similarity, mixed = the
zeta mix. Everything is measured on pairs of samples of the same prompt, on the 1-10 scale
(`x * 5 + 5`), as in the paper.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from typing import Any

from wim.pairs import group_by_prompt
from wim.parsing import ECHOED_RUBRIC
from wim.scoring import is_tie, mix_scores, to_ten_point


def system_values(record: dict[str, Any], zeta: float, zetas: list[float]) -> dict[str, float]:
    """The 1-10 value of one judged sample under each system (absent when undefined)."""
    if record.get("rating_norm") is None:
        return {}
    rn, sim = record["rating_norm"], record.get("similarity")
    values = {"numeric": rn}
    if sim is not None:
        values["wim"] = sim
        values["mixed"] = mix_scores(rn, sim, zeta)
        for z in zetas:
            values[f"zeta={z:g}"] = mix_scores(rn, sim, z)
    return {name: to_ten_point(v) for name, v in values.items()}


def domain_key(domain: str) -> str:
    """A domain name as one segment of a metric key: `%` and `/` percent-encoded, so that
    `domain/<name>/tie_rate/wim` always splits back into its parts (`domain_name` undoes it)."""
    return domain.replace("%", "%25").replace("/", "%2F")


def domain_name(key: str) -> str:
    return key.replace("%2F", "/").replace("%25", "%")


def _sign(x: float, tol: float) -> int:
    return 0 if is_tie(x, tol) else (1 if x > 0 else -1)


def _summaries(groups: dict[str, list[dict]], systems: list[str], tol: float) -> dict[str, float]:
    ties, deltas, spreads = defaultdict(int), defaultdict(list), defaultdict(list)
    no_pair = defaultdict(int)
    agree, both = defaultdict(int), defaultdict(int)
    for values in groups.values():
        for s in systems:
            vals = [v[s] for v in values if s in v]
            if len(vals) < 2 or is_tie(max(vals) - min(vals), tol):
                no_pair[s] += 1
            if len(vals) >= 2:
                spreads[s].append(max(vals) - min(vals))
        for a, b in itertools.combinations(values, 2):
            for s in systems:
                if s not in a or s not in b:
                    continue
                d = a[s] - b[s]
                deltas[s].append(abs(d))
                ties[s] += is_tie(d, tol)
                if s != "numeric" and "numeric" in a and "numeric" in b:
                    sn, ss = _sign(a["numeric"] - b["numeric"], tol), _sign(d, tol)
                    if sn and ss:
                        both[s] += 1
                        agree[s] += sn == ss
    out: dict[str, float] = {}
    for s in systems:
        n = len(deltas[s])
        out[f"tie_rate/{s}"] = ties[s] / n if n else math.nan
        out[f"delta/{s}"] = sum(deltas[s]) / n if n else math.nan
        spread = spreads[s]
        out[f"delta_best_worst/{s}"] = sum(spread) / len(spread) if spread else math.nan
        out[f"no_pair_share/{s}"] = no_pair[s] / len(groups) if groups else math.nan
        out[f"sample_pairs/{s}"] = n
        if s != "numeric":
            out[f"agreement/{s}"] = agree[s] / both[s] if both[s] else math.nan
    return out


def pair_statistics(
    scored: list[dict[str, Any]], zeta: float, zetas: list[float], tol: float = 1e-6
) -> dict[str, float]:
    """`pairs/...` metrics overall, `zeta/<z>/...` for the sweep, `domain/<d>/...` per domain.

    `tol` is `pairs.tie_tolerance`, on the 1-10 scale, so the report counts ties as the pairs do.
    """
    groups = group_by_prompt(scored)
    values = {pid: [system_values(r, zeta, zetas) for r in recs] for pid, recs in groups.items()}
    present = {name for vals in values.values() for v in vals for name in v}
    systems = [s for s in ("numeric", "wim", "mixed") if s in present]
    sweep = [f"zeta={z:g}" for z in zetas if f"zeta={z:g}" in present]
    out: dict[str, float] = {}
    for key, value in _summaries(values, systems + sweep, tol).items():
        metric, system = key.split("/", 1)
        if system.startswith("zeta="):
            out[f"zeta/{system[5:]}/{metric}"] = value
        else:
            out[f"pairs/{metric}/{system}"] = value
    domains = defaultdict(dict)
    for pid, recs in groups.items():
        domains[recs[0].get("domain") or "none"][pid] = values[pid]
    for domain, dom_values in sorted(domains.items()):
        for key, value in _summaries(dom_values, systems, tol).items():
            if key.startswith(("tie_rate/", "delta/", "agreement/")):
                out[f"domain/{domain_key(domain)}/{key}"] = value
    return out


def judge_statistics(judgements: list[dict[str, Any]]) -> dict[str, float]:
    n = len(judgements)
    failed = sum(not j["parse_ok"] for j in judgements)
    retried = sum(j.get("attempts", 1) > 1 for j in judgements)
    nothing = sum(j["parse_ok"] and j.get("critique") == "" for j in judgements)
    echoed = sum(ECHOED_RUBRIC in (j.get("parse_error") or "") for j in judgements)
    ever = sum(j.get("echoed_attempts", 0) > 0 for j in judgements)
    return {
        "judge/count": n,
        "judge/parse_failed": failed,
        "judge/parse_fail_rate": failed / n if n else math.nan,
        "judge/echoed_rubric": echoed,
        "judge/echoed_rubric_rate": echoed / n if n else math.nan,
        "judge/echoed_rubric_any_attempt": ever,
        "judge/echoed_rubric_any_attempt_rate": ever / n if n else math.nan,
        "judge/retried": retried,
        # Asks per recorded judgement (1 = every verdict parsed at the first attempt).
        "judge/attempts_per_judgement": (sum(j.get("attempts", 1) for j in judgements) / n
                                         if n else math.nan),
        "judge/nothing_missing_rate": nothing / n if n else math.nan,
    }
