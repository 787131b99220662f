"""AlpacaEval 2.0's length-controlled win rate, its `length_controlled_minimal` GLM.

Written after alpaca_eval 0.6.6, `alpaca_eval/metrics/glm_winrate.py` (`get_length_controlled_
winrate`, `_get_featurized_data`, `fit_LogisticRegressionCV` with `is_ytrue_proba=True`), term by
term:
- per prompt, the preference y in [0, 1] that the model (our system a) beats the baseline (b);
- the length feature tanh(d / s), d = len(baseline answer) - len(model answer) in characters,
  s = d's sample standard deviation (pandas `.std()`, ddof 1; d is not centred);
- logit P(model better) = theta_len * tanh(d / s) + theta_q, with no intercept: theta_q is the
  coefficient of a constant column (`not_gamed_baseline`), so the L1 penalty shrinks it too;
- soft labels as two weighted rows per prompt (label 1 with weight y, label 0 with weight
  1 - y); `LogisticRegressionCV(penalty="l1", solver="liblinear", fit_intercept=False,
  random_state=123)` over sklearn's default 10 Cs, `GroupKFold(5)` with a prompt's two rows in
  one group, scored by the log loss of the soft labels;
- the rate: the mean prediction with the length term set to zero, sigmoid(theta_q). Fewer
  than 5 prompts: no rate. Sklearn's metadata routing (inside `config_context`) passes the
  weights and groups. A test recomputes it with an independent solver; by hand it equalled
  alpaca_eval's own function (Hub download stubbed) to 1e-15.
Their leaderboard GLM (`length_controlled_v1`) adds a per-instruction difficulty and rows of
their own verbose/concise GPT-4 answers, both read from AlpacaEval's 805 instructions by
position: on other prompts it means nothing, so this is the GLM that applies to ours.

Our own heuristic, under its own name: `length_adjusted` (the length-adjusted win rate, kept
for the hard outcomes and its interval) is a logistic regression of the outcome on
tanh(length difference / its standard deviation) (statsmodels `Logit`), read at zero length
difference, with the fitted slope and a paired bootstrap interval (200 resamples, each
refitted). Unlike AlpacaEval's GLM it has no cross-validated L1 (only under separation is the
length term L1-penalized) and reads hard outcomes: the slope is fitted on the a-vs-b prompts
alone, where length and quality are confounded, so on a few dozen prompts it is noise (the
note says so below 50 verdicts).
"""

from __future__ import annotations

import math
import warnings

import numpy as np

N_SPLITS = 5
RANDOM_STATE = 123
MIN_PROMPTS = N_SPLITS
"""GroupKFold(5) needs at least five prompts."""


def _soft_log_loss(y_true, y_pred, true_prob):
    """alpaca_eval's `logloss_continuous` (unweighted): the log loss of each row's soft label."""
    target = np.where(np.asarray(y_true) == 1, true_prob, 1 - true_prob)
    pred = np.clip(y_pred, 1e-15, 1 - 1e-15)
    return -np.mean(target * np.log(pred) + (1 - target) * np.log(1 - pred))


def length_controlled(preferences: list[float], length_diffs: list[float]) -> dict:
    """{"lc_win_rate", "theta_len", "theta_q", "lc_note"} for system a (the model) against b
    (the baseline), from each prompt's preference for a and len(a) - len(b) in characters;
    the rate is None, with a note, when the GLM cannot be fitted."""
    import sklearn
    from sklearn.linear_model import LogisticRegressionCV
    from sklearn.metrics import make_scorer
    from sklearn.model_selection import GroupKFold

    out = {"lc_win_rate": None, "theta_len": None, "theta_q": None, "lc_note": None}
    y = np.asarray(preferences, float)
    d = -np.asarray(length_diffs, float)  # len(baseline) - len(model), as theirs
    if len(y) < MIN_PROMPTS:
        return {**out, "lc_note": f"{len(y)} prompt(s): GroupKFold({N_SPLITS}) needs "
                                  f"{MIN_PROMPTS}"}
    s = float(np.std(d, ddof=1))
    length = np.tanh(d / s) if s > 0 else np.zeros_like(d)
    n = len(y)
    x2 = np.tile(np.column_stack([length, np.ones_like(length)]), (2, 1))
    labels = np.concatenate([np.ones(n), np.zeros(n)]).astype(int)
    true_prob = np.concatenate([y, 1 - y])
    groups = np.concatenate([np.arange(n), np.arange(n)])
    if np.all(true_prob[:n] == true_prob[0]) and y[0] in (0.0, 1.0):
        return {**out, "lc_note": "every preference is " + f"{y[0]:g}: nothing to fit"}
    with sklearn.config_context(enable_metadata_routing=True), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sklearn 1.9's FutureWarning on `penalty=`
        scorer = make_scorer(_soft_log_loss, response_method="predict_proba",
                             greater_is_better=False).set_score_request(true_prob=True)
        model = LogisticRegressionCV(cv=GroupKFold(n_splits=N_SPLITS), scoring=scorer,
                                     penalty="l1", solver="liblinear", dual=False,
                                     fit_intercept=False, random_state=RANDOM_STATE)
        model.set_fit_request(sample_weight=True)
        model.fit(x2, labels, sample_weight=true_prob, groups=groups, true_prob=true_prob)
    theta_len, theta_q = (float(v) for v in model.coef_[0])
    return {"lc_win_rate": 1.0 / (1.0 + math.exp(-theta_q)), "theta_len": theta_len,
            "theta_q": theta_q,
            "lc_note": None if s > 0 else "no length difference: the length term is zero"}


LENGTH_MIN_N = 50
LENGTH_RESAMPLES = 200
"""Bootstrap resamples of the length-adjusted rate (each one refits the regression)."""


def _fit_length(y: np.ndarray, d: np.ndarray) -> tuple[float | None, float | None, str | None]:
    """(rate at zero length difference, slope, note) of one logistic fit."""
    import statsmodels.api as sm
    from statsmodels.tools.sm_exceptions import ConvergenceWarning, PerfectSeparationWarning

    if np.all(y == y[0]):
        return float(y[0]), None, "all outcomes equal"
    if np.std(d) == 0:
        return float(y.mean()), None, "no length variation"
    model = sm.Logit(y, sm.add_constant(np.tanh(d / np.std(d))))
    note = None
    with warnings.catch_warnings():
        warnings.simplefilter("error", PerfectSeparationWarning)
        warnings.simplefilter("error", ConvergenceWarning)
        try:
            params = model.fit(disp=0).params
        except (PerfectSeparationWarning, ConvergenceWarning, np.linalg.LinAlgError):
            note = "separated; length term L1-regularized"
            warnings.simplefilter("ignore")  # ahead of the two "error" filters
            try:  # penalize only the length term (alpha 0 on the intercept); 50 iterations
                # agree with the default 1000 to 3 decimals at 1/20 of the time
                params = model.fit_regularized(alpha=np.array([0.0, 1.0]), disp=0,
                                                maxiter=50).params
            except (np.linalg.LinAlgError, ValueError):
                return None, None, "logistic fit failed"
    intercept, slope = float(params[0]), float(params[1])
    if not math.isfinite(intercept):
        return None, None, "logistic fit failed"
    return 1.0 / (1.0 + math.exp(-intercept)), slope, note


def length_adjusted_win_rate(values: list[float],
                             length_diffs: list[float]) -> tuple[float | None, str | None]:
    """(win rate at zero length difference, note). None with a note when it cannot be fitted."""
    if len(values) < 3:
        return None, "too few verdicts to fit"
    rate, _, note = _fit_length(np.asarray(values, float), np.asarray(length_diffs, float))
    return rate, note


def length_adjusted(values: list[float], length_diffs: list[float], seed: int = 0,
                    resamples: int = LENGTH_RESAMPLES) -> dict:
    """The length-adjusted rate, its slope, a paired bootstrap interval (prompts resampled
    with their length differences; each resample refits) and a note on what it is worth."""
    y, d = np.asarray(values, float), np.asarray(length_diffs, float)
    out = {"length_adjusted_win_rate": None, "length_slope": None, "length_adjusted_95": None,
           "length_note": None}
    if len(y) < 3:
        return {**out, "length_note": "too few verdicts to fit"}
    rate, slope, note = _fit_length(y, d)
    out.update(length_adjusted_win_rate=rate, length_slope=slope)
    if rate is not None and slope is not None:
        from scipy.stats import bootstrap

        def statistic(ys, ds):
            r = _fit_length(ys, ds)[0]
            return np.nan if r is None else r

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # degenerate resamples, e.g. a NaN from a failed fit
            res = bootstrap((y, d), statistic, paired=True, vectorized=False,
                            n_resamples=resamples, method="percentile",
                            rng=np.random.default_rng(seed))
        lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
        out["length_adjusted_95"] = [lo, hi] if math.isfinite(lo) and math.isfinite(hi) else None
    notes = [note] if note else []
    if len(y) < LENGTH_MIN_N:
        notes.append(f"n = {len(y)} < {LENGTH_MIN_N}: the slope is fitted on these prompts "
                     "alone, where length and quality are confounded; too few for it to mean "
                     "anything")
    out["length_note"] = "; ".join(notes) or None
    return out
