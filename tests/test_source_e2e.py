"""`generation.source` end to end through the real CLI: existing responses are judged, scored,
paired and reported without sampling; the dataset card is written; resume, identity and bad
rows behave as for sampled runs."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import GOOD_VS_GARBAGE, QUICKSTART, run_wim, sets

from wim.records import read_keyed, read_records

MODELS = ("gpt-4", "llama-2-13b-chat", "falcon-40b-instruct", "alpaca-7b")
QUESTIONS = ("What is the capital of France?", "How many legs does a spider have?",
             "Why is the sky blue?", "What is 12 times 12?", "Name a primary colour.",
             "What do bees make?", "What is frozen water called?", "Which planet do we live on?")
# Tiny judging on the bundled models (tests/conftest.py SHRUNK, without its prompt limit).
SMALL = ["prompts.holdout=0", "judge.max_new_tokens=24", "judge.max_retries=1",
         "generation.batch_size=4",
         "dpo.max_steps=2", "dpo.per_device_train_batch_size=2", "dpo.max_length=128"]
NO_POLICY = "policy.model=/nonexistent/policy"  # loading it would fail: proves nothing samples


def write_ultrafeedback(path: Path) -> dict[tuple[str, int], str]:
    """8 prompts x 4 completions in UltraFeedback's shape; returns {(id, idx): response}."""
    rows, texts = [], {}
    for i, question in enumerate(QUESTIONS):
        completions = []
        for j, model in enumerate(MODELS):
            text = f"{model} answers: " + ("a full answer with the reasons." if j == 0
                                           else "not sure. " * j)
            completions.append({"model": model, "response": text, "overall_score": 8.0 - 2 * j,
                                "annotations": {"helpfulness": {"Rating": str(5 - j)}}})
            texts[(f"{i:05d}", j)] = text
        rows.append({"source": "test", "instruction": question, "models": list(MODELS),
                     "completions": completions})
    pd.DataFrame(rows).to_parquet(path)
    return texts


def _card_facts(folder: Path) -> tuple[dict, str]:
    from huggingface_hub import DatasetCard

    card = DatasetCard.load(folder / "README.md")
    return card.data.to_dict(), card.text


@pytest.mark.slow
def test_ultrafeedback_parquet_through_wim_run(tmp_path: Path) -> None:
    import datasets

    source = tmp_path / "uf.parquet"
    texts = write_ultrafeedback(source)
    out = tmp_path / "run"
    cmd = ["run", str(QUICKSTART), "--out", str(out), "--no-progress",
           *sets([*SMALL, f"generation.source={source}"])]
    run_wim(cmd)
    samples = read_keyed(out / "samples.jsonl")
    assert {(s["prompt_id"], s["sample_idx"]): s["response"] for s in samples} == texts
    assert {s["origin"] for s in samples} == set(MODELS)
    generate = json.loads((out / "stats" / "generate.json").read_text())
    assert generate["tokens/policy/out"] == 0 and generate["generate/source_shape"] == \
        "ultrafeedback"
    assert len(read_keyed(out / "judgements.jsonl")) == 32
    pairs = read_records(out / "pairs.jsonl")
    assert pairs and all(p["chosen_origin"] in MODELS and p["rejected_origin"] in MODELS
                         and p["chosen_origin"] != p["rejected_origin"] for p in pairs)
    report = (out / "report.md").read_text()
    assert f"read from {source}" in report
    assert all(f"{m} (8)" in report for m in MODELS)
    assert "## Agreement with the source's own preferences" in report  # from its ratings
    saved = datasets.load_from_disk(str(out / "pairs"))
    assert saved.num_rows == len(pairs) and set(saved["chosen_origin"]) <= set(MODELS)
    meta, text = _card_facts(out / "pairs")
    assert meta["wim"]["judge_model"] == "bundled:smollm2-135m-instruct"
    assert meta["wim"]["zeta"] == 0.4 and meta["wim"]["pairs"] == len(pairs)
    assert meta["wim"]["judgements"] == 32 and meta["wim"]["mechanical_numbers"] is True
    assert "**Mechanical numbers.**" in text and f"read from `{source}`" in text
    assert (out / "train" / "adapter" / "adapter_config.json").is_file()  # DPO took the pairs

    # A killed run: the last samples and judgements are lost; the same command finishes it
    # without judging again what was kept and without a duplicate (read_keyed raises on one).
    kept = (out / "judgements.jsonl").read_text().splitlines(keepends=True)[:20]
    (out / "judgements.jsonl").write_text("".join(kept))
    lines = (out / "samples.jsonl").read_text().splitlines(keepends=True)
    (out / "samples.jsonl").write_text("".join(lines[:-6]))
    run_wim([*cmd, "--skip-train"])
    assert len(read_keyed(out / "samples.jsonl")) == 32
    judgements = (out / "judgements.jsonl").read_text().splitlines(keepends=True)
    assert len(read_keyed(out / "judgements.jsonl")) == 32 and judgements[:20] == kept


@pytest.mark.slow
def test_preference_file_agreement_with_its_labels_and_no_policy(tmp_path: Path) -> None:
    rows = [{"prompt": q, "chosen": [{"role": "assistant", "content": good}],
             "rejected": [{"role": "assistant", "content": bad}]}
            for q, good, bad in GOOD_VS_GARBAGE]
    # Longer than judge.max_input_tokens: judge.overlong=skip leaves both sides unjudged.
    rows.append({"prompt": "Summarise this. " + "word " * 600, "chosen": "ok", "rejected": "no"})
    source = tmp_path / "prefs.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    run_wim(["run", str(QUICKSTART), "--out", str(out), "--no-progress", "--skip-train",
             *sets([*SMALL, f"generation.source={source}", NO_POLICY, "judge.role=external",
                    "judge.model=bundled:smollm2-135m-instruct", "judge.overlong=skip",
                    "judge.max_input_tokens=400"])])
    samples = read_keyed(out / "samples.jsonl")
    assert len(samples) == 18
    assert {s["source_label"] for s in samples if s["sample_idx"] == 0} == {"chosen"}
    judge = json.loads((out / "stats" / "judge.json").read_text())
    assert judge["judge/skipped_overlong"] == 2 and len(read_keyed(out / "judgements.jsonl")) == 16
    agreement = json.loads((out / "agreement.json").read_text())
    assert agreement["labels"] == "chosen/rejected" and agreement["pairs"] == 8
    report = (out / "report.md").read_text()
    assert "## Agreement with the source's own preferences" in report
    assert ("| system | n | right | wrong | ties | failures | accuracy (ties half) | "
            "bootstrap 95% | right / decided (ties out) | Clopper-Pearson 95% |") in report
    for system in ("numeric", "wim", "zeta=0.4"):
        row = agreement["systems"][system]
        assert f"| {system} | {row['n']} | {row['right']} | {row['wrong']} |" in report
    meta, text = _card_facts(out / "pairs")
    assert meta["wim"]["judge_role"] == "external" and "Mechanical numbers" in text


def test_generate_from_a_source_loads_no_model_and_resumes(tmp_path: Path) -> None:
    source = tmp_path / "r.jsonl"
    rows = [{"id": f"q{i}", "prompt": f"Question {i}?",
             "responses": [{"model": "m-a", "response": f"a{i}"}, f"b{i}", f"c{i}"]}
            for i in range(3)] + [{"id": "lonely", "prompt": "One?", "responses": ["only"]}]
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    cmd = ["generate", str(QUICKSTART), "--out", str(out), "--no-progress",
           *sets([f"generation.source={source}", NO_POLICY, "prompts.holdout=0"])]
    run_wim(cmd)
    samples = read_keyed(out / "samples.jsonl")
    assert len(samples) == 9 and "lonely" not in {s["prompt_id"] for s in samples}
    stats = json.loads((out / "stats" / "generate.json").read_text())
    assert stats["generate/source_too_few_responses"] == 1
    assert stats["generate/origins"] == {"(not given)": 6, "m-a": 3}
    meta = yaml.safe_load((out / "resolved_config.yaml").read_text())
    assert len(meta["source_sha256"]) == 64

    lines = (out / "samples.jsonl").read_text().splitlines(keepends=True)
    (out / "samples.jsonl").write_text("".join(lines[:4]))  # killed after 4 records
    run_wim(cmd)
    assert [(s["prompt_id"], s["sample_idx"]) for s in read_keyed(out / "samples.jsonl")] == \
        [(s["prompt_id"], s["sample_idx"]) for s in samples]

    # The same file name with other responses is another run: refused, nothing written.
    source.write_text(source.read_text().replace('"b0"', '"B0"'))
    proc = run_wim(cmd, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "its content has changed since" in proc.stderr

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(rows[0]) + "\n" + json.dumps({"id": "x", "prompt": "Q?",
                                                            "responses": "not a list"}) + "\n")
    fresh = tmp_path / "fresh"
    proc = run_wim(["generate", str(QUICKSTART), "--out", str(fresh), "--no-progress",
                    *sets([f"generation.source={bad}", NO_POLICY, "prompts.holdout=0"])],
                   check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"Response source file '{bad}', line 2: 'responses' is a str, not a list" in \
        proc.stderr
    # The source is streamed: line 1's responses were written before line 2 was read, and
    # they stay (the same command again fails on the same line and duplicates nothing).
    keys = [("q0", 0), ("q0", 1), ("q0", 2)]
    assert [(s["prompt_id"], s["sample_idx"]) for s in read_keyed(fresh / "samples.jsonl")] == keys
    again = run_wim(["generate", str(QUICKSTART), "--out", str(fresh), "--no-progress",
                     *sets([f"generation.source={bad}", NO_POLICY, "prompts.holdout=0"])],
                    check=False)
    assert again.returncode == 2 and "line 2: 'responses' is a str" in again.stderr
    assert [(s["prompt_id"], s["sample_idx"]) for s in read_keyed(fresh / "samples.jsonl")] == keys


def test_sourced_shards_merge_into_the_records_of_one_run(tmp_path: Path) -> None:
    """Shards of a streamed source (each reads the source for the ids and lengths, then its own
    batches) merge, streaming, into exactly the samples of one unsharded import."""
    source = tmp_path / "r.jsonl"
    source.write_text("".join(json.dumps({"id": f"q{i:02d}", "prompt": "Why? " * (i % 5 + 1),
                                          "responses": [f"a{i}", f"b{i}", f"c{i}"]}) + "\n"
                              for i in range(30)))
    overrides = sets([f"generation.source={source}", NO_POLICY, "prompts.holdout=0",
                      "generation.batch_size=4"])
    base = ["generate", str(QUICKSTART), "--no-progress", *overrides]
    run_wim([*base, "--out", str(tmp_path / "one")])
    for i in range(2):
        run_wim([*base, "--out", str(tmp_path / f"s{i}"), "--shard", f"{i}/2"])
    shares = [read_keyed(tmp_path / f"s{i}" / "samples.jsonl") for i in range(2)]
    assert all(shares) and {r["prompt_id"] for r in shares[0]}.isdisjoint(
        {r["prompt_id"] for r in shares[1]})
    run_wim(["merge", str(tmp_path / "s0"), str(tmp_path / "s1"), "--out", str(tmp_path / "m")])
    one = sorted(read_keyed(tmp_path / "one" / "samples.jsonl"),
                 key=lambda r: (r["prompt_id"], r["sample_idx"]))
    assert read_keyed(tmp_path / "m" / "samples.jsonl") == one
