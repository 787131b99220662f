"""`wim judge DIR --batch-submit`: the batch request files sent to an OpenAI-compatible Files and
Batches API at judge.http's base URL, each step recorded in DIR/batch/submitted.json so that a
rerun submits nothing twice (docs/design.md, "Judging", "Batch files").
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from wim.backends.http_limits import estimated_tokens
from wim.config import Config, judge_http
from wim.errors import StageIncomplete, WimError
from wim.pricing import batch_cost_note
from wim.records import write_atomic
from wim.rundir import RunDir

logger = logging.getLogger(__name__)


class BatchesRunning(StageIncomplete):
    """Submitted batches that have not finished yet (exit 3: run the same command later)."""

    def __init__(self, states: dict[str, str], run: RunDir) -> None:
        super().__init__("judge", len(states), {"judge/batches_running": len(states)})
        what = ", ".join(f"{b}: {s}" for b, s in states.items())
        self.args = (f"{len(states)} judge batch(es) not finished yet ({what}). Run `wim judge "
                     f"{run.path}` again later to take the answers in.",)


class BatchAPI:
    """The few calls of OpenAI's Files and Batches API (stdlib HTTP; the key in one header)."""

    def __init__(self, cfg: Config) -> None:
        http = judge_http(cfg)
        if not http.base_urls:
            raise WimError("--batch-submit needs judge.http.base_urls (or http.base_urls).")
        self.base = http.base_urls[0].rstrip("/")
        key = os.environ.get(http.api_key_env) or ""
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.timeout = http.timeout_s

    def call(self, method: str, path: str, body: bytes | None = None,
             content_type: str = "application/json") -> bytes:
        headers = dict(self.headers, **({"Content-Type": content_type} if body else {}))
        request = urllib.request.Request(self.base + path, data=body, method=method,
                                         headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as reply:
                return reply.read()
        except (urllib.error.URLError, OSError) as err:
            raise WimError(
                f"the Batch API at {self.base} failed on {method} {path} ({err}); nothing "
                "recorded is lost: run the same command again.") from None

    def json(self, method: str, path: str, payload: dict | None = None) -> Any:
        body = None if payload is None else json.dumps(payload).encode()
        return json.loads(self.call(method, path, body))

    def upload(self, name: str, data: bytes) -> str:
        boundary = uuid.uuid4().hex
        parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\n'
                 f"batch\r\n".encode(),
                 f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename='
                 f'"{name}"\r\nContent-Type: application/jsonl\r\n\r\n'.encode(), data,
                 f"\r\n--{boundary}--\r\n".encode()]
        reply = json.loads(self.call("POST", "/files", b"".join(parts),
                                     f"multipart/form-data; boundary={boundary}"))
        return reply["id"]

    def find_upload(self, name: str) -> str | None:
        files = self.json("GET", "/files?purpose=batch").get("data") or []
        return next((f["id"] for f in files if f.get("filename") == name), None)

    def find_batch(self, file_id: str) -> str | None:
        batches = self.json("GET", "/batches?limit=100").get("data") or []
        return next((b["id"] for b in batches if b.get("input_file_id") == file_id), None)


def _save(path: Path, data: dict | bytes) -> None:
    write_atomic(path, data if isinstance(data, bytes) else [json.dumps(data, indent=2)])


def submitted_path(run: RunDir) -> Path:
    return run.path / "batch" / "submitted.json"


def about_to_send(cfg: Config, files: list[Path]) -> str:
    """What `files` ask: requests, estimated tokens (prompt characters / 4, as OpenAI's limiter
    counts; output: each request's max_tokens x n) and, where judge.http.price is set, the
    cost at the batch discount (wim/pricing.py)."""
    bodies = [json.loads(line)["body"] for f in files
              for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]
    prompt = sum(estimated_tokens({"messages": b.get("messages")}) for b in bodies)
    output = sum(int(b.get("max_completion_tokens") or b.get("max_tokens") or 0)
                 * int(b.get("n") or 1) for b in bodies)
    return (f"about to send {len(bodies)} judge request(s) in {len(files)} file(s) to the Batch "
            f"API: about {prompt} prompt tokens, at most {output} output tokens"
            + batch_cost_note(cfg, prompt, output))


def submit(cfg: Config, run: RunDir, files: list[Path]) -> None:
    """Upload each request file and start its batch, once (module docstring)."""
    api, path = BatchAPI(cfg), submitted_path(run)
    state = json.loads(path.read_text()) if path.exists() else {"batches": {}}
    unsent = [f for f in files if not state["batches"].get(f.name, {}).get("batch_id")]
    if unsent:
        logger.info(about_to_send(cfg, unsent))
    for file in files:
        data = file.read_bytes()
        entry = state["batches"].setdefault(file.name, {})
        name = f"wim-{hashlib.sha256(data).hexdigest()[:16]}-{file.name}"
        if entry.get("upload_name") not in (None, name):
            raise WimError(f"{file} changed since it was submitted as {entry['upload_name']}; "
                           f"move {path} away to submit the new requests.")
        entry["upload_name"] = name
        if not entry.get("file_id"):
            entry["state"] = "uploading"
            _save(path, state)
            entry["file_id"] = api.find_upload(name) or api.upload(name, data)
            _save(path, state)
        if not entry.get("batch_id"):
            entry["state"] = "creating batch"
            _save(path, state)
            entry["batch_id"] = api.find_batch(entry["file_id"]) or api.json(
                "POST", "/batches", {"input_file_id": entry["file_id"], "endpoint":
                                     "/v1/chat/completions", "completion_window": "24h",
                                     "metadata": {"wim_file": file.name}})["id"]
            entry["state"] = "submitted"
            _save(path, state)


def collect(cfg: Config, run: RunDir) -> list[str]:
    """Poll every submitted batch; download the finished ones' outputs (once) and return their
    paths. Raises BatchesRunning while any batch is still running."""
    api, path = BatchAPI(cfg), submitted_path(run)
    state = json.loads(path.read_text())
    running, outputs = {}, []
    for name, entry in state["batches"].items():
        out = run.path / "batch" / f"output-{name}"
        if not out.exists():
            if not entry.get("batch_id"):
                raise WimError(f"{name} was not submitted completely; run `wim judge "
                               f"{run.path} --batch-submit` again to finish submitting it.")
            batch = api.json("GET", f"/batches/{entry['batch_id']}")
            entry["state"] = batch.get("status")
            if batch.get("status") != "completed":
                if batch.get("status") in ("failed", "expired", "cancelled"):
                    raise WimError(f"batch {entry['batch_id']} ({name}) ended {batch['status']}:"
                                   f" {json.dumps(batch.get('errors'))[:300]}. Move {path} away "
                                   "and submit again.")
                running[entry["batch_id"]] = batch.get("status")
                continue
            lines = b""
            for key in ("output_file_id", "error_file_id"):  # failed lines are in the error file
                if batch.get(key):
                    lines += api.call("GET", f"/files/{batch[key]}/content")
            _save(out, lines)
        outputs.append(str(out))
    _save(path, state)
    if running:
        raise BatchesRunning(running, run)
    return outputs
