"""The controller's rules, each at its exact boundary (hand-computed scores)."""

from __future__ import annotations

import pytest

from wim.refine.controller import (
    CRITERIA,
    ControllerParams,
    Evaluation,
    aggregate,
    decide,
    penalized,
)

P = ControllerParams(gamma=0.02, tau_c=0.05)


def ev(value: float = 0.5, verdict: str | None = "accept", flags=(), **over) -> Evaluation:
    scores = {c: value for c in CRITERIA}
    scores.update(over)
    return Evaluation(scores=scores, verdict=verdict, flags=tuple(flags))


def test_gain_of_exactly_gamma_is_accepted_and_just_below_is_rejected():
    ok = decide(ev(0.50), ev(0.52), P)  # gain 0.52 - 0.50 = 0.02 = gamma
    assert ok.accept and ok.rule == "accepted"
    assert ok.gain == pytest.approx(0.02)
    low = decide(ev(0.50), ev(0.5199), P)  # gain 0.0199 < 0.02
    assert not low.accept and low.rule == "low_gain"
    assert "gain 0.0199 < gamma 0.02" in low.reason


@pytest.mark.parametrize("criterion", ["factuality", "evidence_support"])
def test_critical_drop_of_exactly_tau_c_passes_and_more_is_rejected(criterion):
    # Others rise to 0.6, so the aggregate gain (0.45 + 4 * 0.6) / 5 - 0.5 = 0.07 passes gamma.
    at = decide(ev(0.5), ev(0.6, **{criterion: 0.45}), P)
    assert at.accept, at.reason
    over = decide(ev(0.5), ev(0.6, **{criterion: 0.4499}), P)
    assert not over.accept and over.rule == f"critical_drop:{criterion}"
    assert f"{criterion} dropped by 0.0501 > tau_c 0.05" == over.reason
    # The guard off: the same candidate is accepted on its gain.
    off = ControllerParams(gamma=0.02, tau_c=0.05, critical_guard=False)
    assert decide(ev(0.5), ev(0.6, **{criterion: 0.4499}), off).accept


def test_non_critical_drop_is_not_guarded():
    assert decide(ev(0.5), ev(0.7, coherence=0.2), P).accept  # gain 0.1, coherence -0.3


def test_explicit_reject_vetoes_even_a_large_gain():
    d = decide(ev(0.2), ev(0.9, verdict="reject"), P)
    assert not d.accept and d.rule == "veto"
    assert d.gain == pytest.approx(0.7)


def test_failed_evaluation_is_rejected_never_a_neutral_score():
    d = decide(ev(0.2), Evaluation(scores=None, verdict="accept"), P)
    assert not d.accept and d.rule == "evaluation_failed" and d.gain is None


def test_unscored_retained_answer_gives_way_to_a_scored_candidate_unless_vetoed():
    assert decide(Evaluation(scores=None), ev(0.1), P).accept
    assert decide(Evaluation(scores=None), ev(0.9, verdict="reject"), P).rule == "veto"


def test_penalty_table_is_applied_before_the_gain_and_the_guard():
    table = {"unsupported_claim": {"evidence_support": 0.2},
             "citation_mismatch": {"coherence": 0.1}}
    p = ControllerParams(gamma=0.02, tau_c=0.05, penalties=table)
    # 0.53 everywhere is a 0.03 gain; citation_mismatch takes 0.1 off coherence: 0.51 -> 0.01.
    assert decide(ev(0.5), ev(0.53), p).accept
    d = decide(ev(0.5), ev(0.53, flags=["citation_mismatch"]), p)
    assert d.rule == "low_gain" and d.candidate_aggregate == pytest.approx(0.51)
    # unsupported_claim: evidence support 0.6 -> 0.4, a drop of 0.1 from 0.5.
    d = decide(ev(0.5), ev(0.6, flags=["unsupported_claim"]), p)
    assert d.rule == "critical_drop:evidence_support"
    # A penalty on the retained answer lowers the bar the same way.
    assert decide(ev(0.52, flags=["citation_mismatch"]), ev(0.52), p).accept


def test_penalties_clip_at_zero_and_unknown_flags_do_nothing():
    table = {"x": {"factuality": 0.5}}
    scores = penalized(ev(0.2, flags=["x", "unknown"]), table)
    assert scores["factuality"] == 0.0 and scores["coherence"] == 0.2
    assert aggregate(scores) == pytest.approx(0.16)
