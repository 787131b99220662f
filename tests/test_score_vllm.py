"""`scoring.backend: http` against vLLM's CPU build serving the bundled MiniLM folder in pooling
mode (`--runner pooling`, `/v1/embeddings`), through the real CLI: the quickstart's judgements
score within 1e-4 of the in-process float32 embedder, and a server killed mid-run leaves a clear
message and the scores written, and the same command finishes the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import QUICKSTART, ROOT, SHRUNK, need_vllm_venv, run_wim, sets, tools_launcher

from wim.records import read_records

pytestmark = pytest.mark.slow


def _launcher():
    tools_launcher()  # puts tools/ on sys.path
    import vllm_embedding_server

    return vllm_embedding_server


@pytest.fixture(scope="module")
def quickstart_judged(tmp_path_factory) -> Path:
    """The (shrunk) quickstart, generated, judged and scored in process in float32."""
    out = tmp_path_factory.mktemp("quick") / "run"
    run_wim(["run", str(QUICKSTART), "--out", str(out), "--no-progress", "--skip-train",
             *sets([*SHRUNK, "scoring.dtype=float32"])])
    return out


def _start(port: int, log: Path):
    from wim.models import resolve_embedder

    launcher = _launcher()
    need_vllm_venv(launcher.DEFAULT_PYTHON)
    proc = launcher.start(resolve_embedder("bundled:all-minilm-l6-v2"), port, log)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        launcher.wait_ready(url, proc, log, timeout_s=900)  # a busy 2-core machine is slow
    except RuntimeError as exc:
        launcher.stop(proc)
        pytest.fail(str(exc))
    return proc, url


def _http(url: str, *more: str) -> list[str]:
    return sets(["scoring.backend=http", f"scoring.http.base_urls=[{url}]",
                 "scoring.http.model=minilm", "scoring.http.max_retries=1",
                 "scoring.http.timeout_s=30", *more])


def test_vllm_embeddings_match_in_process_and_a_killed_server_resumes(
        quickstart_judged: Path, tmp_path: Path) -> None:
    launcher = _launcher()
    reference = {(r["prompt_id"], r["sample_idx"]): r["similarity"]
                 for r in read_records(quickstart_judged / "scores.jsonl")}
    # Many judgements from the quickstart's (each response made distinct), so that the run
    # lasts long enough to be killed in the middle.
    judged = read_records(quickstart_judged / "judgements.jsonl")
    out = tmp_path / "http"
    out.mkdir()
    for name in ("resolved_config.yaml", "samples.jsonl", "judgements.jsonl"):
        (out / name).write_bytes((quickstart_judged / name).read_bytes())
    port = launcher.free_port()
    proc, url = _start(port, tmp_path / "server.log")
    try:
        run_wim(["score", str(out), *_http(url, "scoring.batch_size=4")])
        scores = read_records(out / "scores.jsonl")
        assert len(scores) == len(reference) > 0
        for r in scores:
            ref = reference[(r["prompt_id"], r["sample_idx"])]
            assert (r["similarity"] is None) == (ref is None)
            if ref is not None:
                assert abs(r["similarity"] - ref) < 1e-4, r
        many = [{**j, "prompt_id": f"{j['prompt_id']}-{i}",
                 "response": f"{j['response']} (copy {i})"}
                for i in range(60) for j in judged]
        big = tmp_path / "big"
        big.mkdir()
        (big / "resolved_config.yaml").write_bytes((out / "resolved_config.yaml").read_bytes())
        (big / "judgements.jsonl").write_text("".join(json.dumps(j) + "\n" for j in many))
        cmd = [sys.executable, "-m", "wim", "score", str(big),
               *_http(url, "scoring.batch_size=1", "scoring.http.concurrency=2")]
        running = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True,
                                   env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
        scores_file = big / "scores.jsonl"
        deadline = time.monotonic() + 300
        while not (scores_file.exists() and len(read_records(scores_file)) >= 20):
            assert running.poll() is None, running.communicate()[1][-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.05)
        launcher.stop(proc)
        _, err = running.communicate(timeout=300)
        assert running.returncode == 2 and "Traceback" not in err, err[-3000:]
        assert "embeddings server failed" in err and url in err
        assert "run the same command again" in err
        written = read_records(scores_file)
        assert 20 <= len(written) < len(many)
        proc, url = _start(port, tmp_path / "server2.log")  # back, where it was
        run_wim(cmd[3:])
        scores = read_records(scores_file)
        assert len(scores) == len(many) and scores[: len(written)] == written
    finally:
        launcher.stop(proc)
