"""Win-rate statistics for blind comparisons, from scipy and statsmodels.

One comparison is a list of per-prompt outcomes for system a against system b: 1 (a won),
0.5 (tie) or 0 (b won); failed verdicts are left out and counted apart. Each number is named
for the rate it is about, and every interval is the interval of that rate:
- sign test: exact binomial test of wins against losses, ties left out, with ITS interval:
  `decisive_rate` = wins / (wins + losses) and `decisive_95`, that rate's exact
  Clopper-Pearson interval. For p = 0.5 the two-sided p is twice the smaller tail, so
  p < 0.05 exactly when 0.5 is outside it (a test checks every record up to n = 40);
- win rate: mean outcome, ties counted as half, with `bootstrap_95`, the paired bootstrap
  interval (prompts resampled with both systems' answers together, seeded). An outcome of 0,
  1/2 or 1 is not a yes/no, so no binomial interval fits this rate (a Wilson interval on
  wins + ties/2 once contradicted the test both ways). When every outcome is equal
  there is no interval (None, and a note saying so);
- Holm correction over every comparison of one report, and the power of the design: the
  smallest p any result could reach with n prompts (`min_attainable_p`) and its Holm-adjusted
  value over m comparisons;
- sensitivity: the win rate with failed verdicts counted as losses, and as wins;
- weighted preference (the lead number of `wim eval`): per prompt p in [0, 1], the evaluator's
  probability that a is better averaged over both orders (wim/blind.py). `mean_test`: the
  one-sample t-test of the mean p against 0.5 with ITS t interval of the mean, so p < 0.05
  exactly when 0.5 is outside the 95% interval. Not Wilcoxon's signed-rank test: it tests a
  pseudo-median, whose interval (Hodges-Lehmann) is of another quantity than the mean reported.
  `weighted_power`: what the t-test could detect at this n;
- length-adjusted win rate: wim/length_control.py (our heuristic and AlpacaEval 2.0's GLM).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from wim.length_control import LENGTH_RESAMPLES, length_adjusted, length_controlled

MECHANICAL_WARNING = (
    "These numbers come from the bundled 135M models, which cannot really write or judge "
    "answers: they are mechanical (they show the pipeline and the statistics run), not "
    "evidence for or against WIM."
)
ALPHA = 0.05


def is_bundled(name: str | None) -> bool:
    return bool(name) and str(name).startswith("bundled:")


@dataclass(frozen=True)
class Outcomes:
    """Per-prompt results of a against b."""

    values: list[float]
    """1 = a won, 0.5 = tie, 0 = b won; failed verdicts are not in here."""
    length_diffs: list[float]
    """len(answer a) - len(answer b) in characters, one per value."""
    failures: int = 0
    tie_kinds: list[str] = field(default_factory=list)
    """One per tie: `real` (the evaluator said tie), `order_disagreement` (the two orders named
    different answers) or `identical` (the same answer twice, never asked)."""
    order_agreement: list[bool] = field(default_factory=list)
    """Per prompt asked in both orders with both parsed: did the orders agree?"""
    preferences: list[float] = field(default_factory=list)
    """Per prompt of `values`: the weighted preference for a in [0, 1] (wim/blind.py)."""
    order_preferences: list[tuple[float, float] | None] = field(default_factory=list)
    """Per prompt of `values`: P(a better) in order a/b and in order b/a (None: pointwise)."""
    sources: list[str] = field(default_factory=list)
    """Per prompt of `values`: `guided` or `top_logprobs` (both orders' probabilities came from
    there), `hard` (an order gave none: its verdict counted as 1), `identical` or `pointwise`."""
    prompt_ids: list[str] = field(default_factory=list)


def outcome_of(winner: str) -> float:
    return {"a": 1.0, "b": 0.0, "tie": 0.5}[winner]


def win_rate(wins: int, losses: int, ties: int) -> float | None:
    n = wins + losses + ties
    return (wins + 0.5 * ties) / n if n else None


def binomial_p(wins: int, losses: int) -> float:
    """Exact two-sided sign test of wins vs losses (ties left out); 1.0 with none decided."""
    from scipy.stats import binomtest

    if wins + losses == 0:
        return 1.0
    return float(binomtest(wins, wins + losses, 0.5).pvalue)


def decisive_interval(wins: int, losses: int) -> list[float] | None:
    """Clopper-Pearson 95% interval of wins / (wins + losses): the sign test's own interval."""
    from scipy.stats import binomtest

    if wins + losses == 0:
        return None
    ci = binomtest(wins, wins + losses, 0.5).proportion_ci(0.95, method="exact")
    return [float(ci.low), float(ci.high)]


def bootstrap_interval(values: list[float], seed: int = 0,
                       resamples: int = 2000) -> list[float] | None:
    """Percentile 95% interval of the mean outcome over prompts resampled with replacement;
    None with fewer than two values or when all are equal (see `bootstrap_note`)."""
    from scipy.stats import bootstrap

    data = np.asarray(values, dtype=float)
    if len(data) < 2 or np.all(data == data[0]):
        return None
    # In batches of about a million resampled values: all at once holds resamples x n floats
    # (2,000 x 400k pairs: 6 GB); the interval is the same, the resamples drawn in order.
    res = bootstrap((data,), np.mean, n_resamples=resamples, confidence_level=0.95,
                    method="percentile", rng=np.random.default_rng(seed),
                    batch=max(1, 1_000_000 // len(data)))
    return [float(res.confidence_interval.low), float(res.confidence_interval.high)]


def bootstrap_note(values: list[float]) -> str | None:
    """Why there is no bootstrap interval, when there is none."""
    if len(values) < 2:
        return f"{len(values)} verdict(s): too few for an interval"
    if all(v == values[0] for v in values):
        what = {1.0: "wins", 0.0: "losses", 0.5: "ties"}.get(values[0], f"{values[0]:g}")
        return (f"all {len(values)} outcomes are equal ({what}): no interval; a resampled "
                "mean cannot vary, which is not certainty")
    return None


def holm(pvalues: list[float]) -> list[float]:
    """Holm-adjusted p-values (family-wise error over all of them)."""
    from statsmodels.stats.multitest import multipletests

    if not pvalues:
        return []
    return [float(p) for p in multipletests(pvalues, alpha=ALPHA, method="holm")[1]]


def min_attainable_p(n: int) -> float:
    """The smallest two-sided sign-test p with n prompts: all n decided the same way."""
    return binomial_p(n, 0)


def min_attainable_p_holm(n: int, m: int) -> float:
    """The smallest Holm-adjusted p of m comparisons on n prompts each (the smallest p x m)."""
    return min(1.0, max(m, 1) * min_attainable_p(n))


def prompts_needed(m: int, alpha: float = ALPHA, most: int = 10_000) -> int:
    """The fewest prompts with which any of m Holm-adjusted comparisons can reach p < alpha
    (every prompt won by the same side: the bare minimum, not a power calculation)."""
    n = 1
    while min_attainable_p_holm(n, m) >= alpha and n < most:
        n += 1
    return n


def power_statement(n: int, m: int) -> str:
    """The first line a reader needs: can a result of this size be significant at all?"""
    p = min_attainable_p_holm(n, m)
    what = f"{n} prompt(s) and {m} comparison(s)"
    if p >= ALPHA:
        return (f"No result of this size can be significant: with {what} the smallest "
                f"attainable Holm-adjusted p is {p:.3g} (every prompt won by one side). It "
                f"would take at least {prompts_needed(m)} prompts, and more for a real effect "
                "that is not all-or-nothing.")
    return (f"Power: with {what} the smallest attainable Holm-adjusted p is {p:.3g}, so "
            "significance is possible, but only for a large effect on so few prompts.")


def sensitivity(wins: int, losses: int, ties: int, failures: int) -> dict[str, float | None]:
    """The win rate (ties half) over every prompt, failures counted as losses or as wins."""
    n = wins + losses + ties + failures
    if not n:
        return {"failures_as_losses": None, "failures_as_wins": None}
    return {"failures_as_losses": (wins + 0.5 * ties) / n,
            "failures_as_wins": (wins + failures + 0.5 * ties) / n}


def summarize_comparison(name: str, a: str, b: str, outcomes: Outcomes, seed: int = 0,
              resamples: int = 2000) -> dict:
    """One comparison's entry of eval.json (`p_holm` is filled in by `with_holm`)."""
    w, lo, t = (outcomes.values.count(v) for v in (1.0, 0.0, 0.5))
    f = outcomes.failures
    kinds = outcomes.tie_kinds
    agree = outcomes.order_agreement
    return {
        "name": name, "a": a, "b": b, "n": len(outcomes.values) + f,
        "wins": w, "losses": lo, "ties": t, "failures": f,
        "ties_split": {k: kinds.count(k) for k in ("real", "order_disagreement", "identical")}
        if kinds else None,
        "order_agreement": sum(agree) / len(agree) if agree else None,
        "orders_compared": len(agree),
        "p_value": binomial_p(w, lo),
        "decisive_rate": w / (w + lo) if w + lo else None,
        "decisive_95": decisive_interval(w, lo),
        "p_holm": None,
        "win_rate": win_rate(w, lo, t),
        "bootstrap_95": bootstrap_interval(outcomes.values, seed, resamples),
        "bootstrap_note": bootstrap_note(outcomes.values),
        "sensitivity": sensitivity(w, lo, t, f),
        **length_adjusted(outcomes.values, outcomes.length_diffs, seed,
                          min(resamples, LENGTH_RESAMPLES)),
        "decisive_statement": decisive_statement(w, lo),
        "weighted": weighted_summary(outcomes) if outcomes.preferences else None,
    }


def weighted_summary(outcomes: Outcomes) -> dict:
    """The weighted preference of one comparison: mean p tested against 0.5 (`mean_test`),
    AlpacaEval 2.0's length-controlled rate on the same p, and the per-prompt values."""
    prefs = outcomes.preferences
    test = mean_test(prefs, 0.5)
    sources = outcomes.sources
    per_prompt = [{"prompt_id": i, "p": p, "p_ab": o[0] if o else None,
                   "p_ba": o[1] if o else None, "source": src}
                  for i, p, o, src in zip(outcomes.prompt_ids, prefs, outcomes.order_preferences,
                                          sources, strict=True)]
    return {"preference": test["mean"], "ci95": test["ci95"], "p_value": test["p"],
            "p_holm": None, "test": test["test"], "note": test["note"], "sd": test["sd"],
            "n": len(prefs),
            "sources": {k: sources.count(k) for k in sorted(set(sources))},
            "hard_fallback": sources.count("hard"),
            **length_controlled(prefs, outcomes.length_diffs[:len(prefs)]),
            "per_prompt": per_prompt}


def with_holm(comparisons: list[dict]) -> list[dict]:
    """Fill `p_holm`: Holm over one report's sign tests, and over its weighted tests if any."""
    adjusted = holm([c["p_value"] for c in comparisons])
    out = [{**c, "p_holm": p} for c, p in zip(comparisons, adjusted, strict=True)]
    if all(c.get("weighted") for c in out):
        weighted = holm([c["weighted"]["p_value"] for c in out])
        out = [{**c, "weighted": {**c["weighted"], "p_holm": p}}
               for c, p in zip(out, weighted, strict=True)]
    return out


def mean_test(values: list[float], null: float = 0.5) -> dict:
    """The two-sided one-sample t-test of the mean against `null`, with its 95% t interval.
    Without spread the t statistic is undefined: all values at `null` give p = 1; all on one
    side give the exact sign test's p and no interval, with a note."""
    from scipy.stats import ttest_1samp

    x = np.asarray(values, float)
    n = len(x)
    out = {"mean": float(x.mean()) if n else None, "ci95": None, "p": 1.0,
           "sd": float(x.std(ddof=1)) if n > 1 else None, "test": "one-sample t-test",
           "note": None}
    if n < 2:
        return {**out, "note": f"{n} prompt(s): too few for a test"}
    if np.all(x == x[0]):
        if x[0] == null:
            return {**out, "ci95": [float(null), float(null)],
                    "note": f"every value is {null:g}: no difference"}
        return {**out, "p": binomial_p(n, 0), "test": "sign test (no spread)",
                "note": f"every value is {x[0]:g}: no spread, so no t interval; p is the exact "
                        "sign test's (all on one side)"}
    res = ttest_1samp(x, null)
    ci = res.confidence_interval(0.95)
    return {**out, "p": float(res.pvalue), "ci95": [float(ci.low), float(ci.high)]}


def _t_test_power(size: float, n: int, level: float) -> float:
    """The two-sided one-sample t-test's power at standardized effect `size` with n samples.
    scipy's noncentral t (under statsmodels) returns NaN far in its tail (a tiny sd); there
    the normal approximation around its noncentrality stands in."""
    from scipy import stats
    from statsmodels.stats.power import TTestPower

    power = float(TTestPower().power(size, n, level, alternative="two-sided"))
    if math.isnan(power):
        critical, shift = float(stats.t.ppf(1 - level / 2, n - 1)), size * math.sqrt(n)
        power = float(stats.norm.cdf(shift - critical) + stats.norm.cdf(-shift - critical))
    return power


def weighted_power(n: int, sd: float | None, m: int, effect: float = 0.1,
                   alpha: float = ALPHA) -> dict:
    """The t-test's power against a true mean preference 0.5 + `effect` at Holm's strictest
    level alpha / m (n prompts, spread `sd`), and the prompts that 80% power would take."""
    from statsmodels.stats.power import TTestPower

    if n < 2 or not sd:
        return {"weighted_power": None, "weighted_prompts_80": None,
                "weighted_power_statement": "No power statement for the weighted test: too "
                "few prompts or no spread in the preferences."}
    level, size = alpha / max(m, 1), effect / sd
    power = _t_test_power(size, n, level)
    needed = float(TTestPower().solve_power(size, None, level, 0.8, "two-sided"))
    if not math.isfinite(needed):  # the solver fails where the power function does (below)
        needed = next(k for k in range(2, 1_000_000) if _t_test_power(size, k, level) >= 0.8)
    needed = math.ceil(needed)
    return {"weighted_power": power, "weighted_prompts_80": needed,
            "weighted_power_statement": (
                f"Power of the weighted test: with {n} prompts, the observed spread of the "
                f"preferences (sd {sd:.3f}) and {m} comparison(s) (Holm's strictest level "
                f"{level:.3g}), a true mean preference of {0.5 + effect:g} would be found "
                f"with probability {power:.2f}; 80% would take about {needed} prompts.")}


def decisive_statement(wins: int, losses: int) -> str:
    """After the results: what the sign test could reach with the prompts it counted."""
    k = wins + losses
    return (f"With {k} decisive prompt(s) ({wins} wins, {losses} losses; ties left out) the "
            f"smallest sign-test p was {min_attainable_p(k):.3g}.")


def power_of(n_prompts: int, comparisons: int) -> dict:
    """eval.json / compare.json keys stating what the design could ever show."""
    return {"min_attainable_p": min_attainable_p(n_prompts),
            "min_attainable_p_holm": min_attainable_p_holm(n_prompts, comparisons),
            "prompts_needed_holm": prompts_needed(comparisons),
            "power_statement": power_statement(n_prompts, comparisons)}
