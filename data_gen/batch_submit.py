"""`wim judge DIR --batch-submit`: the batch request files sent to an OpenAI-compatible Files and
Batches API at judge.http's first base URL (through the `openai` SDK), and the batches' answers
brought back (docs/design.md, "Judging", "Batch files"). What it promises:

- Nothing is submitted twice. Each step is recorded in DIR/batch/submitted.json before and after
  its call; a create whose reply was lost is found again (its upload by name, its batch by input
  file, through every page of the lists) before it is repeated, so the SDK's own retries are off
  for creates and on for reads. An upload's name holds a nonce of this submitted.json and the
  file's content hash, so a new submission never finds an old upload, nor the old (expired,
  cancelled, failed) batch that ran it.
- A batch that has ended (`completed`, `expired`, `cancelled`, `failed`) has its output and
  error files downloaded once, to output-<file> (a completed batch whose every line failed has
  no output file), and its failed lines' distinct messages logged with their counts. Only the
  newest round's request files are sent; how rounds follow one another is in design.md.
- What a line means (`line_outcome`): a 200 is an answer. A line in the `error` shape
  (batch_expired, batch_cancelled, request_timeout) or with a 5xx, 408 or 429 is a request
  without an answer, worth sending again. Any other status (a 4xx) is refused: the API refused
  the request and would refuse it again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai

from wim.backends.http_limits import CHARS_PER_TOKEN, estimated_tokens
from wim.config import Config, judge_http
from wim.errors import StageIncomplete, WimError
from wim.pricing import batch_cost_note
from wim.records import one_line, write_atomic
from wim.rundir import RunDir

logger = logging.getLogger(__name__)

ENDED = ("completed", "expired", "cancelled", "failed")
ROUND_FILE = re.compile(r"resubmit-(\d+)-\d+\.jsonl")


class BatchesRunning(StageIncomplete):
    """Submitted batches that have not finished yet (exit 3: run the same command later)."""

    def __init__(self, states: dict[str, str], run: RunDir) -> None:
        super().__init__("judge", len(states), {"judge/batches_running": len(states)})
        what = ", ".join(f"{b}: {s}" for b, s in states.items())
        self.args = (f"{len(states)} judge batch(es) not finished yet ({what}). Run `wim judge "
                     f"{run.path}` again later to take the answers in.",)


def line_outcome(line: dict) -> str:
    """"answered", "resend" (no answer yet: worth sending again) or "refused" (module doc)."""
    response = line.get("response")
    status = response.get("status_code") if isinstance(response, dict) else None
    if not line.get("error") and status == 200:
        return "answered"
    if line.get("error") or status in (408, 429) or (isinstance(status, int) and status >= 500):
        return "resend"
    return "refused"


def line_error(line: dict) -> str:
    """A failed line's error in one short line: `code: message`, or `HTTP status: message`."""
    error = line.get("error")
    if isinstance(error, dict):
        return f"{error.get('code')}: {str(error.get('message'))[:200]}"
    response = line.get("response") if isinstance(line.get("response"), dict) else {}
    body = response.get("body")
    inner = body.get("error") if isinstance(body, dict) else body
    message = inner.get("message") if isinstance(inner, dict) else inner
    return f"HTTP {response.get('status_code')}: {str(message)[:200]}"


def summarise(messages: Iterable[str], most: int = 8) -> str:
    """The distinct messages with their counts, the commonest first: `35 x batch_expired: ...`."""
    counts = Counter(messages).most_common()
    text = "; ".join(f"{n} x {message}" for message, n in counts[:most])
    return text + (f"; and {len(counts) - most} other message(s)" if len(counts) > most else "")


@dataclass
class Sending:
    """What `--batch-submit` is about to send: requests and their estimated tokens."""

    files: int = 0
    requests: int = 0
    prompt_tokens: int = 0  # characters / 4, as OpenAI's limiter estimates a prompt
    most_completion_tokens: int = 0  # the requests' max_tokens x n

    def add(self, body: dict) -> None:
        self.requests += 1
        self.prompt_tokens += estimated_tokens({"messages": body.get("messages")})
        most = body.get("max_completion_tokens") or body.get("max_tokens") or 0
        self.most_completion_tokens += int(most) * int(body.get("n") or 1)

    def describe(self, cfg: Config) -> str:
        """The line `--batch-submit` logs; with judge.http.price set, the cost at the batch
        discount (wim/pricing.py)."""
        return (f"{self.requests} judge request(s) in {self.files} file(s): about "
                f"{self.prompt_tokens:,} prompt tokens ({CHARS_PER_TOKEN} characters a token), "
                f"at most {self.most_completion_tokens:,} completion tokens"
                + batch_cost_note(cfg, self.prompt_tokens, self.most_completion_tokens))


def sending(files: list[Path]) -> Sending:
    what = Sending(files=len(files))
    for file in files:
        for line in _lines(file):
            what.add(line.get("body") or {})
    return what


class BatchAPI:
    """The Files and Batches calls, through the `openai` SDK. A call that creates something is
    sent once (the SDK sends no idempotency key, so its own retry after a lost reply would make
    a second upload or batch): submit() finds it again instead. Reads are retried by the SDK."""

    def __init__(self, cfg: Config) -> None:
        http = judge_http(cfg)
        if not http.base_urls:
            raise WimError("--batch-submit needs judge.http.base_urls (or http.base_urls).")
        self.base = http.base_urls[0].rstrip("/")
        # Files run to 200 MB: the chat requests' timeout is too short for their transfer.
        self.client = openai.OpenAI(base_url=self.base, max_retries=0,
                                    api_key=os.environ.get(http.api_key_env) or "none",
                                    timeout=max(http.timeout_s, 600.0))
        self.reads = self.client.with_options(max_retries=4)

    @contextlib.contextmanager
    def calling(self, what: str) -> Iterator[None]:
        try:
            yield
        except openai.APIError as err:
            raise WimError(
                f"the Batch API at {self.base} failed on {what} ({one_line(err)}); nothing "
                "recorded is lost: run the same command again.") from None

    def upload(self, name: str, data: bytes) -> str:
        with self.calling("POST /files"):
            return self.client.files.create(file=(name, data, "application/jsonl"),
                                            purpose="batch").id

    def find_upload(self, name: str) -> str | None:
        with self.calling("GET /files"):
            return next((f.id for f in self.reads.files.list(purpose="batch")
                         if f.filename == name), None)

    def create(self, file_id: str, name: str) -> str:
        with self.calling("POST /batches"):
            return self.client.batches.create(
                input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h",
                metadata={"wim_file": name}).id

    def find_batch(self, file_id: str) -> str | None:
        with self.calling("GET /batches"):  # every page: an account may hold many batches
            return next((b.id for b in self.reads.batches.list(limit=100)
                         if b.input_file_id == file_id), None)

    def retrieve(self, batch_id: str) -> Any:
        with self.calling(f"GET /batches/{batch_id}"):
            return self.reads.batches.retrieve(batch_id)

    def download(self, out: Path, file_ids: list[str]) -> None:
        """The files' contents, one after the other, to `out` (atomically, streamed)."""
        def text() -> Iterator[str]:
            for file_id in file_ids:
                with self.calling(f"GET /files/{file_id}/content"), \
                        self.reads.files.with_streaming_response.content(file_id) as reply:
                    last = "\n"
                    for chunk in reply.iter_text():
                        last = chunk[-1:] or last
                        yield chunk
                    if last != "\n":  # the next file's first line starts a line of its own
                        yield "\n"
        write_atomic(out, text())


def _lines(path: Path) -> Iterator[dict]:
    with path.open(encoding="utf-8") as f:
        for text in f:
            if text.strip():
                yield json.loads(text)


def submitted_path(run: RunDir) -> Path:
    return run.batch_folder / "submitted.json"


def load_state(run: RunDir) -> dict:
    path = submitted_path(run)
    state = json.loads(path.read_text()) if path.exists() else {"batches": {}}
    state.setdefault("nonce", uuid.uuid4().hex[:8])  # the upload names of this submitted.json
    return state


def _save(path: Path, data: dict) -> None:
    write_atomic(path, [json.dumps(data, indent=2)])


def round_prefix(number: int) -> str:
    return "requests" if number == 0 else f"resubmit-{number}"


def round_files(run: RunDir, number: int) -> list[Path]:
    return sorted((run.batch_folder).glob(f"{round_prefix(number)}-*.jsonl"))


def newest_round(run: RunDir) -> int:
    """The newest round whose request files are written (0: requests-*.jsonl)."""
    found = (ROUND_FILE.fullmatch(p.name) for p in (run.batch_folder).glob("resubmit-*"))
    return max((int(m.group(1)) for m in found if m), default=0)


def last_round(state: dict) -> int:
    return max((entry.get("round", 0) for entry in state["batches"].values()), default=0)


def sends(run: RunDir, state: dict) -> Counter:
    """custom_id -> the batches it was submitted in."""
    sent: Counter = Counter()
    for name, entry in state["batches"].items():
        if entry.get("batch_id") and (run.batch_folder / name).exists():
            sent.update(line.get("custom_id") for line in _lines(run.batch_folder / name))
    return sent


def submit(cfg: Config, run: RunDir, files: list[Path]) -> None:
    """Upload each request file of one round and start its batch, once (module docstring)."""
    path = submitted_path(run)
    state = load_state(run)
    todo = [f for f in files if not state["batches"].get(f.name, {}).get("batch_id")]
    if not todo:
        return
    number = int(m.group(1)) if (m := ROUND_FILE.fullmatch(todo[0].name)) else 0
    for file in todo:  # every file of the round known before the first call
        state["batches"].setdefault(file.name, {"round": number})
    _save(path, state)
    api = BatchAPI(cfg)
    logger.info("sending to the Batch API at %s: %s", api.base, sending(todo).describe(cfg))
    for file in todo:
        _submit_file(api, path, state, file)


def _submit_file(api: BatchAPI, path: Path, state: dict, file: Path) -> None:
    data = file.read_bytes()
    digest = hashlib.sha256(data).hexdigest()[:16]
    entry = state["batches"][file.name]
    name = entry.get("upload_name") or f"wim-{state['nonce']}-{digest}-{file.name}"
    if digest not in name:
        raise WimError(f"{file} changed since it was submitted as {name}; move {path} away to "
                       "submit the new requests.")
    entry["upload_name"] = name
    if not entry.get("file_id"):
        lost = entry.get("state") == "uploading"  # the last try's reply may have been lost
        entry["state"] = "uploading"
        _save(path, state)
        entry["file_id"] = (lost and api.find_upload(name)) or api.upload(name, data)
        _save(path, state)
    if not entry.get("batch_id"):
        lost = entry.get("state") == "creating batch"
        entry["state"] = "creating batch"
        _save(path, state)
        entry["batch_id"] = (lost and api.find_batch(entry["file_id"])) or api.create(
            entry["file_id"], file.name)
        entry["state"] = "submitted"
        _save(path, state)


def collect(cfg: Config, run: RunDir) -> list[str]:
    """Poll every submitted batch; download the ended ones' output and error files (once) and
    return the downloaded paths, oldest round first. Raises BatchesRunning while any runs."""
    path = submitted_path(run)
    state = load_state(run)
    api = None
    running, outputs = {}, []
    for name, entry in state["batches"].items():
        out = run.batch_folder / f"output-{name}"
        if not out.exists():
            if not entry.get("batch_id"):
                raise WimError(f"{name} was not submitted completely; run `wim judge "
                               f"{run.path} --batch-submit` again to finish submitting it.")
            api = api or BatchAPI(cfg)
            batch = api.retrieve(entry["batch_id"])
            entry["state"] = batch.status
            if batch.status not in ENDED:
                running[entry["batch_id"]] = batch.status
                continue
            api.download(out, [f for f in (batch.output_file_id, batch.error_file_id) if f])
            entry["errors"] = _report_ended(run, name, batch, out)
        outputs.append(str(out))
    _save(path, state)
    if running:
        raise BatchesRunning(running, run)
    return outputs


def _report_ended(run: RunDir, name: str, batch: Any, out: Path) -> dict[str, int]:
    """Log how a batch ended: answered lines, the failed ones' messages with their counts (and
    a failed batch's own errors); returns those counts, kept in submitted.json."""
    total = sum(1 for _ in _lines(run.batch_folder / name))
    lines = list(_lines(out))
    errors = Counter(line_error(x) for x in lines if line_outcome(x) != "answered")
    for error in (batch.errors.data or []) if batch.errors else []:
        errors[f"{error.code}: {error.message}" + (f" (line {error.line})" if error.line
                                                    else "")] += 1
    answered = len(lines) - sum(1 for x in lines if line_outcome(x) != "answered")
    what = (f"batch {batch.id} ({name}) ended {batch.status}: {answered} of {total} requests "
            f"answered")
    if answered == total:
        logger.info(what)
    else:
        absent = total - len(lines)
        logger.warning("%s; %s%s", what, summarise(errors.elements()) or "no error lines",
                       f"; {absent} without a line" if absent > 0 else "")
    return dict(errors)
