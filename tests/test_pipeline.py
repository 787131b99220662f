"""End to end on the real bundled models: run, re-score, resume after SIGKILL, shards."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import QUICKSTART, ROOT, SHRUNK, run_wim, sets

from wim.cli import main
from wim.records import read_records, record_key

REPORT_KEYS = [
    "pairs/count",
    "pairs/tie_rate/numeric", "pairs/tie_rate/wim", "pairs/tie_rate/mixed",
    "pairs/delta/numeric", "pairs/delta/wim", "pairs/delta/mixed",
    "pairs/agreement/wim",
    "judge/parse_fail_rate", "judge/echoed_rubric", "score/embedder",
    "train/steps", "train/loss_first", "train/loss_last",
    "tokens/generated",
    "time/generate", "time/judge", "time/score", "time/pairs", "time/train",
    "zeta/0/tie_rate", "zeta/0.4/tie_rate", "zeta/1/tie_rate",
]


@pytest.mark.slow
def test_quickstart_end_to_end(finished_run: Path) -> None:
    for name in ("resolved_config.yaml", "samples.jsonl", "judgements.jsonl", "scores.jsonl",
                 "pairs.jsonl", "report.json", "report.md", "report.html",
                 "plots/score_hist.png", "train/adapter/adapter_model.safetensors"):
        assert (finished_run / name).exists(), name
    samples = read_records(finished_run / "samples.jsonl")
    assert sorted(record_key(r) for r in samples) == sorted(
        (r["prompt_id"], j) for r in samples[::2] for j in range(2))
    assert len(samples) == 8 and all(r["response"] for r in samples)
    judgements = read_records(finished_run / "judgements.jsonl")
    assert len(judgements) == 8
    for j in judgements:
        assert {"prompt_id", "sample_idx", "prompt", "response", "critique", "rating",
                "parse_ok", "raw_judge_text", "judge_role", "judge_model"} <= set(j)
        assert not j["parse_ok"] or j["rating"] is not None
    report = json.loads((finished_run / "report.json").read_text())
    missing = [k for k in REPORT_KEYS if k not in report]
    assert not missing, missing
    assert report["train/steps"] == 2
    # What the run computed in, on the machine it ran on (wim/precision.py).
    from wim.precision import resolve_dtype

    dtype = resolve_dtype("auto")
    assert report["dtype/policy"] == report["dtype/judge"] == dtype
    assert report["train/compute_dtype"] == dtype and report["train/lora_dtype"] == "float32"
    # training/cpu_attention.py: eager attention only while a bfloat16 model trains on a CPU
    assert report["train/attention"] == ("wim_bfloat16_eager" if dtype == "bfloat16" else "sdpa")
    assert "machine/cpu_capability" in report and "machine/native_bf16" in report
    assert yaml.safe_load((finished_run / "resolved_config.yaml").read_text())[
        "config"]["policy"]["dtype"] == dtype
    assert report["tokens/generated"] == sum(r["completion_tokens"] for r in samples)
    markdown = (finished_run / "report.md").read_text()
    assert "135M" in markdown
    assert f"{report['judge/echoed_rubric']} echoed the rubric" in markdown
    echoed = sum(j["echoed_attempts"] > 0 for j in judgements)
    assert report["judge/echoed_rubric_any_attempt"] == echoed
    assert f"; {echoed} (" in markdown
    assert "all-minilm-l6-v2" in markdown
    # report.html is one page holding every plot (the DPO per-step plot among them).
    page = (finished_run / "report.html").read_text()
    plots = sorted((finished_run / "plots").glob("*.png"))
    assert {p.name for p in plots} >= {"score_hist.png", "rounds.png", "train.png"}
    for plot in plots:
        assert base64.b64encode(plot.read_bytes()).decode() in page, plot.name
    assert "Read this first." in page and 'id="wim-data"' in page
    # The dataset card of a sampled run: its metadata parses and states judge, zeta, counts.
    from huggingface_hub import DatasetCard

    card = DatasetCard.load(finished_run / "pairs" / "README.md")
    facts = card.data.to_dict()["wim"]
    assert (facts["pairs"], facts["ties_dropped"], facts["judge_parse_failed"]) == (
        report["pairs/count"], report["pairs/ties_dropped"], report["judge/parse_failed"])
    assert facts["judge_model"] == report["judge/model"] and facts["zeta"] == 0.4
    assert facts["mechanical_numbers"] is True and "**Mechanical numbers.**" in card.text
    assert "Sampled by the policy `bundled:smollm2-135m-instruct`" in card.text


@pytest.mark.slow
def test_lora_weights_changed(finished_run: Path) -> None:
    from safetensors.torch import load_file

    weights = load_file(str(finished_run / "train/adapter/adapter_model.safetensors"))
    lora_b = [t for name, t in weights.items() if "lora_B" in name]
    # PEFT starts every lora_B at zero; any non-zero entry was learned by DPO.
    assert lora_b and any(t.abs().max() > 0 for t in lora_b)
    report = json.loads((finished_run / "report.json").read_text())
    assert report["train/lora_delta_norm"] > 0


@pytest.mark.slow
def test_rescore_makes_no_judge_calls(finished_run: Path, tmp_path: Path, monkeypatch) -> None:
    import shutil

    import numpy as np

    from wim import backends, judges
    from wim.cli import main
    from wim.embedders import Embedder

    run = tmp_path / "rescored"
    shutil.copytree(finished_run, run)
    calls = []
    monkeypatch.setattr(judges.BackendJudge, "judge", lambda *a, **k: calls.append(a))
    monkeypatch.setattr(backends.TransformersBackend, "generate", lambda *a, **k: calls.append(a))
    before = (run / "judgements.jsonl").read_bytes()
    assert main(["score", str(run), "--set", "scoring.zeta=1.0", "--no-progress"]) == 0
    assert calls == []
    assert (run / "judgements.jsonl").read_bytes() == before
    scores = read_records(run / "scores.jsonl")
    # The run scores in scoring.dtype (auto: bfloat16 on a CPU that computes it natively), in
    # batches of its own; in bfloat16 a batch's padding moved a cosine by up to 3.3e-3.
    dtype = json.loads((run / "stats/score.json").read_text())[
        "score/embedder_identity"].rsplit(":", 1)[1]
    embedder = Embedder("bundled:all-minilm-l6-v2", dtype=dtype)
    tolerance = 1e-5 if dtype == "float32" else 1e-2
    for s in scores:
        assert s["zeta"] == 1.0
        if not s["parse_ok"]:
            assert s["score"] is None
            continue
        if s["critique"] == "":
            assert s["score"] == 1.0
            continue
        e = embedder.model.encode([s["response"], s["critique"]])
        cos = float(np.dot(e[0], e[1]) / np.linalg.norm(e[0]) / np.linalg.norm(e[1]))
        assert abs(s["score"] - cos) < tolerance


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


EIGHT = [*SHRUNK, "prompts.limit=8"]


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory) -> Path:
    """An uninterrupted, unsharded run of 8 prompts (4 batches of 2) up to the pairs."""
    out = tmp_path_factory.mktemp("ref") / "ref"
    run_wim(["run", str(QUICKSTART), "--out", str(out), "--skip-train", "--no-progress",
             *sets(EIGHT)])
    return out


def _same_records(a: Path, b: Path, name: str) -> None:
    left = sorted(read_records(a / name), key=record_key)
    right = sorted(read_records(b / name), key=record_key)
    assert [record_key(r) for r in left] == [record_key(r) for r in right]
    assert left == right


def _kill_when(cmd: list[str], path: Path, min_lines: int) -> None:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "wim", *cmd], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while _lines(path) < min_lines and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def _surviving(path: Path) -> bytes:
    """The complete lines a killed run left (a torn last line is cut off on resume)."""
    data = path.read_bytes()
    return data[:data.rfind(b"\n") + 1]


def _count_calls(monkeypatch) -> list[tuple[str, int, float]]:
    """Every TransformersBackend.generate call in this process: (policy or judge, how many
    conversations, temperature). The judge prefills its turn; the policy does not."""
    from wim.backends import TransformersBackend

    calls: list[tuple[str, int, float]] = []
    real = TransformersBackend.generate

    def counted(self, conversations, params, **kwargs):
        role = "policy" if kwargs.get("prefill") is None else "judge"
        calls.append((role, len(conversations), params.temperature))
        return real(self, conversations, params, **kwargs)

    monkeypatch.setattr(TransformersBackend, "generate", counted)
    return calls


def _batches_missing(reference_run: Path, have: bytes) -> int:
    """Batches (2 prompts x 2 samples, in the reference run's order) with a record not in
    `have`."""
    order = list(dict.fromkeys(r["prompt_id"] for r in read_records(reference_run /
                                                                    "samples.jsonl")))
    kept = {record_key(json.loads(line)) for line in have.splitlines()}
    batches = [order[i:i + 2] for i in range(0, len(order), 2)]
    return sum(any((p, j) not in kept for p in batch for j in range(2)) for batch in batches)


@pytest.mark.slow
def test_sigkill_and_resume_equals_uninterrupted_run(reference_run: Path, tmp_path: Path,
                                                     monkeypatch) -> None:
    """Killed mid-generation, then mid-judging: each resume keeps the records that survived
    (byte for byte, at the head of the file) and generates or judges only the batches that
    miss a record; the end result equals the uninterrupted run's."""
    out = tmp_path / "killed"
    args = ["--out", str(out), "--no-progress", *sets(EIGHT)]
    cmd = ["run", str(QUICKSTART), "--skip-train", *args]
    _kill_when(cmd, out / "samples.jsonl", 5)  # mid-generation, the first batch written
    samples = _surviving(out / "samples.jsonl")
    assert 4 <= samples.count(b"\n") < 16
    calls = _count_calls(monkeypatch)
    assert main(["generate", str(QUICKSTART), *args]) == 0  # in this process, counted
    assert out.joinpath("samples.jsonl").read_bytes().startswith(samples)
    # Only the batches that missed a sample were generated again (two prompts each).
    assert calls and {role for role, _, _ in calls} == {"policy"}
    assert sum(n for _, n, _ in calls) == 2 * _batches_missing(reference_run, samples) < 8

    _kill_when(cmd, out / "judgements.jsonl", 5)  # mid-judging
    judgements = _surviving(out / "judgements.jsonl")
    assert 4 <= judgements.count(b"\n") < 16  # judging had begun, and not finished
    calls.clear()
    assert main(cmd) == 0
    assert out.joinpath("samples.jsonl").read_bytes().startswith(samples)
    assert out.joinpath("judgements.jsonl").read_bytes().startswith(judgements)
    # No sample was generated again; only the batches that missed a judgement were judged
    # (first attempts are greedy: later ones are retries of parse failures).
    first_attempts = [n for role, n, t in calls if role == "judge" and t == 0.0]
    assert {role for role, _, _ in calls} == {"judge"}
    assert sum(first_attempts) == 4 * _batches_missing(reference_run, judgements) < 16
    for name in ("samples.jsonl", "judgements.jsonl", "scores.jsonl"):
        _same_records(reference_run, out, name)
    assert len(read_records(out / "samples.jsonl")) == 16
    assert len(read_records(out / "judgements.jsonl")) == 16
    ref_pairs = read_records(reference_run / "pairs.jsonl")
    assert read_records(out / "pairs.jsonl") == ref_pairs


@pytest.mark.slow
def test_two_shards_merged_equal_one_run(reference_run: Path, tmp_path: Path) -> None:
    shards = []
    for i in range(2):
        out = tmp_path / f"shard{i}"
        run_wim(["generate", str(QUICKSTART), "--out", str(out), "--shard", f"{i}/2",
                 "--no-progress", *sets(EIGHT)])
        run_wim(["judge", str(out), "--no-progress"])
        shards.append(out)
    # Shards hold disjoint prompts.
    keys = [{r["prompt_id"] for r in read_records(s / "samples.jsonl")} for s in shards]
    assert keys[0] and keys[1] and not keys[0] & keys[1]
    merged = tmp_path / "merged"
    run_wim(["merge", *map(str, shards), "--out", str(merged)])
    _same_records(reference_run, merged, "samples.jsonl")
    _same_records(reference_run, merged, "judgements.jsonl")
    # A repeated key is refused.
    again = run_wim(["merge", str(shards[0]), str(shards[0]), "--out", str(tmp_path / "bad")],
                    check=False)
    assert again.returncode == 2 and "same shard" in again.stderr


@pytest.mark.slow
def test_exported_pairs_go_into_dpo_trainer_as_they_are(finished_run: Path, tmp_path: Path) -> None:
    from datasets import load_dataset, load_from_disk
    from peft import LoraConfig
    from trl import DPOConfig, DPOTrainer

    from wim.models import load_causal_lm

    pairs = load_dataset("json", data_files=str(finished_run / "pairs.jsonl"), split="train")
    saved = load_from_disk(str(finished_run / "pairs"))
    assert saved.to_list() == pairs.to_list()
    assert {"prompt", "chosen", "rejected", "chosen_critique", "rejected_score"} <= set(
        pairs.column_names)
    model, tokenizer = load_causal_lm("bundled:smollm2-135m-instruct", dtype="float32")
    args = DPOConfig(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=2,
                     use_cpu=True, bf16=False, report_to="none", save_strategy="no",
                     activation_checkpointing=False, max_length=96)
    trainer = DPOTrainer(model=model, args=args, train_dataset=pairs, processing_class=tokenizer,
                         peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                                task_type="CAUSAL_LM"))
    assert trainer.train().global_step == 1


@pytest.mark.slow
def test_numeric_baseline_run(tmp_path: Path) -> None:
    out = tmp_path / "numeric"
    run_wim(["run", str(ROOT / "configs" / "numeric_baseline.yaml"), "--out", str(out),
             "--skip-train", "--no-progress", *sets(SHRUNK)])
    judgements = read_records(out / "judgements.jsonl")
    assert len(judgements) == 8
    assert all(j["critique"] is None for j in judgements)
    # Rating only: after the "Rating:" prefill the model wrote one line, the rating parsed from
    # it, and the tokens counted are that line's (plus the end or newline token it stopped on).
    from transformers import AutoTokenizer

    from wim.models import resolve_causal_lm

    tokenizer = AutoTokenizer.from_pretrained(resolve_causal_lm("bundled:smollm2-135m-instruct"))
    for j in judgements:
        rated = j["raw_judge_text"].removeprefix("Rating:")
        assert rated.strip() and "\n" not in rated, j["raw_judge_text"]
        if j["parse_ok"]:
            assert j["rating"] == int(re.match(r"\s*(\d+)", rated)[1]), j["raw_judge_text"]
        if j["attempts"] == 1:  # the count covers every attempt; the text only the last
            written = len(tokenizer(rated, add_special_tokens=False).input_ids)
            assert j["completion_tokens"] - written in (0, 1), j
    report = json.loads((out / "report.json").read_text())
    assert "pairs/tie_rate/numeric" in report and "pairs/tie_rate/wim" not in report
    card = (out / "pairs" / "README.md").read_text()  # written whether or not a pair survived
    assert "judge_mode: numeric" in card and "zeta: 0.0" in card
    # Asking for a WIM mix of rating-only judgements is refused with a clear message.
    proc = run_wim(["score", str(out), "--set", "scoring.zeta=0.4"], check=False)
    assert proc.returncode == 2 and "scoring.zeta=0" in proc.stderr


@pytest.mark.slow
def test_report_metrics_go_to_wandb_when_enabled(finished_run: Path, tmp_path: Path,
                                                 monkeypatch) -> None:
    import shutil

    run = tmp_path / "wandb-run"
    shutil.copytree(finished_run, run)
    # Offline mode: wandb writes its run files locally, exactly as it would before a sync.
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_wim(["report", str(run), "--set", "wandb.enabled=true"], subprocess_=True)  # wandb
    [log] = list((tmp_path / "wandb").glob("offline-run-*/*.wandb"))
    data = log.read_bytes()
    for key in (b"pairs/tie_rate/wim", b"pairs/tie_rate/numeric", b"judge/parse_fail_rate"):
        assert key in data
