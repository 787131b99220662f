"""Tie rate, delta, no-pair share and agreement (wim/metrics.py), computed by hand."""

from __future__ import annotations

import math

import pytest

from wim.metrics import JudgeStatistics, pair_statistics, system_values


def _rec(prompt_id: str, idx: int, rating: int | None, similarity: float | None,
         domain: str | None = "math") -> dict:
    return {
        "prompt_id": prompt_id,
        "sample_idx": idx,
        "domain": domain,
        "rating": rating,
        "rating_norm": None if rating is None else (rating - 5) / 5,
        "similarity": similarity,
    }


# Three prompts; numeric values are rating_norm, WIM values the similarity.
#   A (math): ratings 8, 8, 4  -> rn 0.6, 0.6, -0.2;  sims 0.5, 0.3, 0.7
#   B (math): ratings 6, 6     -> rn 0.2, 0.2;        sims 0.4, 0.45
#   C (code): ratings 9, 3, -- -> rn 0.8, -0.4, fail; sims 0.9, 0.6, --
SCORED = [
    _rec("A", 0, 8, 0.5), _rec("A", 1, 8, 0.3), _rec("A", 2, 4, 0.7),
    _rec("B", 0, 6, 0.4), _rec("B", 1, 6, 0.45),
    _rec("C", 0, 9, 0.9, "code"), _rec("C", 1, 3, 0.6, "code"), _rec("C", 2, None, None, "code"),
]
ZETAS = [0.0, 0.4, 1.0]


@pytest.fixture(scope="module")
def stats() -> dict:
    return pair_statistics(SCORED, zeta=0.4, zetas=ZETAS)


def test_sample_pairs_skip_failed_judgements(stats):
    # A: 3 pairs, B: 1, C: 1 (the failed sample pairs with nobody).
    assert stats["pairs/sample_pairs/numeric"] == 5
    assert stats["pairs/sample_pairs/wim"] == 5
    assert stats["pairs/sample_pairs/mixed"] == 5


def test_tie_rates(stats):
    # Numeric ties: A(0,1) and B(0,1), both equal ratings; WIM and mixed have none.
    assert stats["pairs/tie_rate/numeric"] == pytest.approx(2 / 5)
    assert stats["pairs/tie_rate/wim"] == 0.0
    assert stats["pairs/tie_rate/mixed"] == 0.0


def test_mean_delta_on_the_ten_point_scale(stats):
    # numeric |d| (1-10 scale = 5 * |d_norm|): A 0, 4, 4; B 0; C 6.
    assert stats["pairs/delta/numeric"] == pytest.approx((0 + 4 + 4 + 0 + 6) / 5)
    # wim: A 5*0.2, 5*0.2, 5*0.4; B 5*0.05; C 5*0.3.
    assert stats["pairs/delta/wim"] == pytest.approx((1 + 1 + 2 + 0.25 + 1.5) / 5)
    # mixed = 0.6 rn + 0.4 sim: A 0.56, 0.48, 0.16; B 0.28, 0.30; C 0.84, 0.0.
    mixed = [0.08, 0.40, 0.32, 0.02, 0.84]
    assert stats["pairs/delta/mixed"] == pytest.approx(5 * sum(mixed) / 5)


def test_best_worst_delta(stats):
    # Per-prompt spread on the 1-10 scale, averaged over prompts.
    assert stats["pairs/delta_best_worst/numeric"] == pytest.approx((4 + 0 + 6) / 3)
    assert stats["pairs/delta_best_worst/wim"] == pytest.approx((2 + 0.25 + 1.5) / 3)


def test_no_pair_share(stats):
    # Only B has all numeric values equal; every prompt has distinct WIM values.
    assert stats["pairs/no_pair_share/numeric"] == pytest.approx(1 / 3)
    assert stats["pairs/no_pair_share/wim"] == 0.0
    assert stats["pairs/no_pair_share/mixed"] == 0.0


def test_agreement_with_numeric(stats):
    # Pairs where neither ties: A(0,2), A(1,2), C(0,1). Numeric prefers 0, 1 and 0.
    # WIM prefers 2, 2 and 0 -> 1 of 3 agree; mixed prefers 0, 1, 0 -> all agree.
    assert stats["pairs/agreement/wim"] == pytest.approx(1 / 3)
    assert stats["pairs/agreement/mixed"] == 1.0
    assert "pairs/agreement/numeric" not in stats


def test_zeta_sweep_keys_and_ends(stats):
    for z in ("0", "0.4", "1"):
        for metric in ("tie_rate", "delta", "no_pair_share", "agreement", "sample_pairs"):
            assert f"zeta/{z}/{metric}" in stats
    for metric in ("tie_rate", "delta", "delta_best_worst", "no_pair_share", "sample_pairs"):
        assert stats[f"zeta/0/{metric}"] == stats[f"pairs/{metric}/numeric"]
        assert stats[f"zeta/1/{metric}"] == stats[f"pairs/{metric}/wim"]
        assert stats[f"zeta/0.4/{metric}"] == stats[f"pairs/{metric}/mixed"]
    assert stats["zeta/0/tie_rate"] == pytest.approx(0.4)
    assert stats["zeta/1/agreement"] == pytest.approx(1 / 3)
    assert stats["zeta/0/agreement"] == 1.0  # numeric agrees with itself


def test_zeta_sweep_names_follow_g_format():
    stats = pair_statistics(SCORED, zeta=0.4, zetas=[0.25, 0.5])
    assert "zeta/0.25/tie_rate" in stats and "zeta/0.5/tie_rate" in stats
    assert not [k for k in stats if k.startswith(("zeta/0/", "zeta/1/"))]


def test_per_domain(stats):
    # math = A + B (4 pairs), code = C (1 pair; the failed sample adds none).
    assert stats["domain/math/tie_rate/numeric"] == pytest.approx(2 / 4)
    assert stats["domain/math/tie_rate/wim"] == 0.0
    assert stats["domain/code/tie_rate/numeric"] == 0.0
    assert stats["domain/math/delta/numeric"] == pytest.approx((0 + 4 + 4 + 0) / 4)
    assert stats["domain/code/delta/wim"] == pytest.approx(1.5)
    assert stats["domain/math/agreement/wim"] == 0.0
    assert stats["domain/code/agreement/wim"] == 1.0
    assert not [k for k in stats if k.startswith("domain/") and "no_pair_share" in k]


def test_missing_domain_is_none():
    scored = [_rec("A", 0, 8, 0.5, domain=None), _rec("A", 1, 4, 0.2, domain=None)]
    stats = pair_statistics(scored, zeta=0.4, zetas=[])
    assert stats["domain/none/tie_rate/numeric"] == 0.0


def test_numeric_only_records_give_numeric_metrics_only():
    scored = [_rec("A", 0, 8, None), _rec("A", 1, 8, None), _rec("B", 0, 2, None),
              _rec("B", 1, 7, None)]
    stats = pair_statistics(scored, zeta=0.0, zetas=ZETAS)
    assert stats["pairs/tie_rate/numeric"] == 0.5
    assert stats["pairs/delta/numeric"] == pytest.approx((0 + 5) / 2)
    assert not [k for k in stats if "/wim" in k or "/mixed" in k or k.startswith("zeta/")]


def test_no_pairs_give_nan():
    stats = pair_statistics([_rec("A", 0, 8, 0.5)], zeta=0.4, zetas=[])
    assert stats["pairs/sample_pairs/wim"] == 0
    assert math.isnan(stats["pairs/tie_rate/wim"])
    assert math.isnan(stats["pairs/agreement/wim"])
    assert stats["pairs/no_pair_share/wim"] == 1.0


def test_system_values_are_on_the_ten_point_scale():
    values = system_values(_rec("A", 0, 10, -0.8), zeta=0.5, zetas=[0.0, 1.0])
    assert values["numeric"] == pytest.approx(10.0)
    assert values["wim"] == pytest.approx(1.0)
    assert values["mixed"] == pytest.approx(5.5)
    assert values["zeta=0"] == values["numeric"]
    assert values["zeta=1"] == values["wim"]
    assert system_values(_rec("A", 1, None, None), 0.4, ZETAS) == {}


def test_judge_statistics():
    judgements = [
        {"parse_ok": True, "critique": "no units", "attempts": 1},
        {"parse_ok": True, "critique": "", "attempts": 2},
        {"parse_ok": False, "critique": None, "attempts": 3},
        {"parse_ok": False, "critique": None},
        {"parse_ok": True, "critique": None},
    ]
    counts = JudgeStatistics()
    for judgement in judgements:
        counts.add(judgement)
    stats = counts.result()
    assert stats["judge/count"] == 5
    assert stats["judge/parse_failed"] == 2
    assert stats["judge/parse_fail_rate"] == pytest.approx(2 / 5)
    assert stats["judge/retried"] == 2
    assert stats["judge/nothing_missing_rate"] == pytest.approx(1 / 5)


def test_judge_statistics_empty():
    stats = JudgeStatistics().result()
    assert stats["judge/count"] == 0
    assert math.isnan(stats["judge/parse_fail_rate"])
