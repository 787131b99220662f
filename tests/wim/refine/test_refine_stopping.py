"""Stopping rules over a master trajectory, each at its boundary."""

from __future__ import annotations

from wim.config.refine import RefineDynamicConfig
from wim.refine.stopping import (
    Step,
    dynamic,
    dynamic_rule,
    hard_cap,
    vrr_guard,
    vrr_stop,
)
from wim.refine.vrr import VRRParams

P = RefineDynamicConfig(reject_streak=3, window=3, min_progress=0.01, stability_window=3,
                        stability_eps=0.01)
OFF = 10**6  # a window too long to fire


def steps_from(accepted, retained, candidates, accepts=None):
    out, keep = [], 0
    for t, (a, r, c) in enumerate(zip(accepted, retained, candidates, strict=True), start=1):
        keep = t if a else keep
        out.append(Step(a, r, c, keep, None if accepts is None else accepts[t - 1]))
    return out


def test_hard_cap_uses_eight_attempts_and_keeps_the_retained_answer():
    steps = steps_from([True] * 5 + [False] * 5, [0.5] * 10, [0.5] * 10)
    out = hard_cap(steps, 8)
    assert (out.attempts, out.final_index) == (8, 5)


def test_rejection_streak_fires_at_exactly_the_streak():
    p = RefineDynamicConfig(reject_streak=3, window=OFF, stability_window=OFF)
    steps = steps_from([True, False, False, True, False, False, False, True],
                       [0.6] * 8, [0.1, 0.2, 0.3, 0.7, 0.1, 0.2, 0.3, 0.9])
    assert dynamic_rule(steps, 0.5, 3, p) is None  # two rejections only
    out = dynamic(steps, 0.5, 8, p)
    assert out.attempts == 7 and out.final_index == 4
    assert out.reason.startswith("rejection streak")


def test_low_progress_fires_below_min_progress_not_at_it():
    p = RefineDynamicConfig(reject_streak=OFF, window=3, min_progress=0.01, stability_window=OFF)
    accepted = [True, True, True, True]
    # retained after 1..4: 0.6, 0.6, 0.6, 0.61: over attempts 2..4 the rise is 0.01 (= min).
    at = steps_from(accepted, [0.6, 0.6, 0.6, 0.61], [0.6, 0.6, 0.6, 0.61])
    assert dynamic_rule(at, 0.5, 3, p) is None  # 0.6 - 0.5 = 0.1 over attempts 1..3
    assert dynamic_rule(at, 0.5, 4, p) is None
    below = steps_from(accepted, [0.6, 0.6, 0.6, 0.6099], [0.6, 0.6, 0.6, 0.6099])
    reason = dynamic_rule(below, 0.5, 4, p)
    assert reason and reason.startswith("low progress: the retained score rose 0.0099")
    # With the initial score already at 0.595 the first window is too flat.
    assert dynamic_rule(at, 0.595, 3, p).startswith("low progress")


def test_stability_fires_within_eps_inclusive():
    p = RefineDynamicConfig(reject_streak=OFF, window=OFF, stability_window=3, stability_eps=0.01)
    accepted = [True, False, True, False, True]
    steady = steps_from(accepted, [0.5] * 5, [0.3, 0.7, 0.50, 0.505, 0.51])
    assert dynamic_rule(steady, 0.5, 4, p) is None  # 0.7, 0.5, 0.505
    assert dynamic(steady, 0.5, 8, p).attempts == 5
    moving = steps_from(accepted, [0.5] * 5, [0.3, 0.7, 0.50, 0.505, 0.5101])
    out = dynamic(moving, 0.5, 8, p)
    assert out.attempts == 5 and out.reason == "no rule fired before the cap"
    # A failed evaluation (None) in the window blocks the stability rule.
    failed = steps_from(accepted, [0.5] * 5, [0.3, 0.7, 0.50, None, 0.5])
    assert dynamic_rule(failed, 0.5, 5, p) is None


def test_vrr_stop_repairs_while_gain_is_positive_and_stops_at_zero():
    # rho0 = 0.2, rho1 = 0.1, alpha = beta = 0.25: G = 0.25 (1 - 2b), so G > 0 iff b < 0.5.
    p = VRRParams(rho0=0.2, rho1=0.1, alpha=0.25, beta=0.25, m=8, k=5)
    # Round 0: 2 accepts of 8 on A_0 from prior 0.5:
    # b = 0.5 * 0.9^2 0.1^6 / (0.5 * 0.9^2 0.1^6 + 0.5 * 0.2^2 0.8^6) < 0.5: repair.
    # Round 1: the candidate of attempt 1 is retained and gets 7 accepts: b > 0.5: stop.
    steps = steps_from([True, True, True], [0.6, 0.7, 0.8], [0.6, 0.7, 0.8], accepts=[7, 8, 8])
    out = vrr_stop(steps, initial_accepts=2, prior=0.5, p=p)
    assert (out.attempts, out.final_index) == (1, 1)
    assert out.reason.endswith("<= tau=0.0")


def test_vrr_stop_respects_k():
    p = VRRParams(rho0=0.2, rho1=0.1, alpha=0.9, beta=0.0, m=8, k=2)  # G > 0 unless b = 1
    steps = steps_from([False] * 4, [0.5] * 4, [0.5] * 4, accepts=[0] * 4)
    out = vrr_stop(steps, initial_accepts=0, prior=0.5, p=p)
    assert out.attempts == 2 and out.reason == "cap: 2 repairs made"


def test_vrr_guard_replaces_at_exactly_delta():
    p = VRRParams(rho0=0.5, rho1=0.5, alpha=0.1, beta=0.1, m=8, k=5, delta=5)
    steps = steps_from([False] * 5, [0.5] * 5, [0.5] * 5, accepts=[5, 2, 7, 8, 1])
    # A_0 has 1 accept: attempt 1 (5 = 1 + 4) stays out, attempt 2 (2) too, attempt 3 (7 >= 6)
    # replaces it; attempt 4 (8 < 7 + 5) does not.
    out = vrr_guard(steps, initial_accepts=1, p=p)
    assert (out.attempts, out.final_index) == (5, 3)
    out = vrr_guard(steps, initial_accepts=2, p=p)  # 7 = 2 + 5: replaced at the boundary
    assert out.final_index == 3
    out = vrr_guard(steps, initial_accepts=3, p=p)  # 7 < 8; then 8 = 3 + 5 at attempt 4
    assert out.final_index == 4
    out = vrr_guard(steps, initial_accepts=4, p=p)  # 7 < 9, 8 < 9: A_0 stays
    assert out.final_index == 0
