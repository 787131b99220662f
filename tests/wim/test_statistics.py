"""Win-rate statistics (wim/statistics.py) against scipy/statsmodels and by hand."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binomtest
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import proportion_confint

from wim.statistics import (
    Outcomes,
    binomial_p,
    bootstrap_interval,
    holm,
    length_controlled_win_rate,
    summarize,
    wilson_interval,
    win_rate,
    with_holm,
)

# --- hand-computed small cases ---------------------------------------------------------------

def test_wilson_by_hand_8_of_10():
    # z = 1.959964; centre (0.8 + z^2/20) / (1 + z^2/10) = 0.716740,
    # half-width z * sqrt(0.016 + z^2/400) / (1 + z^2/10) = 0.226578.
    lo, hi = wilson_interval(8, 2, 0)
    assert lo == pytest.approx(0.490162, abs=1e-6)
    assert hi == pytest.approx(0.943318, abs=1e-6)


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

@pytest.mark.parametrize("wins, losses, ties", [(7, 5, 3), (0, 4, 1), (12, 0, 0), (3, 3, 10)])
def test_wilson_matches_statsmodels(wins, losses, ties):
    expected = proportion_confint(wins + ties / 2, wins + losses + ties, method="wilson")
    assert wilson_interval(wins, losses, ties) == pytest.approx(list(expected))


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
    assert bootstrap_interval([1.0, 1.0, 1.0]) == [1.0, 1.0]
    assert bootstrap_interval([1.0]) is None


def test_length_controlled_win_rate_removes_a_length_effect():
    # a is longer on 15 prompts and wins 12 of them; shorter on 5 and wins 1: the raw win
    # rate 0.65 comes from length alone (longer wins 80% either way), so LC is 0.5.
    values = [1.0] * 12 + [0.0] * 3 + [1.0] * 1 + [0.0] * 4
    diffs = [100.0] * 15 + [-100.0] * 5
    lc, note = length_controlled_win_rate(values, diffs)
    assert np.mean(values) == pytest.approx(0.65)
    assert lc == pytest.approx(0.5, abs=1e-4) and note is None
    # Without a length difference, LC is the raw win rate.
    assert length_controlled_win_rate([1.0, 0.0, 1.0, 0.5], [0.0] * 4)[0] == pytest.approx(0.625)


def test_length_controlled_win_rate_survives_separation():
    # The longer answer always wins: plain maximum likelihood has no finite answer.
    lc, note = length_controlled_win_rate([1.0, 1.0, 0.0, 0.0, 1.0], [5.0, 3.0, -2.0, -4.0, 1.0])
    assert lc is not None and 0.0 < lc < 1.0 and "regularized" in note


def test_summarize_and_holm_fill_the_schema():
    out = Outcomes([1.0, 1.0, 0.5, 0.0, 1.0], [3.0, -1.0, 0.0, 2.0, 1.0], failures=1)
    row = summarize("policy vs base", "policy", "base", out)
    assert (row["n"], row["wins"], row["losses"], row["ties"], row["failures"]) == (6, 3, 1, 1, 1)
    assert row["win_rate"] == pytest.approx(3.5 / 5)
    assert row["p_value"] == pytest.approx(binomtest(3, 4).pvalue)
    rows = with_holm([row, {**row, "p_value": 0.01}])
    assert [r["p_holm"] for r in rows] == pytest.approx(
        list(multipletests([row["p_value"], 0.01], method="holm")[1]))
