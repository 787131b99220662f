"""The whole loop on a real vLLM server (`http.adapter_serving: vllm`): two 2-round runs, the
fixed judge against the changing one, with the policy sampling on the server and each round's
adapter registered with it. Round 1's judges are the same model (no adapter yet); in round 2
the changing judge judges by the round-1 adapter's served name, the fixed judge by the base
name, so on the same samples their verdicts part."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import QUICKSTART, run_wim, served_models, sets

from wim.records import read_records

# 8 prompts x 2 samples; a high learning rate so that 4 DPO steps move the greedy judge.
ROUNDS = ["prompts.limit=8", "prompts.holdout=0", "generation.max_new_tokens=32",
          "generation.batch_size=8",
          "judge.max_new_tokens=64", "judge.max_retries=1", "dpo.max_steps=4",
          "dpo.per_device_train_batch_size=2", "dpo.max_length=128", "dpo.learning_rate=5e-3",
          "policy.backend=http", "http.adapter_serving=vllm", "http.timeout_s=300",
          "training.rounds=2"]


def rounds_overrides(url: str, name: str, role: str) -> list[str]:
    return [*ROUNDS, f"http.base_urls=[{url}]", f"http.model={name}", f"judge.role={role}"]


def judges_differ(a: Path, b: Path) -> tuple[int, int]:
    """(samples identical in both round folders, of those judged differently)."""
    samples = [{(s["prompt_id"], s["sample_idx"]): s["response"]
                for s in read_records(d / "samples.jsonl")} for d in (a, b)]
    same = {k for k, text in samples[0].items() if samples[1].get(k) == text}
    verdicts = [{(j["prompt_id"], j["sample_idx"]): (j["critique"], j["rating"])
                 for j in read_records(d / "judgements.jsonl")} for d in (a, b)]
    return len(same), sum(verdicts[0].get(k) != verdicts[1].get(k) for k in same)


def test_fixed_and_changing_judges_part_after_round_one(vllm_server, tmp_path: Path) -> None:
    runs = {}
    for role in ("fixed", "changing"):
        runs[role] = tmp_path / role
        run_wim(["run", str(QUICKSTART), "--out", str(runs[role]), "--no-progress",
                 *sets(rounds_overrides(vllm_server.url, vllm_server.name, role))])
    listed = served_models(vllm_server.url)
    for role, out in runs.items():
        served = [json.loads((out / "rounds" / str(r) / "stats" / "train.json").read_text())
                  ["train/served_adapter"] for r in (1, 2)]
        assert served[0] in listed and served[1] in listed, (served, listed)
        assert served[0].startswith("wim-r1-") and served[1].startswith("wim-r2-")
        round2 = read_records(out / "rounds" / "2" / "judgements.jsonl")
        judged_by = {j["judge_served_model"] for j in round2}
        # The changing judge judges by the round-1 adapter, the fixed one by the base name.
        assert judged_by == {served[0] if role == "changing" else vllm_server.name}
        round1 = read_records(out / "rounds" / "1" / "judgements.jsonl")
        assert {j["judge_served_model"] for j in round1} == {vllm_server.name}
        report = json.loads((out / "report.json").read_text())
        assert report["round/2/judge/served_model"] == next(iter(judged_by))
    rounds = [judges_differ(runs["fixed"] / "rounds" / str(r), runs["changing"] / "rounds" / str(r))
              for r in (1, 2)]
    (same1, differ1), (same2, differ2) = rounds
    # Both rounds' samples are the same in both runs (round 1: the base; round 2: the same
    # round-1 training on the same pairs), so the judges are compared on the same inputs.
    # Only where the server computes alike in both runs: on an AMX Xeon, vLLM's bfloat16
    # results depend on which requests it batched together (timing), 1-3 of 16 round-1
    # verdicts differed, so did the pairs, and round 2 shared 1-2 of 16 samples (also with
    # one request in flight). The served-name checks above hold either way.
    if same1 < 12 or same2 < 8:
        pytest.skip(f"the runs' samples diverged (identical, judged differently: {rounds}); "
                    "this server is not deterministic here, so the judges cannot be compared")
    # Round 1's verdicts may part by batching alone (no bound on it); the round-1 adapter
    # must part them far more than that.
    assert differ2 / same2 >= differ1 / same1 + 0.4, rounds
