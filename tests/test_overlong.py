"""A 20,000-character prompt among short ones: cut to fit the context or skipped, counted in
report.json, never an empty response recorded as a sample. Over real HTTP with a configured
context (fast); the bundled transformers model in the slow test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import QUICKSTART, SHRUNK, http_overrides, run_wim, sets

from wim.context import CUT_MARKER
from wim.records import read_keyed

LONG = "Please read this carefully. " + "The committee met again and said little. " * 490 + \
    "So, what did the committee decide?"


def _prompts(tmp_path: Path) -> Path:
    assert len(LONG) > 20_000
    rows = [{"id": "long", "domain": "x", "prompt": LONG},
            {"id": "a", "domain": "x", "prompt": "Why is the sky blue?"},
            {"id": "b", "domain": "y", "prompt": "What is a prime number?"},
            {"id": "c", "domain": "y", "prompt": "How do tides work?"}]
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("rule", ["truncate", "skip"])
def test_overlong_prompt_over_http(flaky_server, tmp_path: Path, rule: str) -> None:
    out = tmp_path / rule
    overrides = [*http_overrides(flaky_server.url), f"prompts.source={_prompts(tmp_path)}",
                 "http.context_tokens=2000", f"generation.overlong={rule}"]
    run_wim(["run", str(QUICKSTART), "--out", str(out), "--skip-train", "--no-progress",
             *sets(overrides)])
    # The estimate is 1 token per 3 characters: nothing over 2000 tokens was ever sent.
    assert flaky_server.longest <= 3 * 2000
    samples = read_keyed(out / "samples.jsonl")
    report = json.loads((out / "report.json").read_text())
    long_samples = [s for s in samples if s["prompt_id"] == "long"]
    if rule == "truncate":
        assert len(samples) == 8 and report["generate/truncated"] == 1
        assert all(s["prompt_truncated"] for s in long_samples)
        assert all(s["messages"][-1]["content"] == LONG for s in long_samples)  # kept whole
        assert report["generate/skipped_overlong"] == 0
        # The judge reads the whole prompt plus the response: cut to fit as well.
        assert report["judge/truncated"] == 2 and report["judge/count"] == 8
    else:
        assert len(samples) == 6 and not long_samples
        assert report["generate/skipped_overlong"] == 1 and report["generate/truncated"] == 0
    assert all(s["response"] for s in samples) and report["generate/empty"] == 0
    assert all("prompt_truncated" not in s for s in samples if s["prompt_id"] != "long")


@pytest.mark.slow
def test_overlong_prompt_with_the_bundled_model(tmp_path: Path) -> None:
    out = tmp_path / "run"
    overrides = [*SHRUNK, f"prompts.source={_prompts(tmp_path)}",
                 "generation.max_prompt_tokens=200", "judge.max_input_tokens=320"]
    run_wim(["run", str(QUICKSTART), "--out", str(out), "--skip-train", "--no-progress",
             *sets(overrides)])
    samples = read_keyed(out / "samples.jsonl")
    report = json.loads((out / "report.json").read_text())
    assert len(samples) == 8 and report["generate/truncated"] == 1
    assert report["judge/truncated"] == 2 and report["judge/skipped_overlong"] == 0
    long_samples = [s for s in samples if s["prompt_id"] == "long"]
    assert all(s["prompt_truncated"] and s["response"].strip() for s in long_samples)
    assert all(s["prompt_tokens"] <= 200 for s in long_samples)
    assert report["generate/empty"] == 0
    judged = read_keyed(out / "judgements.jsonl")
    assert sum(bool(j.get("judge_prompt_truncated")) for j in judged) == 2
    assert CUT_MARKER not in (out / "pairs.jsonl").read_text()  # the dataset keeps the prompt
