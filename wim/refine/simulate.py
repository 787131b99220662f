"""`wim vrr simulate`: a synthetic verify-repair loop with known noise, vectorized over trials.

The model (issue 12): a plan is valid with probability pi at the start; each round the verifier
casts m votes, each accepting with 1 - rho1 if the plan is valid and rho0 if not (S = accepts);
a repair makes an invalid plan valid with alpha and a valid one invalid with beta. Policies:
- none: commits the first plan;
- fixed: repairs every round for k rounds, whatever the votes;
- stop: the belief filter from the prior pi; repairs while G > tau, at most k times;
- stop_calibrated: the same with rho0, rho1 (and the prior) estimated by binomial-mixture EM
  over simulated unlabelled votes, and alpha, beta from simulated labelled repairs;
- guard: k rounds, each repairing the incumbent; the repair replaces it iff
  S(new) >= S(incumbent) + delta.
Acceptance is a strict majority (S > m / 2) of the committed plan's last votes. Round r of the
per-round table shows the plan held after round r's votes (a stopped policy keeps its plan).
Note: in this model acceptance can rise while validity falls only if the verifier prefers
invalid plans (P(majority | invalid) > P(majority | valid), i.e. J < 0).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from wim.refine.vrr import (
    VRRParams,
    calibrate_repairs,
    calibrate_votes,
    gain,
    guard_replaces,
    posterior,
    predict,
    youden_j,
)

POLICIES = ("none", "fixed", "stop", "stop_calibrated", "guard")


@dataclass(frozen=True)
class SimSpec:
    pi: float
    """P(the first answer is valid)."""
    vrr: VRRParams
    """The true verifier noise, repair rates and the policies' settings (m, k, tau, delta)."""
    trials: int = 10000
    seed: int = 0
    calib_plans: int = 2000
    """Plans whose m unlabelled votes feed the EM of stop_calibrated."""
    calib_transitions: int = 300
    """Labelled before/after repairs for alpha and beta (half valid, half invalid before)."""


class _World:
    """The plans' true validity, the verifier and the repairs, drawn from one seeded stream."""

    def __init__(self, spec: SimSpec, rng: np.random.Generator) -> None:
        self.spec, self.rng = spec, rng

    def start(self, n: int) -> np.ndarray:
        return self.rng.random(n) < self.spec.pi

    def votes(self, valid: np.ndarray) -> np.ndarray:
        p = np.where(valid, 1 - self.spec.vrr.rho1, self.spec.vrr.rho0)
        return self.rng.binomial(self.spec.vrr.m, p)

    def repair(self, valid: np.ndarray) -> np.ndarray:
        u = self.rng.random(valid.shape)
        return np.where(valid, u >= self.spec.vrr.beta, u < self.spec.vrr.alpha)


def calibrate_from_logs(spec: SimSpec, rng: np.random.Generator) -> tuple[VRRParams, float, dict]:
    """Estimated VRRParams and prior from simulated logs (see SimSpec.calib_*)."""
    world = _World(spec, rng)
    votes = world.votes(world.start(spec.calib_plans))
    n = spec.calib_transitions
    before = np.arange(n) < n // 2
    rep = calibrate_repairs(before, world.repair(before))
    cal = calibrate_votes(votes, spec.vrr.m, labelled=(world.votes(before), before))
    est = dataclasses.replace(spec.vrr, rho0=cal.rho0, rho1=cal.rho1, alpha=rep.alpha,
                              beta=rep.beta)
    info = {"rho0": cal.rho0, "rho1": cal.rho1, "prior_valid": cal.prior_valid,
            "alpha": rep.alpha, "beta": rep.beta, "em_iterations": cal.iterations,
            "em_converged": cal.converged, "plans": spec.calib_plans, "transitions": n}
    return est, cal.prior_valid, info


def _record(rounds, valid, accepts, m: int) -> None:
    rounds["validity"].append(float(valid.mean()))
    rounds["acceptance"].append(float((accepts > m / 2).mean()))


def run_fixed(spec: SimSpec, world: _World, valid: np.ndarray, repairs_cap: int):
    rounds = {"validity": [], "acceptance": []}
    for r in range(repairs_cap + 1):
        valid = world.repair(valid) if r else valid
        s = world.votes(valid)
        _record(rounds, valid, s, spec.vrr.m)
    return valid, s, np.full(valid.shape, repairs_cap), rounds


def run_stop(spec: SimSpec, world: _World, valid: np.ndarray, p: VRRParams, prior: float):
    rounds = {"validity": [], "acceptance": []}
    active = np.ones(valid.shape, dtype=bool)
    belief = np.full(valid.shape, prior)
    last = np.zeros(valid.shape, dtype=int)
    repairs = np.zeros(valid.shape, dtype=int)
    for r in range(spec.vrr.k + 1):
        s = world.votes(valid)
        last = np.where(active, s, last)
        b = posterior(belief, s, p.m, p.rho0, p.rho1)
        active &= ~((gain(b, p.alpha, p.beta) <= p.tau) | (r == spec.vrr.k))
        _record(rounds, valid, last, spec.vrr.m)
        valid = np.where(active, world.repair(valid), valid)
        repairs += active
        belief = np.where(active, predict(b, p.alpha, p.beta), belief)
    return valid, last, repairs, rounds


def run_guard(spec: SimSpec, world: _World, valid: np.ndarray):
    rounds = {"validity": [], "acceptance": []}
    s_inc = world.votes(valid)
    _record(rounds, valid, s_inc, spec.vrr.m)
    for _ in range(spec.vrr.k):
        new = world.repair(valid)
        s_new = world.votes(new)
        take = guard_replaces(s_new, s_inc, spec.vrr.delta)
        valid, s_inc = np.where(take, new, valid), np.where(take, s_new, s_inc)
        _record(rounds, valid, s_inc, spec.vrr.m)
    return valid, s_inc, np.full(valid.shape, spec.vrr.k), rounds


def simulate(spec: SimSpec) -> dict:
    """Means over the trials per policy, the per-round table, and the calibration found."""
    _check(spec)
    seeds = np.random.SeedSequence(spec.seed).spawn(len(POLICIES) + 1)
    est, est_prior, calib = calibrate_from_logs(spec, np.random.default_rng(seeds[-1]))
    runs = {"none": lambda world, start: run_fixed(spec, world, start, 0),
            "fixed": lambda world, start: run_fixed(spec, world, start, spec.vrr.k),
            "stop": lambda world, start: run_stop(spec, world, start, spec.vrr, spec.pi),
            "stop_calibrated": lambda world, start: run_stop(spec, world, start, est, est_prior),
            "guard": lambda world, start: run_guard(spec, world, start)}
    out: dict = {"policies": {}, "rounds": {}, "calibration": calib}
    for name, seed in zip(POLICIES, seeds, strict=False):  # the last seed is calibration's
        world = _World(spec, np.random.default_rng(seed))
        v, s, rep, rounds = runs[name](world, world.start(spec.trials))
        if name == "none":  # no repair: the first round's numbers hold in every round
            rounds = {key: vals * (spec.vrr.k + 1) for key, vals in rounds.items()}
        out["policies"][name] = {"validity": float(v.mean()),
                                 "acceptance": float((s > spec.vrr.m / 2).mean()),
                                 "repairs": float(rep.mean())}
        out["rounds"][name] = rounds
    return out


def _check(spec: SimSpec) -> None:
    v = spec.vrr
    for name, value in (("pi", spec.pi), ("rho0", v.rho0), ("rho1", v.rho1), ("alpha", v.alpha),
                        ("beta", v.beta)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"--{name} must lie in [0, 1], got {value}")
    for name, value in (("m", v.m), ("trials", spec.trials)):
        if value < 1:
            raise ValueError(f"--{name} must be at least 1, got {value}")
    if v.k < 0:
        raise ValueError(f"--k must be >= 0, got {v.k}")


def format_table(result: dict, spec: SimSpec) -> str:
    """The printed table: means per policy, then validity / acceptance per round."""
    lines = [f"{'policy':<16} {'validity':>9} {'acceptance':>11} {'repairs':>8}"]
    for name, row in result["policies"].items():
        lines.append(f"{name:<16} {row['validity']:>9.3f} {row['acceptance']:>11.3f} "
                     f"{row['repairs']:>8.2f}")
    header = " ".join(f"{'r' + str(r):>11}" for r in range(spec.vrr.k + 1))
    lines += ["", "per round: true validity / verifier acceptance (majority of last votes)",
              f"{'policy':<16} {header}"]
    for name, rounds in result["rounds"].items():
        cells = " ".join(f"{v:.2f}/{a:.2f}".rjust(11)
                         for v, a in zip(rounds["validity"], rounds["acceptance"], strict=True))
        lines.append(f"{name:<16} {cells}")
    c, v = result["calibration"], spec.vrr
    lines += ["", f"calibrated from {c['plans']} unlabelled plans x {v.m} votes and "
              f"{c['transitions']} labelled repairs: rho0={c['rho0']:.3f} rho1={c['rho1']:.3f} "
              f"alpha={c['alpha']:.3f} beta={c['beta']:.3f} (true {v.rho0}, {v.rho1}, "
              f"{v.alpha}, {v.beta}); J={youden_j(v.rho0, v.rho1):.3f}"]
    return "\n".join(lines)
