"""AlpacaEval 2.0's length-controlled win rate (wim/length_control.py) against the same GLM
written here independently: soft labels as two weighted rows per prompt, an L1-penalized
logistic fit without intercept on [tanh(d / s), 1], C chosen from sklearn's 10 default Cs by
GroupKFold(5) over prompts on the soft labels' log loss, each fit solved by scipy's L-BFGS-B
(not liblinear), the rate read as sigmoid(theta_q). (Checked once by hand against
alpaca_eval 0.6.6's own `get_length_controlled_winrate(glm_name="length_controlled_minimal")`
with its Hub download stubbed: equal to 1e-15 on three tables.)"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import minimize
from sklearn.model_selection import GroupKFold

from wim.length_control import length_controlled


def _fit(x, y, w, c):
    """argmin ||theta||_1 + c * sum w_i log(1 + exp(-y_i theta.x_i)), y in {-1, 1}."""
    k = x.shape[1]

    def objective(z):
        theta = z[:k] - z[k:]
        margin = y * (x @ theta)
        loss = np.logaddexp(0, -margin)
        grad_theta = -(c * w * y / (1 + np.exp(margin))) @ x
        return z.sum() + c * (w * loss).sum(), np.concatenate([grad_theta + 1, -grad_theta + 1])

    res = minimize(objective, np.zeros(2 * k), jac=True, method="L-BFGS-B",
                   bounds=[(0, None)] * (2 * k), options={"ftol": 1e-14, "gtol": 1e-10})
    return res.x[:k] - res.x[k:]


def reference_lc(p, len_model, len_base):
    p = np.asarray(p, float)
    d = np.asarray(len_base, float) - np.asarray(len_model, float)
    x = np.column_stack([np.tanh(d / d.std(ddof=1)), np.ones(len(p))])
    n = len(p)
    xx, y = np.vstack([x, x]), np.concatenate([np.ones(n), -np.ones(n)])
    w, groups = np.concatenate([p, 1 - p]), np.concatenate([np.arange(n)] * 2)
    target = np.concatenate([p, p])  # each row's soft label: P(model better)
    losses = []
    for c in np.logspace(-4, 4, 10):
        fold = []
        for train, test in GroupKFold(5).split(xx, y, groups):
            theta = _fit(xx[train], y[train], w[train], c)
            q = np.clip(1 / (1 + np.exp(-xx[test] @ theta)), 1e-15, 1 - 1e-15)
            t = target[test]
            fold.append(-np.mean(t * np.log(q) + (1 - t) * np.log(1 - q)))
        losses.append(np.mean(fold))
    best = np.logspace(-4, 4, 10)[int(np.argmin(losses))]
    theta = _fit(xx, y, w, best)
    return 1 / (1 + np.exp(-theta[1])), theta


@pytest.mark.parametrize("seed", [1, 2])
def test_the_lc_rate_is_alpacaevals_glm(seed):
    rng = np.random.default_rng(seed)
    n = 30
    la, lb = rng.integers(50, 900, n), rng.integers(50, 900, n)
    # A length effect plus a quality edge of 0.1 for the model, as soft preferences.
    p = np.clip(0.6 + 0.25 * np.tanh((la - lb) / 300) + rng.normal(0, 0.15, n), 0, 1)
    ours = length_controlled(list(p), list(la - lb))
    rate, theta = reference_lc(p, la, lb)
    assert ours["lc_win_rate"] == pytest.approx(rate, abs=2e-4)
    assert [ours["theta_len"], ours["theta_q"]] == pytest.approx(list(theta), abs=2e-3)
    # The length term is read at zero: the rate moves away from the raw mean preference.
    assert abs(ours["lc_win_rate"] - p.mean()) > 1e-3


def test_a_preference_explained_by_length_alone_controls_to_one_half():
    # The model's answer is the longer one on 20 of 30 prompts, and the longer one is
    # preferred with probability 0.8 whoever wrote it: a raw 0.6 that is all length.
    la = np.array([400, 400, 100] * 10)
    lb = np.array([100, 100, 400] * 10)
    p = np.where(la > lb, 0.8, 0.2)
    ours = length_controlled(list(p), list(la - lb))
    assert p.mean() == pytest.approx(0.6)
    assert ours["lc_win_rate"] == pytest.approx(0.5, abs=0.02)
    assert ours["theta_len"] < 0  # d = len(base) - len(model): a longer model answer wins


def test_too_few_prompts_for_the_cross_validation():
    out = length_controlled([0.7, 0.6, 0.8], [10.0, -5.0, 3.0])
    assert out["lc_win_rate"] is None and "GroupKFold(5)" in out["lc_note"]
