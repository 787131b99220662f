"""VRR-Stop and VRR-Guard (Wu et al., "Verify, Repair, Repeat, or Stop?"): pure functions.

Noise model of a verifier that casts M votes on a plan:
- rho0 = P(accept | invalid), rho1 = P(reject | valid), J = 1 - rho0 - rho1 (how much a vote
  tells about validity; J = 0: nothing);
- a repair fixes an invalid plan with probability alpha and breaks a valid one with beta.
Belief b that the current plan is valid: after S accepts out of M votes, Bayes' rule with the
binomial likelihoods; before the next round's votes, b^- = (1 - beta) b + alpha (1 - b).
Marginal gain of one more repair: G = (1 - b) alpha - b beta; VRR-Stop repairs while G > tau.
VRR-Guard keeps the best incumbent and replaces it only if S(new) >= S(incumbent) + delta.
Calibration: rho0, rho1 by binomial-mixture EM over repeated unlabelled votes; alpha, beta by
counting labelled before/after repairs; then Stop when J >= J_min, else Guard.
Everything works on numpy arrays as well as on floats (the simulation is vectorized).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class VRRParams:
    rho0: float
    rho1: float
    alpha: float
    beta: float
    m: int = 8
    k: int = 5
    tau: float = 0.0
    delta: int = 5


def youden_j(rho0: float, rho1: float) -> float:
    """J = 1 - rho0 - rho1: P(accept | valid) - P(accept | invalid)."""
    return 1.0 - rho0 - rho1


def posterior(prior, accepts, m: int, rho0: float, rho1: float):
    """P(valid | S accepts of m votes) from the prior P(valid)."""
    s, prior = np.asarray(accepts, dtype=float), np.asarray(prior, dtype=float)
    num = prior * ((1 - rho1) ** s * rho1 ** (m - s))
    den = num + (1 - prior) * (rho0 ** s * (1 - rho0) ** (m - s))
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), prior)


def predict(belief, alpha: float, beta: float):
    """Belief after one repair: b^- = (1 - beta) b + alpha (1 - b)."""
    b = np.asarray(belief, dtype=float)
    return (1 - beta) * b + alpha * (1 - b)


def gain(belief, alpha: float, beta: float):
    """Marginal gain of one more repair: G = (1 - b) alpha - b beta."""
    b = np.asarray(belief, dtype=float)
    return (1 - b) * alpha - b * beta


@dataclass(frozen=True)
class StopStep:
    round: int
    accepts: int
    belief: float
    gain: float
    repair: bool
    reason: str


def stop_trace(votes: list[int], prior: float, p: VRRParams) -> list[StopStep]:
    """VRR-Stop over the accepts of successive rounds (round r votes on the plan after r
    repairs). Stops at the first round whose gain is <= tau, or after k repairs; the trace
    ends at that round, so `len(trace) - 1` is the number of repairs made."""
    trace: list[StopStep] = []
    for r, s in enumerate(votes):
        b = float(posterior(prior, s, p.m, p.rho0, p.rho1))
        g = float(gain(b, p.alpha, p.beta))
        if r >= p.k or g <= p.tau:
            reason = f"cap: {p.k} repairs made" if r >= p.k else f"G={g:.4f} <= tau={p.tau}"
            trace.append(StopStep(r, s, b, g, False, reason))
            return trace
        trace.append(StopStep(r, s, b, g, True, f"G={g:.4f} > tau={p.tau}"))
        prior = float(predict(b, p.alpha, p.beta))  # the next round's prior
    return trace


def guard_replaces(s_new, s_incumbent, delta: int):
    """VRR-Guard's rule: the repaired plan replaces the incumbent iff S(new) >= S(inc) + delta."""
    return np.asarray(s_new) >= np.asarray(s_incumbent) + delta


@dataclass(frozen=True)
class VoteCalibration:
    rho0: float
    rho1: float
    prior_valid: float
    iterations: int
    converged: bool


def calibrate_votes(accepts, m: int, labelled: tuple | None = None) -> VoteCalibration:
    """Binomial-mixture EM over the accepts of m votes on each of many plans (no labels).
    Components: valid (accept probability 1 - rho1) and invalid (rho0). The mixture alone cannot
    tell which is which: the component with the higher accept probability is named valid, unless
    `labelled` = (accepts, valid) of a few labelled plans says the verifier prefers invalid plans
    (J < 0), in which case the names are swapped."""
    s = np.asarray(accepts, dtype=float)
    if s.size == 0:
        raise ValueError("no votes to calibrate from")
    w, p1, p0 = 0.5, 0.8, 0.2
    for it in range(1, 501):  # noqa: B007 - the count is reported
        l1 = w * p1 ** s * (1 - p1) ** (m - s)
        l0 = (1 - w) * p0 ** s * (1 - p0) ** (m - s)
        r = l1 / np.maximum(l1 + l0, 1e-300)
        new_w = float(r.mean())
        new_p1 = float((r * s).sum() / max(m * r.sum(), 1e-300))
        new_p0 = float(((1 - r) * s).sum() / max(m * (1 - r).sum(), 1e-300))
        new_p1, new_p0 = min(max(new_p1, 1e-6), 1 - 1e-6), min(max(new_p0, 1e-6), 1 - 1e-6)
        step = max(abs(new_w - w), abs(new_p1 - p1), abs(new_p0 - p0))
        w, p1, p0 = new_w, new_p1, new_p0
        if step < 1e-10:
            break
    if p0 > p1:
        w, p1, p0 = 1 - w, p0, p1
    if labelled is not None and _prefers_invalid(*labelled):
        w, p1, p0 = 1 - w, p0, p1
    return VoteCalibration(rho0=p0, rho1=1 - p1, prior_valid=w, iterations=it,
                           converged=step < 1e-10)


def _prefers_invalid(accepts, valid) -> bool:
    s, v = np.asarray(accepts, dtype=float), np.asarray(valid, dtype=bool)
    return bool(v.any() and not v.all() and s[v].mean() < s[~v].mean())


@dataclass(frozen=True)
class RepairCalibration:
    alpha: float
    beta: float
    n_invalid_before: int
    n_valid_before: int


def calibrate_repairs(valid_before, valid_after) -> RepairCalibration:
    """alpha = share of invalid plans a repair fixed; beta = share of valid ones it broke."""
    before, after = np.asarray(valid_before, dtype=bool), np.asarray(valid_after, dtype=bool)
    n_inv, n_val = int((~before).sum()), int(before.sum())
    if n_inv == 0 or n_val == 0:
        raise ValueError("labelled repairs need both valid and invalid plans before the repair "
                         f"(got {n_val} valid, {n_inv} invalid)")
    return RepairCalibration(alpha=float((~before & after).sum() / n_inv),
                             beta=float((before & ~after).sum() / n_val),
                             n_invalid_before=n_inv, n_valid_before=n_val)


def choose_policy(j: float, j_min: float) -> str:
    """`stop` when the verifier is informative enough (J >= J_min), else `guard`."""
    return "stop" if j >= j_min else "guard"
