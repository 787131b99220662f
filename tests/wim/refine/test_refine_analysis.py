"""Paired tests with Holm correction and the 2x2 interaction, on fixed numbers."""

from __future__ import annotations

import math

import pytest

from wim.refine.analysis import (
    add_p_holm,
    compare_policies,
    interaction_2x2,
    interaction_from_summaries,
    paired_test,
)


def test_interaction_t_statistic_by_hand():
    # Interaction contrasts (same_dyn - same_cap) - (cross_dyn - cross_cap) = 0.1, 0.2, 0.3, 0.4:
    # mean 0.25, sd sqrt(0.05 / 3), t = 0.25 / (sd / 2) = 3.8729833.
    cells = {"same_dynamic": [0.6, 0.7, 0.8, 0.9], "same_cap": [0.5] * 4,
             "cross_dynamic": [0.5, 0.5, 0.5, 0.5], "cross_cap": [0.5, 0.5, 0.5, 0.5]}
    res = interaction_2x2(cells)
    inter = res["interaction"]
    assert inter["mean_diff"] == pytest.approx(0.25)
    assert inter["statistic"] == pytest.approx(0.25 / (math.sqrt(0.05 / 3) / 2))
    assert 0.02 < inter["p"] < 0.04  # t(3) = 3.873: two-sided p = 0.0305
    # The three contrasts are proportional here: equal p, so Holm multiplies each by 3.
    for r in res.values():
        assert r["p"] == pytest.approx(inter["p"])
        assert r["p_holm"] == pytest.approx(3 * inter["p"])


def test_no_interaction_when_the_stopping_effect_is_the_same_for_both_evaluators():
    cells = {"same_dynamic": [0.6, 0.7, 0.8], "same_cap": [0.5, 0.6, 0.7],
             "cross_dynamic": [0.3, 0.3, 0.9], "cross_cap": [0.2, 0.2, 0.8]}
    res = interaction_2x2(cells)
    assert res["interaction"]["p"] is None
    assert res["interaction"]["note"] == "all differences are zero"
    assert res["stopping (dynamic - cap)"]["mean_diff"] == pytest.approx(0.1)


def test_holm_by_hand():
    res = add_p_holm({"a": {"p": 0.01}, "b": {"p": 0.04}, "c": {"p": 0.03}, "d": {"p": None}})
    # sorted 0.01, 0.03, 0.04 -> 0.03, max(0.06, 0.03), max(0.04, 0.06) = 0.03, 0.06, 0.06
    assert res["a"]["p_holm"] == pytest.approx(0.03)
    assert res["c"]["p_holm"] == pytest.approx(0.06)
    assert res["b"]["p_holm"] == pytest.approx(0.06)
    assert res["d"]["p_holm"] is None


def test_compare_policies_pairs_by_question_and_skips_missing_scores():
    scores = {"hard_cap": [0.5, 0.6, None, 0.4, 0.3, 0.2],
              "dynamic": [0.6, 0.8, 0.9, 0.7, 0.7, 0.7],
              "none": [0.5, 0.6, 0.1, 0.4, 0.3, 0.2]}
    res = compare_policies(scores, "hard_cap")
    dyn = res["dynamic vs hard_cap"]
    assert dyn["n"] == 5 and dyn["mean_diff"] == pytest.approx(0.3)  # 0.1 .. 0.5
    # Wilcoxon, all 5 differences positive: exact two-sided p = 2 / 2^5 = 0.0625.
    assert dyn["p"] == pytest.approx(0.0625)
    assert res["none vs hard_cap"]["p"] is None


def test_paired_ttest_by_hand():
    r = paired_test([1.0, 2.0, 3.0], [0.0, 0.0, 0.0], "ttest")
    assert r["statistic"] == pytest.approx(2.0 / (1.0 / math.sqrt(3)))
    with pytest.raises(ValueError, match="unknown paired test"):
        paired_test([1.0, 2.0], [0.0, 1.0], "sign")


def test_wilcoxon_on_ninths_equals_scipy_on_the_integer_differences():
    # The worked example: float differences of (N - 1) / 9 gave p = 0.31 (scipy ranked
    # rounding noise); the integer differences give p = 0.78.
    from scipy.stats import wilcoxon

    a = [2, 7, 9, 6, 9, 8, 9, 4, 2, 1, 2]
    b = [1, 6, 8, 7, 8, 8, 10, 4, 3, 2, 4]
    r = paired_test([(x - 1) / 9 for x in a], [(x - 1) / 9 for x in b], "wilcoxon")
    expected = wilcoxon([x - y for x, y in zip(a, b, strict=True)], zero_method="wilcox")
    assert r["p"] == pytest.approx(float(expected.pvalue)) and r["p"] == pytest.approx(0.78125)
    assert r["statistic"] == pytest.approx(float(expected.statistic))
    # The t-test is scale-free: the same t as on the integer differences.
    from scipy.stats import ttest_rel

    t = paired_test([(x - 1) / 9 for x in a], [(x - 1) / 9 for x in b], "ttest")
    assert t["p"] == pytest.approx(float(ttest_rel(a, b).pvalue))


def test_equal_ninths_are_zero_differences_not_noise():
    # The same ninths reached two ways differ by 1e-16 in floating point: zero on the grid.
    a = [(n - 1) / 9 for n in (2, 4, 7)]
    b = [1 - (10 - n) / 9 for n in (2, 4, 7)]
    assert all(x != y for x, y in zip(a, b, strict=True))
    assert paired_test(a, b)["note"] == "all differences are zero"


SETTINGS = {"blind": {"model": "bundled:smollm2-135m-instruct"}, "policy": "p", "seed": 0,
            "max_attempts": 8}


def _summary(ids, dynamic, cap):
    return {"per_question": {"prompt_ids": ids, "blind": {"dynamic": dynamic, "hard_cap": cap}},
            **SETTINGS}


@pytest.mark.parametrize("key, value, what", [
    ("blind", {"model": "other"}, "blind evaluator"), ("policy", "q", "policy"),
    ("seed", 1, "seed"), ("max_attempts", 4, "attempt cap")])
def test_interaction_refuses_confounded_runs(key, value, what):
    same = _summary(["a", "b", "c"], [0.6, 0.7, 0.8], [0.5] * 3)
    cross = {**_summary(["a", "b", "c"], [0.5] * 3, [0.5] * 3), key: value}
    with pytest.raises(ValueError, match=f"differ in the {what}"):
        interaction_from_summaries(same, cross)
    del cross[key]
    with pytest.raises(ValueError, match="lacks"):
        interaction_from_summaries(same, cross)
    assert interaction_from_summaries(same, same)["questions"] == 3


def test_interaction_from_two_refine_summaries(tmp_path):
    import json

    from tests.conftest import run_wim

    same = _summary(["a", "b", "c", "d", "e"], [0.6, 0.7, 0.8, 0.9, None],
                    [0.5, 0.5, 0.5, 0.5, 0.5])
    cross = _summary(["a", "b", "c", "d", "e"], [0.5] * 5, [0.5] * 5)
    for name, s in (("same", same), ("cross", cross)):
        (tmp_path / name / "refine").mkdir(parents=True)
        (tmp_path / name / "refine" / "summary.json").write_text(json.dumps(s))
    out = json.loads(run_wim(["refine-2x2", str(tmp_path / "same"),
                              str(tmp_path / "cross")]).stdout)
    assert out["questions"] == 4 and out["dropped_unscored"] == 1
    assert out["tests"]["interaction"]["statistic"] == pytest.approx(
        0.25 / (math.sqrt(0.05 / 3) / 2))
    cross["per_question"]["prompt_ids"] = ["x"] * 5
    (tmp_path / "cross" / "refine" / "summary.json").write_text(json.dumps(cross))
    proc = run_wim(["refine-2x2", str(tmp_path / "same"), str(tmp_path / "cross")],
                   check=False)
    assert proc.returncode == 2 and "same prompts" in proc.stderr
