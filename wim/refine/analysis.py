"""Paired comparisons of refinement policies, with Holm correction, and the 2x2 interaction.

Each policy's blind scores are paired by question with a baseline policy's. A comparison uses
the Wilcoxon signed-rank test (scipy; `zero_method="wilcox"` drops zero differences) or the
paired t-test; p-values across the comparisons are Holm-adjusted (statsmodels). A comparison
whose differences are all zero, or that has fewer than two pairs, has no test (p = None) and
says why. The 2x2 design (E_L: same vs cross model) x (stopping: dynamic vs hard cap) is read
per question as four scores; main effects and the interaction contrast
(same_dyn - same_cap) - (cross_dyn - cross_cap) are tested against 0.
"""

from __future__ import annotations

import math

from wim.statistics import holm

GRID_DECIMALS = 9  # the rounding of paired differences (see `paired_test`)


def paired_test(a: list[float], b: list[float], test: str = "wilcoxon") -> dict:
    """Test a vs b paired (same questions): the mean difference a - b and scipy's p-value.
    Blind scores lie on a grid ((N - 1) / 9), but their float differences do not: two equal
    differences come out as distinct floats and a zero as a tiny signed number, so a rank test
    would rank rounding noise. Rounding to GRID_DECIMALS decimals maps them back onto the grid."""
    from scipy import stats

    if len(a) != len(b):
        raise ValueError(f"paired samples differ in length: {len(a)} vs {len(b)}")
    diffs = [round(x - y, GRID_DECIMALS) + 0.0 for x, y in zip(a, b, strict=True)]
    out = {"n": len(diffs), "mean_diff": sum(diffs) / len(diffs) if diffs else None,
           "test": test, "statistic": None, "p": None, "note": ""}
    if len(diffs) < 2:
        return {**out, "note": "fewer than two paired questions"}
    if all(d == 0 for d in diffs):
        return {**out, "note": "all differences are zero"}
    if test == "ttest" and max(diffs) == min(diffs):
        return {**out, "note": "the differences are constant (no variance for a t-test)"}
    if test == "wilcoxon":
        res = stats.wilcoxon(diffs, zero_method="wilcox")
    elif test == "ttest":  # ttest_rel(a, b) is this test of a - b
        res = stats.ttest_1samp(diffs, 0.0)
    else:
        raise ValueError(f"unknown paired test '{test}': expected wilcoxon or ttest")
    out["statistic"], out["p"] = float(res.statistic), float(res.pvalue)
    if math.isnan(out["p"]):
        out["p"], out["note"] = None, "the test is undefined for these differences"
    return out


def add_p_holm(results: dict[str, dict]) -> dict[str, dict]:
    """Add `p_holm` to each result with a p-value (Holm over those), in place; returns it."""
    keys = [k for k, r in results.items() if r.get("p") is not None]
    adjusted = dict(zip(keys, holm([results[k]["p"] for k in keys]), strict=True))
    for k, r in results.items():
        r["p_holm"] = adjusted.get(k)
    return results


def compare_policies(scores: dict[str, list[float | None]], baseline: str,
                     test: str = "wilcoxon") -> dict[str, dict]:
    """Every policy against `baseline`, over the questions where both have a blind score."""
    results = {}
    for name, values in scores.items():
        if name == baseline:
            continue
        pairs = [(x, y) for x, y in zip(values, scores[baseline], strict=True)
                 if x is not None and y is not None]
        results[f"{name} vs {baseline}"] = paired_test([p[0] for p in pairs],
                                                       [p[1] for p in pairs], test)
    return add_p_holm(results)


def interaction_2x2(cells: dict[str, list[float]], test: str = "ttest") -> dict[str, dict]:
    """The 2x2 (E_L same/cross x stopping dynamic/hard cap), one score per question per cell:
    both main effects and the interaction, each a one-sample test of its per-question contrast
    against 0, Holm-adjusted together."""
    need = ("same_dynamic", "same_cap", "cross_dynamic", "cross_cap")
    missing = [k for k in need if k not in cells]
    if missing:
        raise ValueError(f"2x2 cells missing: {', '.join(missing)}")
    n = len(cells["same_dynamic"])
    if any(len(cells[k]) != n for k in need):
        raise ValueError("the four 2x2 cells must hold one score per question each")
    rows = list(zip(*(cells[k] for k in need), strict=True))
    contrasts = {
        "evaluator (same - cross)": [(a + b - c - d) / 2 for a, b, c, d in rows],
        "stopping (dynamic - cap)": [(a - b + c - d) / 2 for a, b, c, d in rows],
        "interaction": [(a - b) - (c - d) for a, b, c, d in rows],
    }
    return add_p_holm({name: paired_test(vals, [0.0] * n, test)
                       for name, vals in contrasts.items()})


# What must be equal in the two arms of the 2x2: anything else would be a confound.
SAME_IN_BOTH_ARMS = {"blind evaluator": ("blind", "model"), "policy": ("policy",),
                     "seed": ("seed",), "attempt cap": ("max_attempts",)}


def _setting(summary: dict, path: tuple[str, ...]):
    value = summary
    for key in path:
        if not isinstance(value, dict) or key not in value:
            raise ValueError(f"a refine summary lacks '{'.'.join(path)}' (written by an older "
                             "wim refine?); run `wim refine` again")
        value = value[key]
    return value


def interaction_from_summaries(same: dict, cross: dict, test: str = "ttest") -> dict:
    """The 2x2 analysis of two `wim refine` summaries on the same prompts: one with the same
    model as E_L (refine.evaluator: same), one with another model (the cross-model arm). The
    two runs must differ only in E_L: same prompts, blind evaluator, policy, seed, cap."""
    if same["per_question"]["prompt_ids"] != cross["per_question"]["prompt_ids"]:
        raise ValueError("the two refine runs must cover the same prompts in the same order")
    for what, path in SAME_IN_BOTH_ARMS.items():
        a, b = _setting(same, path), _setting(cross, path)
        if a != b:
            raise ValueError(f"the two refine runs differ in the {what} ({a!r} vs {b!r}), a "
                             "confound of the E_L effect; run both arms with the same one")
    cells = {f"{arm}_{cell}": summary["per_question"]["blind"][policy]
             for arm, summary in (("same", same), ("cross", cross))
             for policy, cell in (("dynamic", "dynamic"), ("hard_cap", "cap"))}
    n = len(cells["same_dynamic"])
    keep = [i for i in range(n) if all(cells[k][i] is not None for k in cells)]
    results = interaction_2x2({k: [v[i] for i in keep] for k, v in cells.items()}, test)
    return {"questions": len(keep), "dropped_unscored": n - len(keep), "tests": results}
