"""The deterministic state controller: does candidate C_t replace the retained answer R_{t-1}?

Scores are the loop evaluator's five criteria in [0, 1]. Before comparing, the diagnostic
penalties (a config table: flag -> {criterion: amount}) are subtracted from the criteria of the
answer whose evaluation raised the flag (clipped at 0). The aggregate is the mean of the five
penalized criteria, so it is already normalized to [0, 1] and the gain is
`aggregate(C_t) - aggregate(R_{t-1})`. C_t is accepted only if, in this order:
1. it was evaluated (a failed evaluation is never a neutral score: it is rejected);
2. the evaluator did not veto it (an explicit "reject");
3. the gain is at least gamma;
4. with the critical guard on, factuality and evidence support each drop by at most tau_c.
Boundaries are inclusive with a 1e-9 tolerance, so a gain of exactly gamma (0.52 - 0.50) is
accepted despite floating point. Every decision carries the rule that decided it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from wim.config.refine import CRITERIA

CRITICAL = ("factuality", "evidence_support")
EPS = 1e-9


@dataclass(frozen=True)
class Evaluation:
    """E_L's verdict on one answer. `scores` is None when the evaluation failed to parse."""

    scores: dict[str, float] | None
    verdict: str | None = None
    """`accept`, `reject`, or None when the evaluator gave none."""
    flags: tuple[str, ...] = ()
    """Diagnostic flags raised by the feedback (keys of the penalty table)."""


@dataclass(frozen=True)
class ControllerParams:
    gamma: float = 0.02
    tau_c: float = 0.05
    critical_guard: bool = True
    penalties: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    accept: bool
    rule: str
    """`accepted`, `evaluation_failed`, `veto`, `low_gain`, `critical_drop:<criterion>`."""
    reason: str
    gain: float | None
    candidate_aggregate: float | None
    retained_aggregate: float | None


def penalized(ev: Evaluation, penalties: dict[str, dict[str, float]]) -> dict[str, float]:
    """The criteria after the penalty table's deductions for each flag raised (clipped at 0)."""
    assert ev.scores is not None
    scores = dict(ev.scores)
    for flag in sorted(set(ev.flags)):
        for criterion, amount in penalties.get(flag, {}).items():
            scores[criterion] = max(0.0, scores[criterion] - amount)
    return scores


def aggregate(scores: dict[str, float]) -> float:
    return sum(scores[c] for c in CRITERIA) / len(CRITERIA)


def decide(retained: Evaluation, candidate: Evaluation, p: ControllerParams) -> Decision:
    """Accept C_t (candidate) over R_{t-1} (retained) or keep R_{t-1}; see the module docstring."""
    ret = None if retained.scores is None else penalized(retained, p.penalties)
    r_agg = None if ret is None else aggregate(ret)
    if candidate.scores is None:
        return Decision(False, "evaluation_failed", "the candidate's evaluation failed to parse; "
                        "kept the retained answer", None, None, r_agg)
    cand = penalized(candidate, p.penalties)
    c_agg = aggregate(cand)
    gain = None if ret is None else c_agg - r_agg
    if candidate.verdict == "reject":
        reason = "the evaluator rejected the candidate" + ("" if ret is None else " (veto)")
        return Decision(False, "veto", reason, gain, c_agg, r_agg)
    if ret is None:
        # Nothing scored to compare with: the first candidate that parses and is not vetoed wins.
        return Decision(True, "accepted", "the retained answer had no valid evaluation",
                        None, c_agg, None)
    if gain < p.gamma - EPS:
        return Decision(False, "low_gain", f"gain {gain:.4f} < gamma {p.gamma}", gain, c_agg,
                        r_agg)
    for criterion in CRITICAL if p.critical_guard else ():
        drop = ret[criterion] - cand[criterion]
        if drop > p.tau_c + EPS:
            return Decision(False, f"critical_drop:{criterion}",
                            f"{criterion} dropped by {drop:.4f} > tau_c {p.tau_c}", gain,
                            c_agg, r_agg)
    return Decision(True, "accepted", f"gain {gain:.4f} >= gamma {p.gamma}", gain, c_agg, r_agg)
