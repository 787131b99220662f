"""The VRR belief filter, gain, Guard rule and calibration, against hand computations."""

from __future__ import annotations

import numpy as np
import pytest

from wim.refine.vrr import (
    VRRParams,
    calibrate_repairs,
    calibrate_votes,
    choose_policy,
    gain,
    guard_replaces,
    posterior,
    predict,
    stop_trace,
    youden_j,
)


def test_posterior_after_six_of_eight_accepts():
    # P(valid) = 0.5 * 0.9^6 0.1^2 / (0.5 * 0.9^6 0.1^2 + 0.5 * 0.2^6 0.8^2)
    #          = 0.00531441 / (0.00531441 + 0.00004096) = 0.992351...
    b = posterior(0.5, 6, 8, rho0=0.2, rho1=0.1)
    assert float(b) == pytest.approx(0.00531441 / 0.00535537, abs=1e-12)
    assert float(b) == pytest.approx(0.9923515, abs=1e-6)


def test_posterior_with_a_skewed_prior_and_no_accepts():
    # prior 0.7, 0 of 2 accepts, rho0 = 0.3, rho1 = 0.4: 0.7 * 0.16 / (0.7 * 0.16 + 0.3 * 0.49)
    assert float(posterior(0.7, 0, 2, 0.3, 0.4)) == pytest.approx(0.112 / (0.112 + 0.147))


def test_uninformative_votes_leave_the_belief_alone():
    assert float(posterior(0.3, 5, 8, rho0=0.5, rho1=0.5)) == pytest.approx(0.3)
    assert youden_j(0.5, 0.5) == 0.0


def test_predict_and_gain_by_hand():
    assert float(predict(0.2, alpha=0.4, beta=0.1)) == pytest.approx(0.9 * 0.2 + 0.4 * 0.8)
    assert float(gain(0.2, alpha=0.4, beta=0.1)) == pytest.approx(0.8 * 0.4 - 0.2 * 0.1)


def test_stop_at_zero_gain_repair_above():
    p = VRRParams(rho0=0.5, rho1=0.5, alpha=0.25, beta=0.25, tau=0.0)  # J = 0: b stays prior
    assert [s.repair for s in stop_trace([4], 0.5, p)] == [False]  # G = 0 <= tau
    trace = stop_trace([4, 4], 0.4999, p)  # G = 0.25 * (1 - 2 * 0.4999) > 0: one repair
    assert trace[0].repair and trace[0].gain == pytest.approx(0.25 * 0.0002)
    # after the repair b^- = 0.75 * 0.4999 + 0.25 * 0.5001 = 0.4999 + 0.0001 * ... < 0.5
    assert trace[1].belief == pytest.approx(0.75 * 0.4999 + 0.25 * 0.5001)


def test_guard_rule_boundary():
    assert bool(guard_replaces(7, 2, 5)) and not bool(guard_replaces(6, 2, 5))
    np.testing.assert_array_equal(guard_replaces([5, 6], [0, 2], 5), [True, False])


def test_em_recovers_rho_from_unlabelled_votes():
    rng = np.random.default_rng(3)
    valid = rng.random(4000) < 0.6
    votes = rng.binomial(8, np.where(valid, 1 - 0.15, 0.25))
    cal = calibrate_votes(votes, 8)
    assert cal.converged
    assert cal.rho0 == pytest.approx(0.25, abs=0.02)
    assert cal.rho1 == pytest.approx(0.15, abs=0.02)
    assert cal.prior_valid == pytest.approx(0.6, abs=0.03)


def test_em_orientation_follows_labelled_plans_when_the_verifier_prefers_invalid():
    rng = np.random.default_rng(4)
    valid = rng.random(4000) < 0.5
    votes = rng.binomial(8, np.where(valid, 0.3, 0.8))  # rho1 = 0.7, rho0 = 0.8: J = -0.5
    blind = calibrate_votes(votes, 8)
    assert blind.rho0 == pytest.approx(0.3, abs=0.03)  # named by accept rate: wrong way round
    labels = rng.random(200) < 0.5
    lab_votes = rng.binomial(8, np.where(labels, 0.3, 0.8))
    cal = calibrate_votes(votes, 8, labelled=(lab_votes, labels))
    assert cal.rho0 == pytest.approx(0.8, abs=0.03) and cal.rho1 == pytest.approx(0.7, abs=0.03)


def test_repair_calibration_counts():
    before = [True, True, True, True, False, False, False, False, False]
    after = [True, False, True, True, True, False, True, False, False]
    cal = calibrate_repairs(before, after)
    assert (cal.alpha, cal.beta) == (2 / 5, 1 / 4)
    with pytest.raises(ValueError, match="both valid and invalid"):
        calibrate_repairs([True, True], [True, False])


def test_choose_stop_or_guard_at_j_min():
    assert choose_policy(0.2, 0.2) == "stop" and choose_policy(0.1999, 0.2) == "guard"
