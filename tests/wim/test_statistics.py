"""Win-rate statistics (wim/statistics.py) against scipy/statsmodels and by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binomtest
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import proportion_confint

from wim.length_control import length_adjusted, length_adjusted_win_rate
from wim.statistics import (
    Outcomes,
    binomial_p,
    bootstrap_interval,
    bootstrap_note,
    decisive_interval,
    holm,
    mean_test,
    min_attainable_p_holm,
    power_of,
    prompts_needed,
    sensitivity,
    summarize_comparison,
    win_rate,
    with_holm,
)

# --- hand-computed small cases ---------------------------------------------------------------

def test_decisive_interval_is_clopper_pearson_by_hand_8_of_10():
    # Clopper-Pearson: the beta quantiles B(0.025; 8, 3) and B(0.975; 9, 2).
    lo, hi = decisive_interval(8, 2)
    assert lo == pytest.approx(0.443905, abs=1e-6)
    assert hi == pytest.approx(0.974789, abs=1e-6)
    assert decisive_interval(0, 0) is None


@pytest.mark.parametrize("wins, losses, ties", [(12, 2, 26), (9, 2, 0)])
def test_the_issue_examples_interval_and_test_agree(wins, losses, ties):
    # The issue's two cases where Wilson on wins + ties/2 contradicted the sign test:
    # 12/2/26 (p = 0.013, Wilson covered 0.5) and 9/2/0 (p = 0.065, Wilson excluded 0.5).
    p = binomial_p(wins, losses)
    lo, hi = decisive_interval(wins, losses)
    assert (p < 0.05) == (not lo <= 0.5 <= hi)
    values = [1.0] * wins + [0.0] * losses + [0.5] * ties
    row = summarize_comparison("x", "a", "b", Outcomes(values, [0.0] * (wins + losses + ties)))
    assert "wilson_95" not in row
    assert row["decisive_95"] == [lo, hi] and row["p_value"] == p
    assert row["decisive_rate"] == pytest.approx(wins / (wins + losses))


def test_power_of_the_old_compare_default():
    # The issue: 8 prompts, 10 comparisons; the smallest sign-test p is 2 / 2^8 = 0.0078, so
    # Holm's smallest adjusted p is 0.078 > 0.05.
    assert min_attainable_p_holm(8, 10) == pytest.approx(10 * 2 / 256)
    assert min_attainable_p_holm(8, 10) == pytest.approx(10 * binomtest(8, 8).pvalue)
    assert prompts_needed(10) == 9  # 10 * 2 / 512 = 0.039 < 0.05
    assert prompts_needed(1) == 6  # 2 / 64 = 0.031 (5 prompts: 0.0625)
    power = power_of(8, 10)
    assert power["min_attainable_p_holm"] > 0.05
    assert power["power_statement"].startswith("No result of this size can be significant")
    assert "at least 9 prompts" in power["power_statement"]
    assert not power_of(16, 1)["power_statement"].startswith("No result")


def test_sensitivity_counts_failures_as_losses_then_wins():
    assert sensitivity(3, 1, 2, 4) == {"failures_as_losses": pytest.approx(4 / 10),
                                       "failures_as_wins": pytest.approx(8 / 10)}


def test_binomial_by_hand_1_win_4_losses():
    # Two-sided exact: P(X <= 1) + P(X >= 4) for Bin(5, 1/2) = (1 + 5 + 5 + 1) / 32.
    assert binomial_p(1, 4) == pytest.approx(12 / 32)
    assert binomial_p(0, 0) == 1.0


def test_holm_by_hand():
    # Sorted 0.01, 0.03, 0.04 times 3, 2, 1 -> 0.03, 0.06, 0.04 -> running max 0.03, 0.06, 0.06.
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])


def test_win_rate_counts_ties_as_half():
    assert win_rate(7, 5, 3) == pytest.approx(8.5 / 15)
    assert win_rate(0, 0, 0) is None


# --- against the libraries on fixed inputs ---------------------------------------------------

@pytest.mark.parametrize("wins, losses", [(7, 5), (0, 4), (12, 0), (3, 3), (40, 22), (1, 0)])
def test_decisive_interval_matches_statsmodels_and_agrees_with_the_test(wins, losses):
    expected = proportion_confint(wins, wins + losses, method="beta")  # Clopper-Pearson
    lo, hi = decisive_interval(wins, losses)
    assert [lo, hi] == pytest.approx(list(expected))
    assert (binomial_p(wins, losses) < 0.05) == (not lo <= 0.5 <= hi)


def test_interval_and_test_agree_on_every_small_record():
    for n in range(1, 41):
        for wins in range(n + 1):
            lo, hi = decisive_interval(wins, n - wins)
            assert (binomial_p(wins, n - wins) < 0.05) == (not lo <= 0.5 <= hi), (wins, n)


@pytest.mark.parametrize("wins, losses", [(7, 5), (0, 9), (13, 2), (20, 21)])
def test_binomial_matches_scipy(wins, losses):
    assert binomial_p(wins, losses) == pytest.approx(binomtest(wins, wins + losses).pvalue)


def test_holm_matches_statsmodels():
    p = [0.001, 0.2, 0.04, 0.03, 0.5, 0.012]
    assert holm(p) == pytest.approx(list(multipletests(p, method="holm")[1]))


def test_bootstrap_is_seeded_and_brackets_the_mean():
    values = [1.0, 0.0] * 20
    a = bootstrap_interval(values, seed=3)
    assert a == bootstrap_interval(values, seed=3)
    # Normal approximation: 0.5 +- 1.96 * sqrt(0.25 / 40) = [0.345, 0.655].
    assert a[0] == pytest.approx(0.345, abs=0.04) and a[1] == pytest.approx(0.655, abs=0.04)
    # All outcomes equal: no interval (a zero-width one would read as certainty), a note.
    assert bootstrap_interval([0.5] * 16) is None
    assert "all 16 outcomes are equal (ties)" in bootstrap_note([0.5] * 16)
    assert bootstrap_interval([1.0]) is None and bootstrap_note(values) is None


def test_length_adjusted_win_rate_removes_a_length_effect():
    # a is longer on 15 prompts and wins 12 of them; shorter on 5 and wins 1: the raw win
    # rate 0.65 comes from length alone (longer wins 80% either way), so LC is 0.5.
    values = [1.0] * 12 + [0.0] * 3 + [1.0] * 1 + [0.0] * 4
    diffs = [100.0] * 15 + [-100.0] * 5
    lc, note = length_adjusted_win_rate(values, diffs)
    assert np.mean(values) == pytest.approx(0.65)
    assert lc == pytest.approx(0.5, abs=1e-4) and note is None
    # Without a length difference, LC is the raw win rate.
    assert length_adjusted_win_rate([1.0, 0.0, 1.0, 0.5], [0.0] * 4)[0] == pytest.approx(0.625)


def test_length_adjusted_win_rate_survives_separation():
    # The longer answer always wins: plain maximum likelihood has no finite answer.
    lc, note = length_adjusted_win_rate([1.0, 1.0, 0.0, 0.0, 1.0], [5.0, 3.0, -2.0, -4.0, 1.0])
    assert lc is not None and 0.0 < lc < 1.0 and "regularized" in note


def test_length_adjusted_reports_slope_interval_and_small_n():
    values = [1.0] * 12 + [0.0] * 3 + [1.0] * 1 + [0.0] * 4
    diffs = [100.0] * 15 + [-100.0] * 5
    out = length_adjusted(values, diffs, seed=1, resamples=100)
    assert out["length_adjusted_win_rate"] == pytest.approx(0.5, abs=1e-4)
    assert out["length_slope"] > 0  # longer answers win more often here
    lo, hi = out["length_adjusted_95"]
    assert lo < 0.5 < hi
    assert "n = 20 < 50" in out["length_note"]
    big = length_adjusted(values * 3, diffs * 3, seed=1, resamples=50)
    assert big["length_note"] is None


def test_summarize_splits_ties_and_measures_order_agreement():
    # The issue's quickstart case: "Verdict: A" in both orders on all 16 prompts.
    out = Outcomes([0.5] * 16, [1.0] * 16, tie_kinds=["order_disagreement"] * 16,
                   order_agreement=[False] * 16)
    row = summarize_comparison("policy vs base", "policy", "base", out)
    assert row["ties_split"] == {"real": 0, "order_disagreement": 16, "identical": 0}
    assert row["order_agreement"] == 0.0 and row["orders_compared"] == 16
    assert row["bootstrap_95"] is None and "equal" in row["bootstrap_note"]
    assert row["decisive_95"] is None and row["p_value"] == 1.0


def test_summarize_and_holm_fill_the_schema():
    out = Outcomes([1.0, 1.0, 0.5, 0.0, 1.0], [3.0, -1.0, 0.0, 2.0, 1.0], failures=1)
    row = summarize_comparison("policy vs base", "policy", "base", out)
    assert (row["n"], row["wins"], row["losses"], row["ties"], row["failures"]) == (6, 3, 1, 1, 1)
    assert row["win_rate"] == pytest.approx(3.5 / 5)
    assert row["p_value"] == pytest.approx(binomtest(3, 4).pvalue)
    rows = with_holm([row, {**row, "p_value": 0.01}])
    assert [r["p_holm"] for r in rows] == pytest.approx(
        list(multipletests([row["p_value"], 0.01], method="holm")[1]))


def test_the_bootstrap_is_seeded_percentile_on_continuous_data():
    """On skewed continuous data the percentile and BCa intervals differ, and so do two
    seeds: the interval must be scipy's percentile bootstrap with the given seed."""
    from scipy.stats import bootstrap

    x = np.random.default_rng(11).lognormal(0.0, 1.0, 40)
    ours = bootstrap_interval(list(x), seed=3, resamples=2000)

    def ref(method: str, seed: int) -> list[float]:
        ci = bootstrap((x,), np.mean, n_resamples=2000, confidence_level=0.95, method=method,
                       rng=np.random.default_rng(seed)).confidence_interval
        return [ci.low, ci.high]

    assert ours == pytest.approx(ref("percentile", 3), abs=0, rel=1e-12)
    assert ours != pytest.approx(ref("BCa", 3), abs=1e-3)
    assert ours != pytest.approx(bootstrap_interval(list(x), seed=4, resamples=2000), abs=1e-4)
    assert bootstrap_interval(list(x), seed=3, resamples=2000) == ours


def test_scipy_is_pinned_where_bootstrap_takes_rng():
    """`scipy.stats.bootstrap(..., rng=...)` exists from scipy 1.15 on."""
    from pathlib import Path

    import tomllib
    from packaging.requirements import Requirement

    deps = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    scipy = next(Requirement(d) for d in deps["project"]["dependencies"]
                 if Requirement(d).name == "scipy")
    assert scipy.specifier.contains("1.15.0") and not scipy.specifier.contains("1.14.1")


def test_mean_test_interval_agrees_with_its_p_value():
    from scipy.stats import ttest_1samp

    rng = np.random.default_rng(5)
    for shift in (0.0, 0.03, 0.06, 0.1):
        x = np.clip(0.5 + shift + rng.normal(0, 0.15, 25), 0, 1)
        out = mean_test(list(x), 0.5)
        assert out["p"] == pytest.approx(ttest_1samp(x, 0.5).pvalue)
        lo, hi = out["ci95"]
        assert (out["p"] < 0.05) == (not lo <= 0.5 <= hi)
    # No spread: at 0.5 no difference; elsewhere the exact sign test, and no interval.
    assert mean_test([0.5] * 6)["p"] == 1.0
    assert mean_test([0.8] * 6)["p"] == pytest.approx(2 / 2 ** 6)
    assert mean_test([0.8] * 6)["ci95"] is None


def test_weighted_power_when_the_spread_is_tiny_against_the_effect() -> None:
    """vLLM's verdicts on 4 prompts had sd 0.0186: the effect 0.1 is 5.4 sd, where scipy's
    noncentral t returns NaN and statsmodels' solver gave up (NaN prompts crashed the report).
    Now a power in [0, 1] and a whole number of prompts; an ordinary spread is unchanged."""
    from statsmodels.stats.power import TTestPower

    from wim.statistics import weighted_power

    tiny = weighted_power(4, 0.018596076330353026, 1)
    assert 0.0 <= tiny["weighted_power"] <= 1.0
    assert isinstance(tiny["weighted_prompts_80"], int) and 2 <= tiny["weighted_prompts_80"] <= 6
    assert "nan" not in tiny["weighted_power_statement"]
    usual = weighted_power(30, 0.3, 2)
    size = 0.1 / 0.3
    assert usual["weighted_power"] == float(TTestPower().power(size, 30, 0.025,
                                                                alternative="two-sided"))
    assert usual["weighted_prompts_80"] == math.ceil(TTestPower().solve_power(size, None, 0.025,
                                                                             0.8, "two-sided"))
