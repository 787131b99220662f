"""Runs on the other backends: an external judge on a real OpenAI-compatible server on
127.0.0.1, and llama.cpp as policy and judge."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest
from conftest import (
    QUICKSTART,
    SHRUNK,
    FlakyServer,
    check_two_step_judgement,
    http_overrides,
    run_wim,
    sets,
)

from wim.records import read_records


@pytest.mark.slow
def test_http_judge_run_never_writes_the_api_key(server_url: str, tmp_path: Path,
                                                  monkeypatch) -> None:
    key = "sk-test-" + secrets.token_hex(16)
    monkeypatch.setenv("WIM_JUDGE_KEY", key)
    out = tmp_path / "http"
    overrides = [*SHRUNK, "judge.role=external", "judge.backend=http",
                 f"http.base_urls=[{server_url}]", "http.model=smollm2",
                 "http.api_key_env=WIM_JUDGE_KEY", "http.timeout_s=60"]
    proc = run_wim(["run", str(QUICKSTART), "--out", str(out), "--skip-train", "--no-progress",
                    *sets(overrides)])
    judgements = read_records(out / "judgements.jsonl")
    assert len(judgements) == 8
    assert all(j["judge_role"] == "external" and j["judge_model"] == "smollm2"
               for j in judgements)
    # The server answered every request: each judgement holds the server's text, parsed or not.
    assert all(j["raw_judge_text"] or not j["parse_ok"] for j in judgements)
    report = json.loads((out / "report.json").read_text())
    assert report["tokens/judge/in"] > 0
    assert report["http/judge/requests"] >= 8 and report["http/judge/failures"] == 0
    leaked = [p for p in out.rglob("*") if p.is_file() and key.encode() in p.read_bytes()]
    assert leaked == []
    assert key not in proc.stdout + proc.stderr


def test_a_judge_with_its_own_endpoint_sends_nothing_to_the_policy_server(tmp_path: Path) -> None:
    """judge.http: the policy samples on one server, the judge answers on another."""
    policy, judge = FlakyServer(), FlakyServer()
    out = tmp_path / "two_servers"
    try:
        run_wim(["run", str(QUICKSTART), "--out", str(out), "--skip-train", "--no-progress",
                 *sets([*http_overrides(policy.url), "prompts.limit=4",
                        f"judge.http.base_urls=[{judge.url}]", "judge.http.model=judge-70b"])])
    finally:
        policy.close()
        judge.close()
    judgements = read_records(out / "judgements.jsonl")
    assert len(judgements) == 8 and all(j["judge_model"] == "judge-70b" for j in judgements)
    assert policy.counts["judge"] == 0 and policy.counts["generate"] >= 4
    assert judge.counts["generate"] == 0 and judge.counts["judge"] >= 8
    # The judge's endpoint is part of the run's identity: another judge server is refused.
    other = run_wim(["run", str(QUICKSTART), "--out", str(out), "--skip-train", "--no-progress",
                     *sets([*http_overrides(policy.url), "prompts.limit=4",
                            "judge.http.base_urls=[http://127.0.0.1:9/v1]",
                            "judge.http.model=judge-70b"])], check=False)
    assert other.returncode != 0 and "judge_http" in other.stderr, other.stderr


@pytest.mark.slow
def test_llama_cpp_policy_and_judge_run(tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp", reason="needs the llama extra: pip install 'wim[llama]'")
    out = tmp_path / "llama"
    run_wim(["run", str(QUICKSTART), "--out", str(out), "--skip-train", "--no-progress",
             *sets([*SHRUNK, "policy.backend=llama_cpp"])])
    samples = read_records(out / "samples.jsonl")
    judgements = read_records(out / "judgements.jsonl")
    assert len(samples) == len(judgements) == 8
    # llama.cpp cannot use the guided format, so the judge runs in two prefilled steps; the
    # records hold what the model wrote in each and what that parsed to.
    for j in judgements:
        check_two_step_judgement(j["raw_judge_text"], j["critique"], j["rating"], j["parse_ok"])
    assert any(j["parse_ok"] for j in judgements)
    report = json.loads((out / "report.json").read_text())
    assert report["tokens/policy/out"] == sum(s["completion_tokens"] for s in samples)
