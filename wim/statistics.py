"""Win-rate statistics for blind comparisons, from scipy and statsmodels.

One comparison is a list of per-prompt outcomes for system a against system b: 1 (a won),
0.5 (tie) or 0 (b won); failed verdicts are left out and counted apart. Reported:
- win rate: mean outcome, ties counted as half;
- Wilson 95% interval of that rate (statsmodels `proportion_confint(method="wilson")`, with
  wins + ties / 2 successes out of the decided-or-tied prompts);
- exact two-sided binomial (sign) test of wins against losses, ties left out
  (`scipy.stats.binomtest`, p = 0.5);
- paired bootstrap 95% interval: prompts resampled with both systems' answers together
  (`scipy.stats.bootstrap`, percentile method, seeded);
- Holm correction over every comparison of one report (statsmodels `multipletests`);
- length-controlled win rate, as AlpacaEval's: a logistic regression of the outcome on
  tanh(length difference / its standard deviation) (statsmodels `Logit`); the predicted win
  rate at zero length difference is sigmoid(intercept).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

MECHANICAL_WARNING = (
    "These numbers come from the bundled 135M models, which cannot really write or judge "
    "answers: they are mechanical (they show the pipeline and the statistics run), not "
    "evidence for or against WIM."
)


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

    @property
    def wins(self) -> int:
        return sum(v == 1.0 for v in self.values)

    @property
    def losses(self) -> int:
        return sum(v == 0.0 for v in self.values)

    @property
    def ties(self) -> int:
        return sum(v == 0.5 for v in self.values)


def outcome_of(winner: str) -> float:
    """'a' -> 1, 'b' -> 0, 'tie' -> 0.5."""
    return {"a": 1.0, "b": 0.0, "tie": 0.5}[winner]


def win_rate(wins: int, losses: int, ties: int) -> float | None:
    n = wins + losses + ties
    return (wins + 0.5 * ties) / n if n else None


def wilson_interval(wins: int, losses: int, ties: int) -> list[float] | None:
    from statsmodels.stats.proportion import proportion_confint

    n = wins + losses + ties
    if not n:
        return None
    lo, hi = proportion_confint(wins + 0.5 * ties, n, alpha=0.05, method="wilson")
    return [float(lo), float(hi)]


def binomial_p(wins: int, losses: int) -> float:
    """Exact two-sided sign test of wins vs losses (ties left out); 1.0 with none decided."""
    from scipy.stats import binomtest

    if wins + losses == 0:
        return 1.0
    return float(binomtest(wins, wins + losses, 0.5).pvalue)


def bootstrap_interval(values: list[float], seed: int = 0,
                       resamples: int = 2000) -> list[float] | None:
    """Percentile 95% interval of the mean outcome over prompts resampled with replacement."""
    from scipy.stats import bootstrap

    if len(values) < 2:
        return None
    data = np.asarray(values, dtype=float)
    if np.all(data == data[0]):
        return [float(data[0]), float(data[0])]  # every resample has the same mean
    res = bootstrap((data,), np.mean, n_resamples=resamples, confidence_level=0.95,
                    method="percentile", rng=np.random.default_rng(seed))
    return [float(res.confidence_interval.low), float(res.confidence_interval.high)]


def holm(pvalues: list[float]) -> list[float]:
    """Holm-adjusted p-values (family-wise error over all of them)."""
    from statsmodels.stats.multitest import multipletests

    if not pvalues:
        return []
    return [float(p) for p in multipletests(pvalues, alpha=0.05, method="holm")[1]]


def length_controlled_win_rate(values: list[float],
                               length_diffs: list[float]) -> tuple[float | None, str | None]:
    """(win rate at zero length difference, note). None with a note when it cannot be fitted."""
    import statsmodels.api as sm
    from statsmodels.tools.sm_exceptions import ConvergenceWarning, PerfectSeparationWarning

    y = np.asarray(values, dtype=float)
    d = np.asarray(length_diffs, dtype=float)
    if len(y) < 3:
        return None, "too few verdicts to fit"
    if np.all(y == y[0]):
        return float(y[0]), "all outcomes equal"
    if np.std(d) == 0:
        return float(y.mean()), "no length variation"
    x = sm.add_constant(np.tanh(d / np.std(d)))
    model = sm.Logit(y, x)
    note = None
    with warnings.catch_warnings():
        warnings.simplefilter("error", PerfectSeparationWarning)
        warnings.simplefilter("error", ConvergenceWarning)
        try:
            params = model.fit(disp=0).params
        except (PerfectSeparationWarning, ConvergenceWarning, np.linalg.LinAlgError):
            params, note = None, "separated; length term L1-regularized"
    if params is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:  # penalize only the length term (alpha 0 on the intercept)
                params = model.fit_regularized(alpha=np.array([0.0, 1.0]), disp=0).params
            except (np.linalg.LinAlgError, ValueError):
                return None, "logistic fit failed"
    intercept = float(params[0])
    if not math.isfinite(intercept):
        return None, "logistic fit failed"
    return 1.0 / (1.0 + math.exp(-intercept)), note


def summarize(name: str, a: str, b: str, outcomes: Outcomes, seed: int = 0,
              resamples: int = 2000) -> dict:
    """One comparison's entry of eval.json (`p_holm` is filled in by `with_holm`)."""
    w, lo, t = outcomes.wins, outcomes.losses, outcomes.ties
    lc, note = length_controlled_win_rate(outcomes.values, outcomes.length_diffs)
    return {
        "name": name, "a": a, "b": b, "n": len(outcomes.values) + outcomes.failures,
        "wins": w, "losses": lo, "ties": t, "failures": outcomes.failures,
        "win_rate": win_rate(w, lo, t), "wilson_95": wilson_interval(w, lo, t),
        "bootstrap_95": bootstrap_interval(outcomes.values, seed, resamples),
        "p_value": binomial_p(w, lo), "p_holm": None, "lc_win_rate": lc, "lc_note": note,
    }


def with_holm(comparisons: list[dict]) -> list[dict]:
    """Fill `p_holm` over every comparison of one report."""
    adjusted = holm([c["p_value"] for c in comparisons])
    return [{**c, "p_holm": p} for c, p in zip(comparisons, adjusted, strict=True)]
