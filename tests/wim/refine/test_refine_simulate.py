"""`wim vrr simulate`: the expected effects, calibration accuracy, and the CLI contract."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import run_wim
from wim.refine.simulate import SimSpec, calibrate_from_logs, simulate
from wim.refine.vrr import VRRParams

# Stress: small alpha, large beta, and a verifier that accepts invalid plans more often than
# valid ones (in this model acceptance can only rise while validity falls when J < 0).
STRESS = dict(pi=0.8, rho0=0.7, rho1=0.4, alpha=0.05, beta=0.5)


def _spec(pi: float, rho0: float, rho1: float, alpha: float, beta: float, **kw) -> SimSpec:
    return SimSpec(pi=pi, vrr=VRRParams(rho0, rho1, alpha, beta), **kw)


def test_stress_fixed_loses_validity_while_acceptance_rises_and_stop_stays_near_best():
    spec = _spec(**STRESS, trials=20000, seed=0)
    res = simulate(spec)
    fixed = res["rounds"]["fixed"]
    assert fixed["validity"][-1] < fixed["validity"][0] - 0.5
    assert fixed["acceptance"][-1] > fixed["acceptance"][0] + 0.1
    best = max(p["validity"] for p in res["policies"].values())
    assert res["policies"]["stop"]["validity"] >= best - 0.02
    assert res["policies"]["stop_calibrated"]["validity"] >= best - 0.03
    assert res["policies"]["fixed"]["repairs"] == 5.0


def test_with_informative_votes_and_good_repairs_stop_beats_none_and_fixed():
    res = simulate(_spec(pi=0.5, rho0=0.2, rho1=0.1, alpha=0.4, beta=0.1, trials=20000))
    v = {k: p["validity"] for k, p in res["policies"].items()}
    assert v["stop"] > v["fixed"] > v["none"]
    assert 0 < res["policies"]["stop"]["repairs"] < 5


def test_with_j_near_zero_guard_does_no_worse_than_none():
    for seed in range(3):
        res = simulate(_spec(pi=0.6, rho0=0.5, rho1=0.49, alpha=0.1, beta=0.4, trials=20000,
                               seed=seed))
        pol = res["policies"]
        assert pol["guard"]["validity"] >= pol["none"]["validity"] - 0.01
        assert pol["fixed"]["validity"] < pol["none"]["validity"] - 0.2  # repairs do hurt here


def test_calibration_from_300_labelled_transitions_lands_within_0_05():
    spec = _spec(pi=0.6, rho0=0.2, rho1=0.15, alpha=0.3, beta=0.2, calib_transitions=300)
    errors = []
    for seed in range(20):
        _, _, cal = calibrate_from_logs(spec, np.random.default_rng(seed))
        errors.append([abs(cal[k] - getattr(spec.vrr, k))
                       for k in ("rho0", "rho1", "alpha", "beta")])
    errors = np.array(errors)
    assert errors[0].max() <= 0.05, errors[0]  # the documented seed
    assert (errors[:, :2] <= 0.05).all()  # EM over 2000 x 8 votes: rho0, rho1 every time
    # alpha and beta come from 150 labelled plans each: standard errors 0.037 and 0.033, so
    # all four land within 0.05 in about two runs of three (0.655 over 200 seeds).
    assert (errors.max(axis=1) <= 0.05).mean() >= 0.5
    assert errors[:, 2:].mean() < 0.04


def test_same_seed_same_numbers_other_seed_other_numbers():
    a = simulate(_spec(**STRESS, trials=2000, seed=5))
    b = simulate(_spec(**STRESS, trials=2000, seed=5))
    c = simulate(_spec(**STRESS, trials=2000, seed=6))
    assert a == b and a["policies"] != c["policies"]


def test_cli_json_and_table():
    args = ["vrr", "simulate", "--pi", "0.8", "--rho0", "0.7", "--rho1", "0.4", "--alpha", "0.05",
            "--beta", "0.5", "--m", "8", "--k", "5", "--delta", "5", "--tau", "0",
            "--trials", "5000", "--seed", "0"]
    out = json.loads(run_wim(args + ["--json"]).stdout)
    # The five policies of wim/refine/simulate.py's docstring, written out (not the module's
    # own tuple, which the output is built from).
    assert list(out) == ["none", "fixed", "stop", "stop_calibrated", "guard"]
    for row in out.values():
        assert set(row) == {"validity", "acceptance", "repairs"}
    assert out["fixed"]["validity"] < out["none"]["validity"]
    assert out["fixed"]["acceptance"] > out["none"]["acceptance"]
    table = run_wim(args).stdout
    assert "per round: true validity / verifier acceptance" in table
    assert table.count("\n") >= 14 and "stop_calibrated" in table


def test_cli_rejects_a_probability_outside_0_1():
    proc = run_wim(["vrr", "simulate", "--beta", "1.5"], check=False)
    assert proc.returncode == 2 and "--beta must lie in [0, 1]" in proc.stderr


def test_cli_calibrate_from_files(tmp_path):
    rng = np.random.default_rng(0)
    valid = rng.random(3000) < 0.5
    accepts = rng.binomial(8, np.where(valid, 0.9, 0.2))
    (tmp_path / "votes.jsonl").write_text(
        "".join(json.dumps({"votes": [1] * int(s) + [0] * (8 - int(s))}) + "\n"
                for s in accepts))
    before = np.arange(400) < 200
    after = np.where(before, rng.random(400) >= 0.1, rng.random(400) < 0.4)
    (tmp_path / "repairs.jsonl").write_text(
        "".join(json.dumps({"valid_before": bool(b), "valid_after": bool(a)}) + "\n"
                for b, a in zip(before, after, strict=True)))
    out = json.loads(run_wim(["vrr", "calibrate", "--votes", str(tmp_path / "votes.jsonl"),
                              "--repairs", str(tmp_path / "repairs.jsonl"), "--json"]).stdout)
    assert out["rho0"] == pytest.approx(0.2, abs=0.03)
    assert out["rho1"] == pytest.approx(0.1, abs=0.03)
    assert out["alpha"] == pytest.approx(0.4, abs=0.08) and out["beta"] == pytest.approx(0.1,
                                                                                       abs=0.06)
    assert out["policy"] == "stop" and out["J"] == pytest.approx(0.7, abs=0.05)


def test_cli_calibrate_names_the_bad_line(tmp_path):
    path = tmp_path / "repairs.jsonl"
    path.write_text('{"valid_before": true, "valid_after": false}\n{"valid_before": "yes"}\n')
    proc = run_wim(["vrr", "calibrate", "--repairs", str(path)], check=False)
    assert proc.returncode == 2 and f"{path}:2: expected booleans" in proc.stderr
