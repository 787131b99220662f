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


@pytest.mark.slow
def test_online_steps_log_wim_statistics_and_drop_failed_judgements(tmp_path: Path,
                                                                    monkeypatch) -> None:
    from wim.judges import BackendJudge

    real = BackendJudge.judge
    calls = []

    def failing_first_step(self, items, seed=0):
        """Simulated fault: in the first step every judgement fails to parse."""
        results = real(self, items, seed=seed)
        calls.append(len(items))
        if len(calls) > 1:
            return results
        return [dataclasses.replace(r, parse_ok=False, rating=None, critique=None,
                                    error="simulated parse failure") for r in results]

    monkeypatch.setattr(BackendJudge, "judge", failing_first_step)
    run = tmp_path / "online"
    assert main(["run", str(QUICKSTART), "--out", str(run), "--no-progress", *sets(ONLINE)]) == 0

    steps = [json.loads(line) for line in (run / "train/online_steps.jsonl").open()]
    assert [s["step"] for s in steps] == [1, 2, 3]
    first = steps[0]
    assert first["failed"] == 4 and first["dropped"] == first["pairs"] == 2
    assert first["tie_rate/numeric"] is None  # no judged pair, no statistic (not 0)
    logged = [h for h in json.loads((run / "train/log_history.json").read_text()) if "loss" in h]
    assert len(logged) == 3
    for h in logged:
        for key in ("wim/ties", "wim/failed", "wim/tie_rate/numeric", "wim/tie_rate/wim",
                    "wim/delta/numeric", "wim/delta/wim"):
            assert key in h, key
    # Every pair of step 1 was dropped: no loss and no gradient. Had the failed judgements
    # been rewards of 0 (TRL's None -> NaN -> 0), the tied pairs would have trained on the
    # first completion (tie policy `first`), loss log 2 (see the next test).
    assert logged[0]["loss"] == 0.0 and logged[0]["grad_norm"] == 0.0
    assert logged[0]["wim/failed"] == 4 and logged[0]["wim/dropped"] == 2
    judged = [json.loads(line) for line in (run / "train/online_judgements.jsonl").open()]
    failed = [j for j in judged if j["step"] == 1]
    assert len(failed) == 4 and all(j["score"] is None and not j["parse_ok"] for j in failed)
    report = json.loads((run / "report.json").read_text())
    assert report["online/failed"] >= 4 and report["online/pairs"] == 6
    assert (run / "train/adapter/adapter_config.json").is_file()
    later = [s for s in steps[1:] if s["tie_rate/numeric"] is not None]
    assert all(0.0 <= s["tie_rate/numeric"] <= 1.0 and not math.isnan(s["delta/numeric"])
               for s in later)


@pytest.mark.slow
def test_online_authors_policy_scores_failed_judgements_and_counts_them(tmp_path: Path) -> None:
    """The other configured policy (the authors' code): failed judgements are scored by the
    fallback and counted; with ties going `first`, every pair trains (step-1 loss log 2)."""
    run = tmp_path / "online-authors"
    assert main(["run", str(QUICKSTART), "--out", str(run), "--no-progress",
                 *sets([*ONLINE, "dpo.max_steps=1", "judge.on_parse_failure=authors"])]) == 0
    [step] = [json.loads(line) for line in (run / "train/online_steps.jsonl").open()]
    assert step["dropped"] == 0 and step["failed"] == step["fallback"]
    [logged] = [h for h in json.loads((run / "train/log_history.json").read_text()) if "loss" in h]
    assert logged["loss"] == pytest.approx(LOG2, abs=1e-3)
