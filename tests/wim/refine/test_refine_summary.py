"""Policies derived from hand-made master trajectories: exact prefixes, tokens, pairs."""

from __future__ import annotations

import pytest

from wim.config import load_config
from wim.prompts import Prompt
from wim.refine.summary import derive_policies, policy_tokens, refinement_pairs, summarize

CONFIG = "configs/refine.yaml"


def traj(pid: str, aggregates, accepted, accepts, tokens=(10, 100, 5)):
    recs, kept = [], 0
    for t, (agg, acc, votes) in enumerate(zip(aggregates, accepted, accepts, strict=True)):
        if t and acc:
            kept = t
        recs.append({"prompt_id": pid, "attempt": t, "answer": f"{pid} answer {t}",
                     "aggregate": agg, "scores": {}, "accepts": votes, "votes_reasked": 0,
                     "decision": None if t == 0 else {"accept": acc, "rule": "accepted" if acc
                                                      else "low_gain"},
                     "retained_attempt": kept,
                     "tokens": dict(zip(("generate", "evaluate", "votes"), tokens,
                                        strict=True))})
    return recs


def prompts(n):
    return [Prompt(f"p{i}", "d", ({"role": "user", "content": f"q{i}"},)) for i in range(n)]


def test_policies_are_prefixes_of_the_master_trajectory():
    cfg = load_config(CONFIG, ["refine.max_attempts=8", "refine.vrr.calibrate=false"])
    # q0: accepted at 1, then 3 rejections: dynamic stops after attempt 4 (streak), keeps 1.
    # Votes: A_0 2/8 -> VRR-Stop repairs; attempt 1's answer gets 8/8 -> stop after 1.
    # Guard (delta 5): attempt 1's candidate has 8 >= 2 + 5 -> incumbent 1; 7 < 8 + 5 after.
    q0 = traj("p0", [0.5, 0.6, 0.55, 0.5, 0.52, 0.7, 0.7, 0.7, 0.8],
              [None, True, False, False, False, True, False, True, True],
              [2, 8, 7, 1, 1, 1, 1, 1, 1])
    out, info = derive_policies(cfg, [q0])
    assert (out["hard_cap"][0].attempts, out["hard_cap"][0].final_index) == (8, 8)
    assert (out["dynamic"][0].attempts, out["dynamic"][0].final_index) == (4, 1)
    assert (out["vrr_stop"][0].attempts, out["vrr_stop"][0].final_index) == (1, 1)
    assert (out["vrr_guard"][0].attempts, out["vrr_guard"][0].final_index) == (5, 1)
    assert out["none"][0].final_index == 0
    # Exact cost from the prefix: A_0 and 4 attempts at 10 + 100 each; votes only for VRR.
    assert policy_tokens("dynamic", q0, 4) == 5 * 110
    assert policy_tokens("vrr_stop", q0, 1) == 2 * 115
    assert policy_tokens("none", q0, 0) == 10
    assert policy_tokens("hard_cap", q0, 8) == 9 * 110


def test_failed_votes_leave_the_vrr_policies_out_and_say_why():
    cfg = load_config(CONFIG, ["refine.max_attempts=2"])
    q0 = traj("p0", [0.5, 0.6, 0.7], [None, True, True], [3, None, 4])
    out, info = derive_policies(cfg, [q0])
    assert "vrr_stop" not in out and "votes on 1 answers failed" in info["vrr_skipped"]


def test_summary_tokens_saved_tests_and_blind_pairs():
    cfg = load_config(CONFIG, ["refine.max_attempts=3", "refine.vrr.enabled=false",
                               "refine.dynamic.reject_streak=2"])
    trajs = [traj(f"p{i}", [0.5, 0.6, 0.6, 0.6], [None, True, False, False], [None] * 4)
             for i in range(3)]
    out, info = derive_policies(cfg, trajs)
    assert [o.attempts for o in out["dynamic"]] == [3, 3, 3]  # streak of 2 after attempt 3
    trajs[1][2]["decision"]["accept"] = True  # not a prefix-consistent record; only q1 moves
    out, info = derive_policies(cfg, trajs)
    scores = {(0, 0): 0.2, (0, 1): 0.9, (1, 0): 0.5, (1, 1): 0.4, (2, 0): 0.3, (2, 1): None}
    summary = summarize(cfg, prompts(3), trajs, out, scores, info)
    cap = summary["policies"]["hard_cap"]
    assert cap["tokens_total"] == 3 * 4 * 110 and cap["blind_failed"] == 1
    assert summary["policies"]["none"]["tokens_saved_vs_hard_cap"] == pytest.approx(
        1 - 30 / 1320)
    assert "none vs hard_cap" in summary["tests"] and "p_holm" in summary["tests"][
        "none vs hard_cap"]
    assert "mechanical" in summary["caveat"]
    rows = refinement_pairs(cfg, prompts(3), trajs, out, scores)
    # Only q0: E_B prefers its final (0.9 > 0.2); q1's final is worse, q2's has no score.
    assert [r["prompt_id"] for r in rows] == ["p0"]
    assert rows[0]["chosen"] == [{"role": "assistant", "content": "p0 answer 1"}]
    assert rows[0]["rejected"] == [{"role": "assistant", "content": "p0 answer 0"}]
    assert rows[0]["prompt"] == [{"role": "user", "content": "q0"}]
    cfg2 = load_config(CONFIG, ["refine.max_attempts=3", "refine.vrr.enabled=false",
                                "refine.pairs_rule=accepted"])
    assert len(refinement_pairs(cfg2, prompts(3), trajs, out, scores)) == 3
