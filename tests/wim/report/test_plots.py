"""The report's plots show what they claim: the numbers read back from the drawn artists are the
run's numbers (bar heights, line points), not just a PNG on disk."""

from __future__ import annotations

import math

import pytest

from wim.report.plots import plot_rounds, plot_score_distributions, plot_training, plot_win_rates


def _bin(value: float) -> int:
    """Index of `value` among the 36 bins over [1, 10] of the score histogram."""
    return min(int((value - 1) / 0.25), 35)


def test_score_distributions_put_each_system_where_its_scores_are(tmp_path) -> None:
    # Ratings 8 (rating_norm 0.6 -> 8.0 on the 1-10 scale) and 3 (-0.4 -> 3.0); similarity
    # 0.2 -> 6.0 and 0.7 -> 8.5; mixed (zeta 0.5) = mean of the two.
    scores = [{"rating_norm": 0.6, "similarity": 0.2}] * 5 + \
             [{"rating_norm": -0.4, "similarity": 0.7}] * 3 + \
             [{"rating_norm": None, "similarity": None}]  # failed: in no histogram
    drawn = plot_score_distributions(scores, 0.5, tmp_path / "hist.png")
    assert (tmp_path / "hist.png").stat().st_size > 0
    assert set(drawn) == {"numeric", "wim", "mixed"}
    for system in drawn:
        assert drawn[system]["n"] == 8 and sum(drawn[system]["counts"]) == 8
    assert drawn["numeric"]["counts"][_bin(8.0)] == 5
    assert drawn["numeric"]["counts"][_bin(3.0)] == 3
    assert drawn["wim"]["counts"][_bin(6.0)] == 5
    assert drawn["wim"]["counts"][_bin(8.5)] == 3
    assert drawn["mixed"]["counts"][_bin(7.0)] == 5  # (0.6 + 0.2) / 2 = 0.4 -> 7.0
    assert plot_score_distributions([], 0.5, tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()


def test_numeric_only_runs_draw_one_histogram(tmp_path) -> None:
    drawn = plot_score_distributions([{"rating_norm": 0.0, "similarity": None}] * 2, 0.0,
                                     tmp_path / "h.png")
    assert set(drawn) == {"numeric"} and drawn["numeric"]["counts"][_bin(5.0)] == 2


ROUNDS = [
    {"round": 0, "pairs/tie_rate/numeric": 0.5, "pairs/tie_rate/wim": 0.1,
     "pairs/delta/numeric": 1.0, "pairs/delta/wim": 2.0},
    {"round": 1, "pairs/tie_rate/numeric": 0.4, "pairs/tie_rate/wim": 0.05,
     "pairs/delta/numeric": 1.5, "pairs/delta/wim": None},  # undefined this round: left out
    {"round": 2, "pairs/tie_rate/numeric": 0.3, "pairs/tie_rate/wim": 0.0,
     "pairs/delta/numeric": 1.7, "pairs/delta/wim": 2.6},
]


def test_rounds_plot_draws_one_line_per_system(tmp_path) -> None:
    drawn = plot_rounds(ROUNDS, tmp_path / "rounds.png")
    assert drawn["tie_rate"]["numeric (rating)"] == [[0, 1, 2], [0.5, 0.4, 0.3]]
    assert drawn["tie_rate"]["WIM (similarity)"] == [[0, 1, 2], [0.1, 0.05, 0.0]]
    assert drawn["delta"]["WIM (similarity)"] == [[0, 2], [2.0, 2.6]]
    assert "mixed" not in drawn["tie_rate"]


def test_one_round_is_drawn_as_bars(tmp_path) -> None:
    drawn = plot_rounds(ROUNDS[:1], tmp_path / "rounds.png")
    assert drawn["tie_rate"]["numeric (rating)"] == [[0], [0.5]]
    assert drawn["delta"]["WIM (similarity)"] == [[0], [2.0]]
    assert plot_rounds([{"round": 0}], tmp_path / "empty.png") is None


HISTORY = [  # the shape of TRL's trainer.state.log_history (train/log_history.json)
    {"loss": 0.6931, "rewards/margins": 0.0, "rewards/accuracies": 0.0, "step": 1},
    {"loss": 0.6900, "rewards/margins": 0.01, "rewards/accuracies": 0.5, "step": 2},
    {"loss": 0.6500, "rewards/margins": 0.08, "rewards/accuracies": 1.0, "step": 3},
    {"train_runtime": 12.0, "train_loss": 0.67, "step": 3},  # the summary entry: not a step
]


def test_training_plot_draws_loss_and_margins_per_step(tmp_path) -> None:
    drawn = plot_training(HISTORY, tmp_path / "train.png")
    assert drawn["loss"] == [[1, 2, 3], [0.6931, 0.69, 0.65]]
    assert drawn["rewards/margins"] == [[1, 2, 3], [0.0, 0.01, 0.08]]
    assert drawn["rewards/accuracies"] == [[1, 2, 3], [0.0, 0.5, 1.0]]
    no_margins = [{"loss": 0.7, "step": 1}, {"loss": 0.6, "step": 2}]
    assert set(plot_training(no_margins, tmp_path / "t2.png")) == {"loss"}
    assert plot_training([{"train_runtime": 1.0, "step": 0}], tmp_path / "t3.png") is None


def test_win_rate_plot_draws_each_rate_with_its_own_interval(tmp_path) -> None:
    comparisons = [
        {"name": "wim vs base", "win_rate": 0.62, "bootstrap_95": [0.5, 0.72],
         "decisive_rate": 0.7, "decisive_95": [0.52, 0.84], "wilson_95": [0.0, 1.0]},
        {"name": "numeric vs base", "win_rate": 0.5, "bootstrap_95": None,  # all ties
         "decisive_rate": None, "decisive_95": None},
        {"name": "no data", "win_rate": None, "bootstrap_95": None},
    ]
    drawn = plot_win_rates(comparisons, tmp_path / "win.png")
    assert drawn["names"] == ["wim vs base", "numeric vs base"]
    assert drawn["win_rate"] == pytest.approx([0.62, 0.5])
    # The win rate (ties half) carries the bootstrap interval, never Wilson's; no interval
    # where there is none.
    assert drawn["low"] == [0.5, None] and drawn["high"] == [0.72, None]
    assert drawn["decisive"] == pytest.approx([0.7, None])
    assert drawn["decisive_low"] == [0.52, None] and drawn["decisive_high"] == [0.84, None]
    assert plot_win_rates([{"name": "x", "win_rate": math.nan}], tmp_path / "w2.png") is None


def test_training_history_runs_on_across_rounds(tmp_path) -> None:
    import json

    from wim.report.plots import training_history
    from wim.rundir import RunDir

    run = RunDir(tmp_path)
    assert training_history(run) == []
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "log_history.json").write_text(json.dumps(HISTORY[:2]))
    assert [h["step"] for h in training_history(run)] == [1, 2]
    for r, losses in ((0, [0.69, 0.68]), (1, [0.66, 0.6, 0.55])):
        folder = tmp_path / "rounds" / str(r) / "train"
        folder.mkdir(parents=True)
        folder.joinpath("log_history.json").write_text(json.dumps(
            [{"loss": x, "step": i + 1} for i, x in enumerate(losses)]))
    history = training_history(run)  # the rounds' logs win over DIR/train's
    assert [(h["step"], h["loss"]) for h in history] == [
        (1, 0.69), (2, 0.68), (3, 0.66), (4, 0.6), (5, 0.55)]
    assert plot_training(history, tmp_path / "t.png")["loss"][0] == [1, 2, 3, 4, 5]
