"""`scoring.backend: http` (wim/embedders.py HTTPEmbedder) through the real CLI, against a
stand-in `/v1/embeddings` server whose vectors are known, and one that misbehaves."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import QUICKSTART, run_wim, sets
from recording_server import JSONServer

from wim.config import load_config
from wim.records import read_records
from wim.rundir import RunDir

DIM = 8


def vector(text: str) -> list[float]:
    """A fixed vector per text (not unit length: the client normalizes)."""
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")
    return (np.random.default_rng(seed).normal(size=DIM) * 3).tolist()


class EmbeddingServer(JSONServer):
    """OpenAI embeddings; `fail_after`: every request after that many answers 500; `drop`: one
    vector too few; `odd_dim`: the second request's vectors have another dimension."""

    def __init__(self, fail_after: int | None = None, drop: bool = False,
                 odd_dim: bool = False) -> None:
        self.fail_after, self.drop, self.odd_dim, self.served = fail_after, drop, odd_dim, 0
        super().__init__()

    def respond(self, path: str, body: dict) -> tuple[int, dict]:
        assert path == "/v1/embeddings", path
        with self.lock:
            self.served += 1
            n = self.served
        if self.fail_after is not None and n > self.fail_after:
            return 500, {"error": "the server went away"}
        texts = body["input"][: -1 if self.drop else None]
        data = [{"index": i, "object": "embedding",
                 "embedding": vector(t) + ([0.5] if self.odd_dim and n == 2 else [])}
                for i, t in enumerate(texts)]
        return 200, {"object": "list", "data": data[::-1], "model": body["model"]}  # any order


def _judgements(n: int) -> list[dict]:
    return [{"prompt_id": f"p{i // 4}", "sample_idx": i % 4, "prompt": "Why?",
             "response": f"Because of reason {i}.", "critique": f"Reason {i} is not explained.",
             "rating": 1 + i % 10, "parse_ok": True} for i in range(n)]


def _run(tmp_path: Path, n: int) -> Path:
    out = tmp_path / "run"
    RunDir(out).claim(load_config(QUICKSTART))
    (out / "judgements.jsonl").write_text("".join(json.dumps(j) + "\n" for j in _judgements(n)))
    return out


def _http(url: str, *more: str) -> list[str]:
    return sets(["scoring.backend=http", f"scoring.http.base_urls=[{url}]",
                 "scoring.http.model=stand-in", "scoring.http.max_retries=0",
                 "scoring.batch_size=4", "scoring.http.concurrency=2", "scoring.zeta=1.0",
                 *more])


def _cos(a: str, b: str) -> float:
    va, vb = np.asarray(vector(a)), np.asarray(vector(b))
    return float(va @ vb / np.linalg.norm(va) / np.linalg.norm(vb))


@pytest.mark.parametrize("concurrency", ["2", "auto"])
def test_similarities_come_from_the_server(tmp_path: Path, concurrency: str) -> None:
    server = EmbeddingServer()
    try:
        out = _run(tmp_path, 20)
        run_wim(["score", str(out), *_http(server.url),
                 *sets([f"scoring.http.concurrency={concurrency}"])])
    finally:
        server.close()
    scores = read_records(out / "scores.jsonl")
    for r in scores:
        assert r["similarity"] == pytest.approx(_cos(r["response"], r["critique"]), abs=1e-6)
        assert r["score"] == r["similarity"]
    assert all(len(b["input"]) <= 4 and b["model"] == "stand-in" for b in server.bodies)
    stats = json.loads((out / "stats" / "score.json").read_text())
    assert stats["score/embedder_identity"] == "http:stand-in"
    assert stats["http/score/requests"] == len(server.bodies) == 10  # 40 texts, 4 a request


@pytest.mark.parametrize(("kind", "words"), [("drop", "3 vectors for 4 texts"),
                                             ("odd_dim", "dimension 9")])
def test_a_server_with_wrong_vectors_is_a_clear_error_naming_it(tmp_path: Path, kind: str,
                                                                words: str) -> None:
    server = EmbeddingServer(**{kind: True})
    try:
        out = _run(tmp_path, 8)
        proc = run_wim(["score", str(out), *_http(server.url)], check=False)
    finally:
        server.close()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert words in proc.stderr and server.url in proc.stderr


def test_a_dead_server_keeps_the_scores_written_and_the_same_command_finishes(
        tmp_path: Path) -> None:
    out = _run(tmp_path, 40)
    dying = EmbeddingServer(fail_after=3)
    try:
        proc = run_wim(["score", str(out), *_http(dying.url)], check=False)
    finally:
        dying.close()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "500" in proc.stderr and "run the same command again" in proc.stderr
    written = read_records(out / "scores.jsonl")
    assert 0 < len(written) < 40
    healthy = EmbeddingServer()
    try:  # the same command; the server is back (at another port here, as a config change)
        run_wim(["score", str(out), *_http(healthy.url)])
    finally:
        healthy.close()
    scores = read_records(out / "scores.jsonl")
    assert len(scores) == 40 and scores[: len(written)] == written
    # Only the judgements not yet scored were sent again.
    sent = [t for b in healthy.bodies for t in b["input"]]
    assert not {r["response"] for r in written} & set(sent)


def test_validity_uses_the_configured_embedder(tmp_path: Path) -> None:
    """`wim validity` scores with `scoring.backend: http` as the score stage does (it built
    the in-process embedder itself before), here with an HTTP judge on a stand-in."""
    from recording_server import RecordingServer

    def verdict(messages: list[dict]) -> str:
        digest = hashlib.sha256(messages[-1]["content"].encode()).digest()
        return json.dumps({"missing": f"more on point {digest[1] % 7}",
                           "rating": digest[0] % 10 + 1})

    judge, embeddings = RecordingServer(verdict), EmbeddingServer()
    try:
        run_wim(["validity", str(QUICKSTART), "--limit", "3", "--out", str(tmp_path / "v"),
                 "--no-progress",
                 *_http(embeddings.url, "judge.role=external", "judge.backend=http",
                        f"http.base_urls=[{judge.url}]", "http.model=standin")])
    finally:
        judge.close()
        embeddings.close()
    texts = [t for b in embeddings.bodies for t in b["input"]]
    assert len(texts) == 12  # 3 gold pairs x 2 answers, each response and its critique
    report = json.loads((tmp_path / "v" / "validity.json").read_text())
    assert report["pairs"] == 3 and report["judge_parse_failed"] == 0
