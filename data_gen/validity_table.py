"""The validity table: how often each scoring system ranks the better answer of a pair first.
Pure, shared by validity.py and agreement.py: nothing here imports the pipeline, so the pairs
stage can use it without a circle.
"""

from __future__ import annotations

from dataclasses import dataclass

from wim.config import Config
from wim.markdown import fmt_value, markdown_table
from wim.metrics import system_values
from wim.report.evaluation import pval
from wim.scoring import is_tie
from wim.statistics import (
    binomial_p,
    bootstrap_interval,
    bootstrap_note,
    decisive_interval,
    holm,
    mean_test,
)


@dataclass(frozen=True)
class GoldPair:
    """A prompt with an answer known to be better (`chosen`) and a worse one (`rejected`)."""

    id: str
    domain: str
    prompt: str
    chosen: str
    rejected: str


LONGER = "longer answer (reference)"


class RankingOutcomes:
    """Each system's outcome per pair and each pair's domain, a few bytes a pair (an agreement
    adds 100,000 pairs): 1 (the better answer first), 0.5 (a tie), 0 (wrong), None (failed)."""

    def __init__(self, cfg: Config) -> None:
        zetas = {*cfg.scoring.report_zetas, cfg.scoring.zeta, *cfg.eval.compare_zetas}
        self.zeta, self.zetas = cfg.scoring.zeta, sorted(z for z in zetas if 0.0 < z < 1.0)
        self.tolerance = cfg.pairs.tie_tolerance
        names = ["numeric", "wim", *[f"zeta={z:g}" for z in self.zetas]]
        self.by_system: dict[str, list[float | None]] = {s: [] for s in [*names, LONGER]}
        self.domains: list[str] = []
        self._names: dict[str, str] = {}  # one string per domain, not one per pair

    def add(self, domain: str, better: dict | None, worse: dict | None,
            better_chars: int, worse_chars: int) -> None:
        """One pair's scored records (None: not judged) and answer lengths (for LONGER)."""
        a = system_values(better, self.zeta, self.zetas) if better else {}
        b = system_values(worse, self.zeta, self.zetas) if worse else {}
        for s, outcomes in self.by_system.items():
            if s == LONGER:
                outcomes.append(_outcome(better_chars - worse_chars, 0))
            elif s in a and s in b:
                outcomes.append(_outcome(a[s] - b[s], self.tolerance))
            else:
                outcomes.append(None)
        self.domains.append(self._names.setdefault(domain, domain))


def _outcome(gap: float, tolerance: float) -> float:
    return 0.5 if is_tie(gap, tolerance) else (1.0 if gap > 0 else 0.0)


def validity_table(cfg: Config, pairs: list[GoldPair], scored: list[dict]) -> dict:
    """Per system: accuracy (ties half) and its intervals and tests, per domain, and a paired
    test against numeric. `scored`: pair `id` as prompt_id, sample_idx 0 the better, 1 worse."""
    records = {(r["prompt_id"], r["sample_idx"]): r for r in scored}
    outcomes = RankingOutcomes(cfg)
    for p in pairs:
        outcomes.add(p.domain, records.get((p.id, 0)), records.get((p.id, 1)),
                     len(p.chosen), len(p.rejected))
    return outcomes_table(cfg, outcomes)


def outcomes_table(cfg: Config, outcomes: RankingOutcomes) -> dict:
    """`validity_table` from the outcomes themselves."""
    by_system = outcomes.by_system
    out = {s: _row(cfg, outcomes.domains, o) for s, o in by_system.items()}
    tests = {s: paired_vs_numeric(by_system[s], by_system["numeric"])
             for s in by_system if s != "numeric"}
    for s, p in zip(tests, holm([t["diff_p"] for t in tests.values()]), strict=True):
        out[s]["vs_numeric"] = {**tests[s], "diff_p_holm": p}
    return out


def _row(cfg: Config, domains: list[str], outcomes: list[float | None]) -> dict:
    got = [v for v in outcomes if v is not None]
    right, wrong, tie = got.count(1.0), got.count(0.0), got.count(0.5)
    n, seed, resamples = len(got), cfg.seed, cfg.eval.bootstrap_resamples
    by_domain: dict[str, list[float]] = {}
    for domain, v in zip(domains, outcomes, strict=True):
        if v is not None:
            by_domain.setdefault(domain, []).append(v)
    return {
        "n": len(outcomes), "right": right, "wrong": wrong, "ties": tie,
        "failures": len(outcomes) - n,
        "accuracy": (right + 0.5 * tie) / n if n else None,
        "bootstrap_95": bootstrap_interval(got, seed, resamples),
        "bootstrap_note": bootstrap_note(got),
        "decisive_rate": right / (right + wrong) if right + wrong else None,
        "decisive_95": decisive_interval(right, wrong),
        "p_value": binomial_p(right, wrong),
        "strict_accuracy": right / n if n else None,
        "tie_share": tie / n if n else None,
        "by_domain": {d: {"n": len(v), "accuracy": sum(v) / len(v),
                          "bootstrap_95": bootstrap_interval(v, seed, resamples),
                          "bootstrap_note": bootstrap_note(v)}
                      for d, v in sorted(by_domain.items())},
    }


def paired_vs_numeric(system: list[float | None], numeric: list[float | None]) -> dict:
    """One system against numeric on the pairs both scored: the accuracy difference (ties half)
    with the t-test of the per-pair differences and its own 95% interval (why not McNemar:
    docs/design.md, "Held-out evaluation, arms, scorer validity": the exact McNemar test it
    replaced counted only "strictly right", and so called 12 pairs scored as a tie against a
    wrong numeric ranking no difference at all)."""
    both = [(a, b) for a, b in zip(system, numeric, strict=True)
            if a is not None and b is not None]
    diffs = [a - b for a, b in both]
    test = mean_test(diffs, 0.0)
    return {"n": len(both), "accuracy_diff": test["mean"], "diff_95": test["ci95"],
            "diff_p": test["p"], "diff_test": test["test"], "diff_note": test["note"],
            "only_system_right": sum(a == 1.0 and b != 1.0 for a, b in both),
            "only_numeric_right": sum(b == 1.0 and a != 1.0 for a, b in both)}


def systems_table_lines(systems: dict) -> list[str]:
    """The markdown table of `validity_table`'s rows (also the report's agreement table)."""
    return markdown_table(
        ["system", "n", "right", "wrong", "ties", "failures", "accuracy (ties half)",
         "bootstrap 95%", "right / decided (ties out)", "Clopper-Pearson 95%", "sign-test p",
         "tie share", "strict accuracy"],
        [[name, r["n"], r["right"], r["wrong"], r["ties"], r["failures"], fmt_value(r["accuracy"]),
          fmt_value(r["bootstrap_95"]) if r["bootstrap_95"] else (r["bootstrap_note"] or "-"),
          fmt_value(r["decisive_rate"]), fmt_value(r["decisive_95"]), pval(r["p_value"]),
          fmt_value(r["tie_share"]), fmt_value(r["strict_accuracy"])]
         for name, r in systems.items()])


