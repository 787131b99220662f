"""The validity table: how often each scoring system ranks the better answer of a pair first.

Pure functions over scored judgement records (`sample_idx` 0 = the better answer, 1 = the
worse), shared by `wim validity` (data_gen/validity.py, gold pairs) and the agreement with a
source's own labels (data_gen/agreement.py). Nothing here loads a model or imports the
pipeline, so the pairs stage can use it without a circle.
"""

from __future__ import annotations

from dataclasses import dataclass

from wim.config import Config
from wim.metrics import system_values
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


def _zetas(cfg: Config) -> list[float]:
    zs = {*cfg.scoring.report_zetas, cfg.scoring.zeta, *cfg.eval.compare_zetas}
    return sorted(z for z in zs if 0.0 < z < 1.0)


def pair_outcomes(cfg: Config, pairs: list[GoldPair], scored: list[dict]
                  ) -> dict[str, dict[str, float | None]]:
    """{system: {pair id: 1 (chosen ranked first), 0.5 (tie), 0 (wrong) or None (failed)}}."""
    zetas = _zetas(cfg)
    values = {(r["prompt_id"], r["sample_idx"]): system_values(r, cfg.scoring.zeta, zetas)
              for r in scored}
    out: dict[str, dict[str, float | None]] = {}
    for s in ["numeric", "wim", *[f"zeta={z:g}" for z in zetas]]:
        out[s] = {}
        for p in pairs:
            a, b = values.get((p.id, 0), {}).get(s), values.get((p.id, 1), {}).get(s)
            out[s][p.id] = None if a is None or b is None else (
                0.5 if is_tie(a - b, cfg.pairs.tie_tolerance) else float(a > b))
    out[LONGER] = {p.id: 0.5 if len(p.chosen) == len(p.rejected)
                   else float(len(p.chosen) > len(p.rejected)) for p in pairs}
    return out


def validity_table(cfg: Config, pairs: list[GoldPair], scored: list[dict]) -> dict:
    """Per system: accuracy (ties half) with a paired bootstrap interval, the sign test of
    right against wrong with its Clopper-Pearson interval, tie share, strict accuracy, per
    domain (n, accuracy, interval), and a paired test against numeric on the same pairs."""
    outcomes = pair_outcomes(cfg, pairs, scored)
    out = {s: _row(cfg, pairs, o) for s, o in outcomes.items()}
    tests = {s: paired_vs_numeric(cfg, outcomes[s], outcomes["numeric"])
             for s in outcomes if s != "numeric"}
    for s, p in zip(tests, holm([t["diff_p"] for t in tests.values()]), strict=True):
        out[s]["vs_numeric"] = {**tests[s], "diff_p_holm": p}
    return out


def _row(cfg: Config, pairs: list[GoldPair], outcomes: dict[str, float | None]) -> dict:
    got = [v for v in outcomes.values() if v is not None]
    right, wrong, tie = got.count(1.0), got.count(0.0), got.count(0.5)
    n, seed, resamples = len(got), cfg.seed, cfg.eval.bootstrap_resamples
    domains: dict[str, list[float]] = {}
    for p in pairs:
        if outcomes[p.id] is not None:
            domains.setdefault(p.domain, []).append(outcomes[p.id])
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
                      for d, v in sorted(domains.items())},
    }


def paired_vs_numeric(cfg: Config, system: dict[str, float | None],
                      numeric: dict[str, float | None]) -> dict:
    """One system against numeric on the pairs both scored: the accuracy difference (ties
    half), with the one-sample t-test of the per-pair differences against 0 and that test's
    own 95% interval (`mean_test`), so the test, the interval and the difference are about one
    quantity. (An exact McNemar test counted only "strictly right" and called 12 pairs scored
    as a tie against a wrong numeric ranking no difference at all.) The strictly-right
    discordant counts stay as a description."""
    both = [(system[k], numeric[k]) for k in system
            if system[k] is not None and numeric.get(k) is not None]
    diffs = [a - b for a, b in both]
    test = mean_test(diffs, 0.0)
    return {"n": len(both), "accuracy_diff": test["mean"], "diff_95": test["ci95"],
            "diff_p": test["p"], "diff_test": test["test"], "diff_note": test["note"],
            "only_system_right": sum(a == 1.0 and b != 1.0 for a, b in both),
            "only_numeric_right": sum(b == 1.0 and a != 1.0 for a, b in both)}


def systems_table_lines(systems: dict) -> list[str]:
    """The markdown table of `validity_table`'s rows (also the report's agreement table)."""
    lines = ["| system | n | right | wrong | ties | failures | accuracy (ties half) | "
             "bootstrap 95% | right / decided (ties out) | Clopper-Pearson 95% | sign-test p | "
             "tie share | strict accuracy |", "|" + "---|" * 13]
    for name, r in systems.items():
        boot = fmt(r["bootstrap_95"]) if r["bootstrap_95"] else (r["bootstrap_note"] or "-")
        cells = [name, r["n"], r["right"], r["wrong"], r["ties"], r["failures"],
                 fmt(r["accuracy"]), boot, fmt(r["decisive_rate"]), fmt(r["decisive_95"]),
                 fmt_p(r["p_value"]), fmt(r["tie_share"]), fmt(r["strict_accuracy"])]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return lines


def fmt_p(x) -> str:
    return "-" if x is None else f"{x:.3g}"


def fmt(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, list):
        return "[" + ", ".join(f"{v:.3f}" for v in x) + "]"
    return f"{x:.3f}"
