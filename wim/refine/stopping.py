"""Stopping policies over a master trajectory (pure functions).

The master trajectory is the hard-cap run of one question: attempt 0 is the initial answer
A_0, attempts 1..T are candidates C_t, each with the controller's decision and, when votes
were cast, the verifier's accepts. Every other policy is derived from a prefix of it, so its
cost (the tokens of the attempts it used) and its final answer are exact:
- hard_cap: all T attempts (T = max_attempts, 8 by default);
- dynamic: stop after the first attempt at which one rule fires:
  * rejection streak: the last `reject_streak` candidates were all rejected;
  * low progress: after at least `window` attempts, the retained aggregate rose by less than
    `min_progress` over the last `window` attempts;
  * stability: the last `stability_window` candidate aggregates lie within `stability_eps`
    of each other (max - min);
- vrr_stop: the belief filter over the votes on the retained answer after each attempt;
  it attempts another repair while G > tau, at most k times;
- vrr_guard: k rounds; the candidate of attempt t replaces the incumbent iff its accepts are at
  least the incumbent's plus delta (the controller is not consulted).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from wim.config.refine import RefineDynamicConfig
from wim.refine.controller import EPS
from wim.refine.vrr import VRRParams, guard_replaces, stop_trace


@dataclass(frozen=True)
class Step:
    """One attempt t >= 1 of the master trajectory."""

    accepted: bool
    retained_aggregate: float | None
    """Aggregate of the retained answer after this attempt's decision (None: never scored)."""
    candidate_aggregate: float | None
    """Aggregate of this attempt's candidate (None: its evaluation failed)."""
    retained_index: int
    """Which attempt's answer is retained after this decision (0 = A_0)."""
    candidate_accepts: int | None = None
    """Verifier accepts of M votes on this attempt's candidate."""


@dataclass(frozen=True)
class Outcome:
    """Where a policy stops: `attempts` used (0 = only A_0) and the final answer's index."""

    policy: str
    attempts: int
    final_index: int
    reason: str


def hard_cap(steps: list[Step], cap: int) -> Outcome:
    n = min(cap, len(steps))
    final = steps[n - 1].retained_index if n else 0
    return Outcome("hard_cap", n, final, f"hard cap: {n} attempts")


def dynamic_rule(steps: list[Step], initial_aggregate: float | None, t: int,
                 p: RefineDynamicConfig) -> str | None:
    """The dynamic rule that fires after attempt t (1-based), seeing only steps[:t]."""
    done = steps[:t]
    if t >= p.reject_streak and all(not s.accepted for s in done[-p.reject_streak:]):
        return f"rejection streak: the last {p.reject_streak} candidates were rejected"
    if t >= p.window:
        retained = [initial_aggregate] + [s.retained_aggregate for s in done]
        now, before = retained[t], retained[t - p.window]
        if now is not None and before is not None and now - before < p.min_progress - EPS:
            return (f"low progress: the retained score rose {now - before:.4f} < "
                    f"{p.min_progress} over {p.window} attempts")
    if t >= p.stability_window:
        recent = [s.candidate_aggregate for s in done[-p.stability_window:]]
        if None not in recent and max(recent) - min(recent) <= p.stability_eps + EPS:
            return (f"stability: the last {p.stability_window} candidate scores lie within "
                    f"{p.stability_eps}")
    return None


def dynamic(steps: list[Step], initial_aggregate: float | None, cap: int,
            p: RefineDynamicConfig) -> Outcome:
    for t in range(1, min(cap, len(steps)) + 1):
        reason = dynamic_rule(steps, initial_aggregate, t, p)
        if reason:
            return Outcome("dynamic", t, steps[t - 1].retained_index, reason)
    return replace(hard_cap(steps, cap), policy="dynamic", reason="no rule fired before the cap")


def vrr_stop(steps: list[Step], initial_accepts: int, prior: float, p: VRRParams) -> Outcome:
    """Votes of round r are those on the answer retained after r attempts."""
    accepts = [initial_accepts] + [s.candidate_accepts for s in steps]
    votes = [initial_accepts]
    for s in steps[: p.k]:
        if s.retained_index and accepts[s.retained_index] is None:
            raise ValueError(f"attempt {s.retained_index} has no verifier votes")
        votes.append(accepts[s.retained_index])
    trace = stop_trace(votes, prior, p)
    used = len(trace) - 1
    final = steps[used - 1].retained_index if used else 0
    reason = trace[-1].reason if not trace[-1].repair else "the master trajectory ended"
    return Outcome("vrr_stop", used, final, reason)


def vrr_guard(steps: list[Step], initial_accepts: int, p: VRRParams) -> Outcome:
    inc, s_inc = 0, initial_accepts
    rounds = min(p.k, len(steps))
    for t in range(1, rounds + 1):
        s_new = steps[t - 1].candidate_accepts
        if s_new is not None and bool(guard_replaces(s_new, s_inc, p.delta)):
            inc, s_inc = t, s_new
    return Outcome("vrr_guard", rounds, inc, f"incumbent: attempt {inc} with {s_inc} accepts")
