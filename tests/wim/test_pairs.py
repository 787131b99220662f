"""Chosen/rejected pairs from scored samples (wim/pairs.py)."""

from __future__ import annotations

import pytest

from wim.config import PairsConfig
from wim.pairs import build_pairs, group_by_prompt, pair_row
from wim.scoring import mix_scores


def _rec(prompt_id: str, idx: int, score: float | None, rating: int | None = 5,
         domain: str = "science") -> dict:
    return {
        "prompt_id": prompt_id,
        "sample_idx": idx,
        "domain": domain,
        "messages": [{"role": "user", "content": f"question {prompt_id}"}],
        "response": f"answer {prompt_id}/{idx}",
        "critique": f"missing {prompt_id}/{idx}",
        "rating": rating,
        "similarity": 0.5 if score is not None else None,
        "score": score,
        "zeta": 0.4,
    }


def _prompt(prompt_id: str, scores: list[float | None], **kw) -> list[dict]:
    return [_rec(prompt_id, i, s, **kw) for i, s in enumerate(scores)]


def _idx(row: dict) -> tuple[int, int]:
    return row["chosen_sample_idx"], row["rejected_sample_idx"]


# --- strategies ------------------------------------------------------------------------------


def test_best_vs_worst_picks_max_and_min():
    scored = _prompt("a", [0.1, 0.9, -0.3, 0.5]) + _prompt("b", [0.2, -0.6, 0.7])
    rows, counts = build_pairs(scored, PairsConfig())
    assert [(r["prompt_id"], *_idx(r)) for r in rows] == [("a", 1, 2), ("b", 2, 1)]
    assert [(r["chosen_score"], r["rejected_score"]) for r in rows] == [(0.9, -0.3), (0.7, -0.6)]
    assert counts.prompts == 2 and counts.pairs == 2
    assert counts.ties == 0 and counts.prompts_too_few_parsed == 0


def test_all_gives_every_non_tied_pair_with_higher_chosen():
    scored = _prompt("a", [0.2, 0.8, -0.4])
    rows, counts = build_pairs(scored, PairsConfig(strategy="all"))
    assert len(rows) == 3 and counts.pairs == 3
    assert sorted(_idx(r) for r in rows) == [(0, 2), (1, 0), (1, 2)]
    for row in rows:
        assert row["chosen_score"] > row["rejected_score"]


def test_all_drops_only_the_tied_pairs():
    scored = _prompt("a", [0.5, 0.5, -0.2])
    rows, counts = build_pairs(scored, PairsConfig(strategy="all"))
    assert sorted(_idx(r) for r in rows) == [(0, 2), (1, 2)]
    assert counts.ties == 1 and counts.ties_dropped == 1 and counts.pairs == 2


def test_all_with_k4_gives_six_pairs():
    rows, _ = build_pairs(_prompt("a", [0.1, 0.2, 0.3, 0.4]), PairsConfig(strategy="all"))
    assert len(rows) == 6
    assert all(r["chosen_score"] > r["rejected_score"] for r in rows)


def test_best_vs_random_picks_a_lower_sample():
    scores = [0.1, 0.9, -0.3, 0.5, 0.9 - 1e-12]
    rejected = set()
    for seed in range(30):
        rows, counts = build_pairs(_prompt("a", scores), PairsConfig(strategy="best_vs_random"),
                                   seed=seed)
        assert len(rows) == 1 and counts.ties == 0
        chosen, rej = _idx(rows[0])
        assert chosen == 1
        assert rows[0]["rejected_score"] < rows[0]["chosen_score"]
        rejected.add(rej)
    # Any strictly lower sample can be drawn; the one within tolerance of the best never is.
    assert rejected == {0, 2, 3}


def test_best_vs_random_is_deterministic_for_a_seed():
    scored = [r for p in "abcdefgh" for r in _prompt(p, [0.1, 0.9, -0.3, 0.5])]
    cfg = PairsConfig(strategy="best_vs_random")
    first, _ = build_pairs(scored, cfg, seed=3)
    again, _ = build_pairs(scored, cfg, seed=3)
    assert first == again


def test_best_vs_random_all_tied_follows_tie_policy():
    rows, counts = build_pairs(_prompt("a", [0.3, 0.3]), PairsConfig(strategy="best_vs_random"))
    assert rows == [] and counts.ties == 1 and counts.ties_dropped == 1


# --- ties ------------------------------------------------------------------------------------

# Prompt "t" is a full tie (within tolerance); prompt "u" is not.
TIED = _prompt("t", [0.4, 0.4 + 1e-12, 0.4]) + _prompt("u", [0.6, -0.2])


def test_tie_drop():
    rows, counts = build_pairs(TIED, PairsConfig(tie_policy="drop"))
    assert [r["prompt_id"] for r in rows] == ["u"]
    assert (counts.ties, counts.ties_dropped, counts.ties_kept_first,
            counts.ties_kept_random) == (1, 1, 0, 0)
    assert counts.pairs == 1 and counts.prompts == 2


def test_tie_first_keeps_sample_order():
    rows, counts = build_pairs(TIED, PairsConfig(tie_policy="first"))
    assert [r["prompt_id"] for r in rows] == ["t", "u"]
    # Best is sample 1 (0.4 + 1e-12), worst the first minimum, sample 0; `first` puts 0 first.
    assert _idx(rows[0]) == (0, 1)
    assert (counts.ties, counts.ties_dropped, counts.ties_kept_first,
            counts.ties_kept_random) == (1, 0, 1, 0)
    assert counts.pairs == 2


def test_tie_first_with_all():
    rows, counts = build_pairs(_prompt("t", [0.4, 0.4, 0.4]),
                               PairsConfig(strategy="all", tie_policy="first"))
    assert sorted(_idx(r) for r in rows) == [(0, 1), (0, 2), (1, 2)]
    assert counts.ties == 3 and counts.ties_kept_first == 3


def test_tie_random():
    rows, counts = build_pairs(TIED, PairsConfig(tie_policy="random"), seed=1)
    assert [r["prompt_id"] for r in rows] == ["t", "u"]
    assert set(_idx(rows[0])) == {0, 1}
    assert (counts.ties, counts.ties_dropped, counts.ties_kept_first,
            counts.ties_kept_random) == (1, 0, 0, 1)


def test_tie_random_is_deterministic_and_uses_the_seed():
    scored = [r for p in range(40) for r in _prompt(f"p{p}", [0.3, 0.3])]
    cfg = PairsConfig(tie_policy="random")
    orders = {}
    for seed in (0, 1):
        rows, counts = build_pairs(scored, cfg, seed=seed)
        again, _ = build_pairs(scored, cfg, seed=seed)
        assert rows == again
        assert counts.ties_kept_random == 40
        orders[seed] = [_idx(r) for r in rows]
        # Both orders occur: the coin is really tossed.
        assert set(orders[seed]) == {(0, 1), (1, 0)}
    assert orders[0] != orders[1]


def test_tie_tolerance_is_on_the_ten_point_scale():
    # 0.5 vs 0.49 on the raw [-1, 1] scale is 7.5 vs 7.45 on the 1-10 scale: a gap of 0.05.
    scored = _prompt("a", [0.5, 0.49])
    rows, counts = build_pairs(scored, PairsConfig(tie_tolerance=0.06))
    assert rows == [] and counts.ties == 1
    rows, counts = build_pairs(scored, PairsConfig(tie_tolerance=0.04))
    assert len(rows) == 1 and counts.ties == 0
    # On the raw scale 0.02 would call this a tie; on the 1-10 scale it is not.
    rows, counts = build_pairs(scored, PairsConfig(tie_tolerance=0.02))
    assert len(rows) == 1 and counts.ties == 0


@pytest.mark.parametrize("tol", [0.04, 0.06, 0.3, 0.7])
def test_pairs_and_report_count_the_same_ties(tol):
    """One tie rule: the ties build_pairs counts equal the report's tie count of the score that
    ranked them (the mixed system at the same zeta), for every tolerance."""
    from wim.metrics import pair_statistics

    zeta = 0.4
    scored = []
    for pid, sims in {"a": [0.5, 0.49], "b": [0.2, 0.3], "c": [0.9, 0.8], "d": [0.1, 0.1]}.items():
        for i, sim in enumerate(sims):
            rn = 0.2 * i if pid == "d" else 0.0
            scored.append({"prompt_id": pid, "sample_idx": i, "messages": [], "response": "r",
                           "rating": 5, "rating_norm": rn, "similarity": sim,
                           "score": mix_scores(rn, sim, zeta), "zeta": zeta})
    _, counts = build_pairs(scored, PairsConfig(strategy="all", tie_tolerance=tol))
    stats = pair_statistics(scored, zeta, [], tol)
    assert counts.ties == round(stats["pairs/tie_rate/mixed"] * stats["pairs/sample_pairs/mixed"])


# --- unusable samples ------------------------------------------------------------------------


def test_unscored_samples_are_left_out():
    scored = (_prompt("a", [None, 0.2, None, -0.1, 0.1])
              + _prompt("b", [None, 0.7])
              + _prompt("c", [None, None])
              + _prompt("d", [0.3]))
    rows, counts = build_pairs(scored, PairsConfig(strategy="all"))
    assert sorted(_idx(r) for r in rows) == [(1, 3), (1, 4), (4, 3)]
    assert all(r["prompt_id"] == "a" for r in rows)
    assert counts.prompts == 4
    assert counts.prompts_too_few_parsed == 3
    assert counts.as_metrics()["pairs/prompts_too_few_parsed"] == 3
    assert counts.as_metrics()["pairs/count"] == 3


def test_best_vs_worst_ignores_unscored_samples():
    rows, _ = build_pairs(_prompt("a", [None, 0.2, 0.9, None, -0.5]), PairsConfig())
    assert _idx(rows[0]) == (2, 4)


def test_empty_input():
    rows, counts = build_pairs([], PairsConfig())
    assert rows == [] and counts.prompts == 0 and counts.pairs == 0


def test_records_out_of_order_are_grouped_and_sorted():
    scored = _prompt("a", [0.1, 0.9, -0.3]) + _prompt("b", [0.2, -0.6])
    groups = group_by_prompt(list(reversed(scored)))
    assert set(groups) == {"a", "b"}
    assert [r["sample_idx"] for r in groups["a"]] == [0, 1, 2]
    rows, _ = build_pairs(list(reversed(scored)), PairsConfig())
    assert sorted((r["prompt_id"], *_idx(r)) for r in rows) == [("a", 1, 2), ("b", 0, 1)]


# --- the row format --------------------------------------------------------------------------


def test_rows_are_trl_conversational_with_audit_columns():
    # The origin: a generation.source response's model, else the policy that sampled it.
    scored = [{**_rec("a", 0, 0.7, rating=9, domain="medicine"), "origin": "gpt-4"},
              {**_rec("a", 1, -0.2, rating=3, domain="medicine"), "policy": "bundled:p"}]
    rows, _ = build_pairs(scored, PairsConfig())
    assert rows == [{
        "prompt": [{"role": "user", "content": "question a"}],
        "chosen": [{"role": "assistant", "content": "answer a/0"}],
        "rejected": [{"role": "assistant", "content": "answer a/1"}],
        "prompt_id": "a",
        "domain": "medicine",
        "chosen_sample_idx": 0,
        "rejected_sample_idx": 1,
        "chosen_critique": "missing a/0",
        "rejected_critique": "missing a/1",
        "chosen_rating": 9,
        "rejected_rating": 3,
        "chosen_similarity": 0.5,
        "rejected_similarity": 0.5,
        "chosen_score": 0.7,
        "rejected_score": -0.2,
        "zeta": 0.4,
        "chosen_origin": "gpt-4",
        "rejected_origin": "bundled:p",
    }]


def test_pair_row_keeps_the_prompt_messages():
    chosen = _rec("a", 0, 0.5)
    chosen["messages"] = [{"role": "system", "content": "Be brief."},
                          {"role": "user", "content": "Why?"}]
    row = pair_row(chosen, _rec("a", 1, 0.1))
    assert row["prompt"] == chosen["messages"]
    assert row["chosen"][0]["role"] == "assistant"
    assert row["rejected"] == [{"role": "assistant", "content": "answer a/1"}]


@pytest.mark.parametrize("strategy", ["best_vs_worst", "best_vs_random", "all"])
def test_chosen_never_scores_below_rejected(strategy):
    import random

    gen = random.Random(5)
    scored = [r for p in range(25)
              for r in _prompt(f"p{p}", [round(gen.uniform(-1, 1), 1) for _ in range(4)])]
    rows, counts = build_pairs(scored, PairsConfig(strategy=strategy, tie_policy="first"))
    assert rows
    for row in rows:
        assert row["chosen_score"] >= row["rejected_score"]
        if row["chosen_score"] == row["rejected_score"]:
            assert row["chosen_sample_idx"] < row["rejected_sample_idx"]
    assert counts.pairs == len(rows)
