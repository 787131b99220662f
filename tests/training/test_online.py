"""Online DPO with the WIM reward on the bundled model: per-step ties, failures, tie rate and
delta; a failed judgement is taken out of the loss, never a silent 0 reward."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from conftest import QUICKSTART, SHRUNK, sets

from wim.cli import main

ONLINE = [*SHRUNK, "training.mode=online", "training.online_max_new_tokens=12",
          "dpo.max_steps=3", "dpo.per_device_train_batch_size=2", "judge.max_retries=0",
          "dpo.learning_rate=1e-4", "training.online_tie_policy=first"]
# At the first step the adapter is zero, so policy == reference and every pair that reaches the
# loss contributes exactly log 2: a step whose loss is 0 trained on no pair.
LOG2 = math.log(2)


def failed(result, rating=None):
    """A judgement whose parse failed (a simulated fault); `rating` survived it, if given."""
    return dataclasses.replace(result, parse_ok=False, rating=rating, critique=None,
                               error="simulated parse failure")


def kept_pair_scores(judged: list[dict], step: int) -> list[tuple[float, float]]:
    """(score of completion i, of i + B) for each pair of `step` with both judgements scored."""
    rows = [j for j in judged if j["step"] == step]
    half = len(rows) // 2
    return [(a["score"], b["score"]) for a, b in zip(rows[:half], rows[half:], strict=True)
            if a["score"] is not None and b["score"] is not None]


@pytest.mark.slow
def test_online_steps_log_wim_statistics_and_drop_failed_judgements(tmp_path: Path,
                                                                    monkeypatch) -> None:
    import torch

    from wim.judges import BackendJudge

    real = BackendJudge.judge
    weights = []  # the trainable weights as each step's judging starts (= after the last step)

    def failing_second_step(self, items, seed=0):
        """Simulated fault: in the second step every judgement fails to parse."""
        weights.append({n: p.detach().clone() for n, p in
                        self.backend.model.named_parameters() if p.requires_grad})
        results = real(self, items, seed=seed)
        return [failed(r) for r in results] if len(weights) == 2 else results

    monkeypatch.setattr(BackendJudge, "judge", failing_second_step)
    run = tmp_path / "online"
    assert main(["run", str(QUICKSTART), "--out", str(run), "--no-progress", *sets(ONLINE)]) == 0

    steps = [json.loads(line) for line in (run / "train/online_steps.jsonl").open()]
    assert [s["step"] for s in steps] == [1, 2, 3]
    dropped = steps[1]
    assert dropped["failed"] == 4 and dropped["dropped"] == dropped["pairs"] == 2
    assert dropped["tie_rate/numeric"] is None  # no judged pair, no statistic (not 0)
    logged = [h for h in json.loads((run / "train/log_history.json").read_text()) if "loss" in h]
    assert len(logged) == 3
    for h in logged:
        for key in ("wim/ties", "wim/failed", "wim/tie_rate/numeric", "wim/tie_rate/wim",
                    "wim/delta/numeric", "wim/delta/wim"):
            assert key in h, key
    judged = [json.loads(line) for line in (run / "train/online_judgements.jsonl").open()]
    # Step 1 trained (real judgements, ties kept): at a zero adapter each kept pair's loss is
    # log 2, and the logged scores cover the kept pairs only, chosen = the higher score.
    kept = kept_pair_scores(judged, 1)
    assert steps[0]["pairs"] - steps[0]["dropped"] == len(kept) >= 1
    assert logged[0]["loss"] == pytest.approx(LOG2, abs=1e-3)
    assert logged[0]["objective/scores"] == pytest.approx(
        sum(a + b for a, b in kept) / (2 * len(kept)), abs=1e-5)
    assert logged[0]["objective/scores_margin"] == pytest.approx(
        sum(abs(a - b) for a, b in kept) / len(kept), abs=1e-5)
    # Every pair of step 2 was dropped: no loss, no gradient, no pair statistic, and no update.
    # Had the failed judgements been rewards of 0 (TRL's None -> NaN -> 0), the tied pairs
    # would have trained on the first completion (tie policy `first`).
    assert logged[1]["loss"] == 0.0 and logged[1]["grad_norm"] == 0.0
    assert logged[1]["wim/failed"] == 4 and logged[1]["wim/dropped"] == 2
    assert math.isnan(logged[1]["rewards/accuracies"]) and math.isnan(logged[1]["objective/scores"])
    # Step 1 moved the weights, so AdamW holds momentum; the all-dropped step 2 must not use it:
    # every trainable weight after step 2 is bit-identical to the one after step 1.
    assert len(weights) == 3 and weights[0].keys() == weights[2].keys()
    assert any(not torch.equal(weights[0][n], weights[1][n]) for n in weights[0])
    assert all(torch.equal(weights[1][n], weights[2][n]) for n in weights[1])
    failed_rows = [j for j in judged if j["step"] == 2]
    assert len(failed_rows) == 4
    assert all(j["score"] is None and not j["parse_ok"] for j in failed_rows)
    report = json.loads((run / "report.json").read_text())
    assert report["online/failed"] >= 4 and report["online/pairs"] == 6
    markdown = (run / "report.md").read_text()  # a row per step, the failures of step 2 in it
    assert markdown.startswith("# WIM online DPO report") and "| 2 | 2 | " in markdown
    assert (run / "train/adapter/adapter_config.json").is_file()
    later = [s for s in (steps[0], steps[2]) if s["tie_rate/numeric"] is not None]
    assert all(0.0 <= s["tie_rate/numeric"] <= 1.0 and not math.isnan(s["delta/numeric"])
               for s in later)


@pytest.mark.slow
def test_online_authors_policy_scores_failed_judgements_and_counts_them(tmp_path: Path,
                                                                         monkeypatch) -> None:
    """The other configured policy (the authors' code): failed judgements are scored by the
    fallback, counted, and train. Every judgement of the step fails: the first completions keep
    a rating of 8 (fallback "critique": the rating alone, 0.6), the second ones keep nothing
    (fallback "rating+critique": 0.0)."""
    from wim.judges import BackendJudge

    real = BackendJudge.judge

    def failing(self, items, seed=0):
        results = real(self, items, seed=seed)
        half = len(results) // 2
        return [failed(r, rating=8 if i < half else None) for i, r in enumerate(results)]

    monkeypatch.setattr(BackendJudge, "judge", failing)
    run = tmp_path / "online-authors"
    assert main(["run", str(QUICKSTART), "--out", str(run), "--no-progress",
                 *sets([*ONLINE, "dpo.max_steps=1", "judge.on_parse_failure=authors"])]) == 0
    [step] = [json.loads(line) for line in (run / "train/online_steps.jsonl").open()]
    assert (step["pairs"], step["failed"], step["fallback"]) == (2, 4, 4)
    assert step["dropped"] == 0 and step["ties"] == 0
    judged = [json.loads(line) for line in (run / "train/online_judgements.jsonl").open()]
    assert [(j["parse_ok"], j["rating_norm"], j["score"], j["fallback"]) for j in judged] == [
        (False, 0.6, 0.6, "critique")] * 2 + [(False, 0.0, 0.0, "rating+critique")] * 2
    [logged] = [h for h in json.loads((run / "train/log_history.json").read_text()) if "loss" in h]
    # Both pairs trained (excluded, the loss would be 0) with the 0.6 side chosen.
    assert logged["loss"] == pytest.approx(LOG2, abs=1e-3)
    assert logged["objective/scores_margin"] == pytest.approx(0.6, abs=1e-6)
    assert logged["objective/scores"] == pytest.approx(0.3, abs=1e-6)
