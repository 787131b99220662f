"""Tie rate, winner-loser delta and agreement for numeric, WIM and mixed scores.

All systems come from one judging pass: numeric = rating_norm, wim = similarity, mixed = the
zeta mix. Everything is measured on pairs of samples of the same prompt, on the 1-10 scale
(`x * 5 + 5`), as in the paper.
"""

from __future__ import annotations

import itertools
import math
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


class SystemSummary:
    """Running tie rate, deltas and agreement of one set of prompts, per system (no lists):
    `add` one prompt's samples' `system_values` (every pair of them counts), then `result`.
    Online DPO adds each of its pairs as a prompt of two."""

    def __init__(self, systems: list[str], tol: float) -> None:
        self.systems, self.tol, self.groups = systems, tol, 0
        zero = dict.fromkeys(systems, 0)
        self.ties, self.n, self.no_pair = dict(zero), dict(zero), dict(zero)
        self.agree, self.both, self.spread_n = dict(zero), dict(zero), dict(zero)
        self.delta, self.spread = dict.fromkeys(systems, 0.0), dict.fromkeys(systems, 0.0)

    def add(self, values: list[dict[str, float]]) -> None:
        """One prompt's samples' values."""
        self.groups += 1
        tol = self.tol
        for s in self.systems:
            vals = [v[s] for v in values if s in v]
            if len(vals) < 2 or is_tie(max(vals) - min(vals), tol):
                self.no_pair[s] += 1
            if len(vals) >= 2:
                self.spread[s] += max(vals) - min(vals)
                self.spread_n[s] += 1
        for a, b in itertools.combinations(values, 2):
            for s in self.systems:
                if s not in a or s not in b:
                    continue
                d = a[s] - b[s]
                self.delta[s] += abs(d)
                self.n[s] += 1
                self.ties[s] += is_tie(d, tol)
                if s != "numeric" and "numeric" in a and "numeric" in b:
                    sn, ss = _sign(a["numeric"] - b["numeric"], tol), _sign(d, tol)
                    if sn and ss:
                        self.both[s] += 1
                        self.agree[s] += sn == ss

    def result(self, systems: list[str]) -> dict[str, float]:
        out: dict[str, float] = {}
        for s in systems:
            n = self.n[s]
            out[f"tie_rate/{s}"] = self.ties[s] / n if n else math.nan
            out[f"delta/{s}"] = self.delta[s] / n if n else math.nan
            out[f"delta_best_worst/{s}"] = (self.spread[s] / self.spread_n[s] if self.spread_n[s]
                                            else math.nan)
            out[f"no_pair_share/{s}"] = self.no_pair[s] / self.groups if self.groups else math.nan
            out[f"sample_pairs/{s}"] = n
            if s != "numeric":
                out[f"agreement/{s}"] = self.agree[s] / self.both[s] if self.both[s] else math.nan
        return out


class PairStatistics:
    """`pair_statistics` one prompt at a time (`add`, then `result()`): counters, no records."""

    def __init__(self, zeta: float, zetas: list[float], tol: float = 1e-6) -> None:
        self.zeta, self.zetas, self.tol = zeta, list(zetas), tol
        self._base = ["numeric", "wim", "mixed"]
        self._sweep = [f"zeta={z:g}" for z in self.zetas]
        self._all = SystemSummary(self._base + self._sweep, tol)
        self._domains: dict[str, SystemSummary] = {}
        self._present: set[str] = set()

    def add(self, records: list[dict[str, Any]]) -> None:
        values = [system_values(r, self.zeta, self.zetas) for r in records]
        for v in values:
            self._present.update(v)
        self._all.add(values)
        domain = records[0].get("domain") or "none"
        self._domains.setdefault(domain, SystemSummary(self._base, self.tol)).add(values)

    def result(self) -> dict[str, float]:
        systems = [s for s in self._base if s in self._present]
        sweep = [s for s in self._sweep if s in self._present]
        out: dict[str, float] = {}
        for key, value in self._all.result(systems + sweep).items():
            metric, system = key.split("/", 1)
            if system.startswith("zeta="):
                out[f"zeta/{system[5:]}/{metric}"] = value
            else:
                out[f"pairs/{metric}/{system}"] = value
        for domain, summary in sorted(self._domains.items()):
            for key, value in summary.result(systems).items():
                if key.startswith(("tie_rate/", "delta/", "agreement/")):
                    out[f"domain/{domain_key(domain)}/{key}"] = value
        return out


def pair_statistics(
    scored: list[dict[str, Any]], zeta: float, zetas: list[float], tol: float = 1e-6
) -> dict[str, float]:
    """`pairs/...` metrics overall, `zeta/<z>/...` for the sweep, `domain/<d>/...` per domain.
    `tol` is `pairs.tie_tolerance` (1-10 scale), so the report counts ties as the pairs do."""
    stats = PairStatistics(zeta, zetas, tol)
    for records in group_by_prompt(scored).values():
        stats.add(records)
    return stats.result()


class JudgeStatistics:
    """The judge's parse, retry and echo counts, one judgement at a time (`add`)."""

    def __init__(self) -> None:
        self.n = self.failed = self.retried = self.nothing = self.echoed = self.ever = 0
        self.attempts = 0

    def add(self, j: dict[str, Any]) -> None:
        self.n += 1
        self.failed += not j["parse_ok"]
        self.retried += j.get("attempts", 1) > 1
        self.nothing += bool(j["parse_ok"] and j.get("critique") == "")
        self.echoed += ECHOED_RUBRIC in (j.get("parse_error") or "")
        self.ever += j.get("echoed_attempts", 0) > 0
        self.attempts += j.get("attempts", 1)

    def result(self) -> dict[str, float]:
        n = self.n
        return {
            "judge/count": n,
            "judge/parse_failed": self.failed,
            "judge/parse_fail_rate": self.failed / n if n else math.nan,
            "judge/echoed_rubric": self.echoed,
            "judge/echoed_rubric_rate": self.echoed / n if n else math.nan,
            "judge/echoed_rubric_any_attempt": self.ever,
            "judge/echoed_rubric_any_attempt_rate": self.ever / n if n else math.nan,
            "judge/retried": self.retried,
            # Asks per recorded judgement (1 = every verdict parsed at the first attempt).
            "judge/attempts_per_judgement": self.attempts / n if n else math.nan,
            "judge/nothing_missing_rate": self.nothing / n if n else math.nan,
        }
