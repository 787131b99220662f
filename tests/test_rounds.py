"""training.rounds: the judge of round 2 is the policy trained in round 1 (changing) or the
base (fixed); the weights are loaded once for all rounds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import QUICKSTART, SHRUNK, run_wim, sets

from wim.cli import main

# A learning rate that makes 3 DPO steps move a 135M model's greedy text; every failed
# judgement is still scored (authors' fallback) and ties go to the first sample, so each
# round has pairs to train on.
# float32: round 2's recorded judgements are compared token for token with the round-1 adapter
# judging again after a fresh load; in bfloat16 (auto on a CPU with AVX512-BF16) the adapter
# trained in memory and the same adapter loaded from disk part on a space now and then.
ROUNDS = [*SHRUNK, "training.rounds=2", "dpo.learning_rate=1e-2", "dpo.max_steps=3",
          "judge.max_retries=0", "judge.on_parse_failure=authors", "pairs.tie_policy=first",
          "dpo.save_steps=0", "policy.dtype=float32"]


def _judge_items(run: Path, n: int = 6) -> list[tuple[str, str]]:
    samples = [json.loads(line) for line in (run / "rounds" / "2" / "samples.jsonl").open()]
    return [(s["prompt"], s["response"]) for s in samples[:n]]


def _recorded(run: Path, n: int = 6) -> list[str]:
    """The raw texts rounds/2/judgements.jsonl holds for `_judge_items(run, n)`."""
    samples = [json.loads(line) for line in (run / "rounds" / "2" / "samples.jsonl").open()]
    raws = {(j["prompt_id"], j["sample_idx"]): j["raw_judge_text"]
            for j in map(json.loads, (run / "rounds" / "2" / "judgements.jsonl").open())}
    return [raws[s["prompt_id"], s["sample_idx"]] for s in samples[:n]]


def _rejudged(run: Path, overrides: list[str]) -> list[str]:
    """Round 2's first generation batch (2 prompts x 2 samples, the first four lines of its
    samples.jsonl) judged again exactly as the run judged it: the same four items in one call,
    the batch's seed, and the dtype the run computed in (bfloat16 and float32 texts differ)."""
    import yaml

    from data_gen.stages import batch_seed

    resolved = yaml.safe_load((run / "rounds" / "2" / "resolved_config.yaml").read_text())
    dtype = resolved["config"]["policy"]["dtype"]
    return _raw([*overrides, f"policy.dtype={dtype}"], _judge_items(run, 4),
                seed=batch_seed(resolved["config"]["seed"], "judge", 0))


def _raw(overrides: list[str], items, seed: int = 0) -> list[str]:
    from data_gen.pipeline import Resources
    from wim.config import load_config

    # dtype pinned: fixed (adapter off) and base (no adapter) are compared token for token.
    res = Resources(load_config(QUICKSTART, [*SHRUNK, "judge.max_retries=0",
                                             "policy.dtype=float32", *overrides]))
    try:
        return [j.raw for j in res.judge().judge(items, seed=seed)]
    finally:
        res.close()


@pytest.mark.slow
def test_two_rounds_changing_judge(tmp_path: Path, monkeypatch) -> None:
    # wandb in offline mode writes its run folder locally, exactly as before a sync.
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / "run"
    run_wim(["run", str(QUICKSTART), "--out", str(run), "--no-progress",
             *sets([*ROUNDS, "judge.role=changing", "wandb.enabled=true"])],
            subprocess_=True)  # wandb's run and its threads stay out of the test process
    report = json.loads((run / "report.json").read_text())
    assert report["training/rounds"] == 2
    for r in (1, 2):
        rdir = run / "rounds" / str(r)
        for name in ("samples.jsonl", "judgements.jsonl", "scores.jsonl", "pairs.jsonl",
                     "train/adapter/adapter_config.json", "report.json"):
            assert (rdir / name).is_file(), f"round {r}: {name} missing"
        for key in ("pairs/tie_rate/numeric", "judge/parse_failed", "train/loss_last",
                    "train/reward_margin_last", "train/reward_accuracy_last",
                    "tokens/policy/out", "time/judge", "train/peak_rss_mb"):
            assert f"round/{r}/{key}" in report, f"round/{r}/{key}"
    round2 = [json.loads(line) for line in (run / "rounds/2/judgements.jsonl").open()]
    adapter1 = str((run / "rounds/1/train/adapter").resolve())
    assert all(adapter1 in j["judge_model"] for j in round2)  # the policy of round 2 judged
    # On the same inputs, the round-2 (changing) judge and the fixed judge answer differently.
    items = _judge_items(run)
    changing = _raw([f"policy.adapter={adapter1}", "judge.role=changing"], items)
    fixed = _raw([f"policy.adapter={adapter1}", "judge.role=fixed"], items)
    base = _raw(["judge.role=fixed"], items)
    assert fixed == base
    assert changing != fixed
    # What round 2 recorded is what round 1's adapter writes, and not what the base model
    # alone writes, on the same call.
    assert _recorded(run, 4) == _rejudged(run, [f"policy.adapter={adapter1}",
                                                "judge.role=changing"])
    assert _recorded(run, 4) != _rejudged(run, ["judge.role=fixed"])
    _check_wandb(tmp_path / "wandb", run)
    # A finished run is not redone: every stage of both rounds is skipped.
    again = run_wim(["run", str(QUICKSTART), "--out", str(run), "--no-progress",
                     *sets([*ROUNDS, "judge.role=changing", "wandb.enabled=true"])],
                    subprocess_=True)
    assert "2/train" in again.stderr and "1/generate" in again.stderr


def _check_wandb(folder: Path, run: Path) -> None:
    """The run's wandb folder holds every round's metrics, the critiques table with scores,
    and the resolved config (TRL's training runs lie beside it)."""
    tables = list(folder.glob("offline-run-*/files/media/table/critiques_*.table.json"))
    assert len(tables) == 1
    table = json.loads(tables[0].read_text())
    assert {"critique", "rating", "score", "round"} <= set(table["columns"])
    rows = [dict(zip(table["columns"], row, strict=True)) for row in table["data"]]
    assert {r["round"] for r in rows} == {1, 2}
    scores = [json.loads(line) for line in (run / "rounds/2/scores.jsonl").open()]
    assert {(s["critique"], s["score"]) for s in scores} == {
        (r["critique"], r["score"]) for r in rows if r["round"] == 2}
    log = next(tables[0].parents[3].glob("*.wandb")).read_bytes()
    for key in (b"round/1/pairs/tie_rate/numeric", b"round/2/train/loss_last",
                b"pairs/tie_rate/numeric", b"online_tie_policy", b"tie_tolerance"):
        assert key in log, key


@pytest.mark.slow
def test_two_rounds_fixed_judge_loads_the_weights_once(tmp_path: Path, monkeypatch) -> None:
    """Count every real model load (the PreTrainedModel.from_pretrained that Auto* classes call)
    of the policy's folder, in this process, over a whole 2-round `wim run`."""
    from transformers import PreTrainedModel

    from wim.models import resolve_causal_lm

    policy_path = resolve_causal_lm("bundled:smollm2-135m-instruct")
    real = PreTrainedModel.from_pretrained.__func__
    loads = []

    def counting(cls, path, *args, **kwargs):
        if str(path) == policy_path:
            loads.append(cls.__name__)
        return real(cls, path, *args, **kwargs)

    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(counting))
    run = tmp_path / "run"
    code = main(["run", str(QUICKSTART), "--out", str(run), "--no-progress",
                 *sets([*ROUNDS, "judge.role=fixed", "dpo.max_steps=1"])])
    assert code == 0
    assert loads == ["LlamaForCausalLM"]
    report = json.loads((run / "report.json").read_text())
    assert report["round/2/train/steps"] == 1
    round2 = [json.loads(line) for line in (run / "rounds/2/judgements.jsonl").open()]
    assert {j["judge_role"] for j in round2} == {"fixed"}
    # Round 2 was judged by the base model: the base model alone (no adapter, a fresh load),
    # judging round 2's first batch greedily as the run did, writes the recorded texts.
    assert _rejudged(run, ["judge.role=fixed"]) == _recorded(run, 4)
