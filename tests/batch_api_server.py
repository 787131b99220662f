"""A stand-in for OpenAI's Files and Batches API, speaking the endpoints the `openai` SDK calls:
`POST /v1/files` (multipart), `GET /v1/files` (paginated), `GET /v1/files/{id}/content`,
`POST /v1/batches`, `GET /v1/batches/{id}`, `GET /v1/batches` (paginated).

Not a model: a line is answered with `answer(request) -> text`. As unkind as the real API
(/work/shared/DESIGN.md, "OpenAI Batch API outputs", and OpenAI's API reference):
- each call takes a varied few milliseconds; errors are OpenAI's `{"error": {...}}` bodies;
- a batch is `validating`, then `in_progress` (a cancelled one `cancelling`), then ends as its
  plan says: `completed`, `expired` or `cancelled` with some lines answered (output file) and
  the rest in the error file, in either of its two shapes; `failed` when its input is invalid
  (a duplicate custom_id, a url other than the endpoint);
- output and error lines come shuffled; a file with no line is not made (`output_file_id`
  null, as for a completed batch whose every line failed);
- lists are newest first, in pages (`limit`: batches 1-100, default 20; files up to 10,000),
  with `has_more` and `after`; `busy` other batches are created on the account after each of
  ours, so ours soon sits beyond the first page.
`received[custom_id]`: the times a line was sent in a batch; `answered[custom_id]`: the times
it was answered (billed). `lose_reply`: the calls ("upload", "batch") whose work is done but
whose reply is lost (a 500), as when the client is killed between the call and its record;
"upload#2": the second upload's only.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web

EXPIRED = {"code": "batch_expired",
           "message": "This request could not be executed before the completion window expired."}
CANCELLED = {"code": "batch_cancelled",
             "message": "This request could not be executed before the batch was cancelled."}
TIMEOUT = {"code": "request_timeout", "message": "The request timed out."}
# A batch that fails as a whole: more tokens enqueued than the organisation may have.
TOKEN_LIMIT = {"code": "token_limit_exceeded", "line": None, "param": None,
               "message": "Enqueued token limit reached for gpt-4o-mini in organization org-x. "
                          "Limit: 2,000,000 enqueued tokens. Please try again once some "
                          "in_progress batches have been completed."}
ERROR_CODES = {"expired": EXPIRED, "cancelled": CANCELLED, "timeout": TIMEOUT}
STATUS_BODIES = {
    500: {"message": "The server had an error while processing your request. Sorry about that!",
          "type": "server_error", "param": None, "code": None},
    429: {"message": "Rate limit reached for gpt-4o-mini in organization org-x on tokens per min "
                     "(TPM): Limit 200000, Used 199990, Requested 600. Please try again in 180ms.",
          "type": "tokens", "param": None, "code": "rate_limit_exceeded"},
    400: {"message": "This model's maximum context length is 128000 tokens. However, your "
                     "messages resulted in 130412 tokens. Please reduce the length of the "
                     "messages.", "type": "invalid_request_error", "param": "messages",
          "code": "context_length_exceeded"},
}


@dataclass
class Plan:
    """How a batch ends: its final `status` (`failed`: TOKEN_LIMIT, no line run), and
    `fates(custom_ids, rng)`: each line's fate,
    "ok" (answered), "absent" (in neither file), a key of ERROR_CODES (the `error` shape) or an
    HTTP status of STATUS_BODIES (the `response` shape)."""

    status: str = "completed"
    fates: Callable[[list[str], random.Random], list] = field(
        default=lambda ids, rng: ["ok"] * len(ids))


def chat_completion(text: str) -> dict:
    """An OpenAI chat completion as the Batch API's output lines hold it."""
    return {"id": f"chatcmpl-{random.getrandbits(40):x}", "object": "chat.completion",
            "created": int(time.time()), "model": "gpt-4o-mini-2024-07-18",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text,
                                                 "refusal": None},
                         "logprobs": None, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 120, "completion_tokens": 9, "total_tokens": 129}}


def _error(status: int, message: str, param: str | None = None) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "invalid_request_error",
                                        "param": param, "code": None}}, status=status)


class BatchAPIServer:
    """The stand-in (module docstring), a real aiohttp server in a thread of its own. `plans`:
    how the batches we create end, in order; later ones complete with every line answered."""

    def __init__(self, answer: Callable[[dict], str] = lambda request: "Missing: x\nRating: 6",
                 plans: list[Plan] = (), lose_reply=(), busy: int = 0, seed: int = 0) -> None:
        self.answer, self.plans, self.busy = answer, list(plans), busy
        self.lose_reply = set(lose_reply)
        self.rng = random.Random(seed)
        self.files: dict[str, dict] = {}  # id -> file object, in creation order
        self.contents: dict[str, bytes] = {}
        self.batches: dict[str, dict] = {}  # id -> batch object, in creation order
        self.ours: dict[str, tuple[Plan, list[dict], int]] = {}  # batch -> (plan, lines, polls)
        self.received: Counter = Counter()
        self.answered: Counter = Counter()
        self.uploads = self.created = 0
        self.calls: Counter = Counter()
        app = web.Application(middlewares=[self._latency])
        app.router.add_post("/v1/files", self.upload)
        app.router.add_get("/v1/files", self.list_files)
        app.router.add_get("/v1/files/{id}/content", self.content)
        app.router.add_post("/v1/batches", self.create)
        app.router.add_get("/v1/batches", self.list_batches)
        app.router.add_get("/v1/batches/{id}", self.retrieve)
        self.loop = asyncio.new_event_loop()
        runner = web.AppRunner(app)
        self.loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        port = site._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/v1"
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        for _ in range(busy):  # an account with a history: an old expired batch among them
            self._other_batch(status="expired")

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)

    @web.middleware
    async def _latency(self, request, handler):
        await asyncio.sleep(self.rng.uniform(0.001, 0.02))
        return await handler(request)

    def _lost(self, call: str) -> web.Response | None:
        self.calls[call] += 1
        nth = f"{call}#{self.calls[call]}"  # "upload#2": the second upload's reply only
        if call in self.lose_reply or nth in self.lose_reply:
            self.lose_reply -= {call, nth}
            return web.json_response({"error": {"message": "The server had an error while "
                                                "processing your request.", "type":
                                                "server_error", "param": None, "code": None}},
                                     status=500)
        return None

    def _new_id(self, prefix: str) -> str:
        return f"{prefix}_{self.rng.getrandbits(64):016x}"

    def _add_file(self, name: str, data: bytes, purpose: str) -> dict:
        fid = self._new_id("file")
        self.files[fid] = {"id": fid, "object": "file", "bytes": len(data),
                           "created_at": int(time.time()), "filename": name,
                           "purpose": purpose, "status": "processed", "expires_at": None,
                           "status_details": None}
        self.contents[fid] = data
        return self.files[fid]

    async def upload(self, request):
        form = await request.post()
        if form.get("purpose") not in ("batch", "fine-tune", "assistants", "user_data"):
            return _error(400, f"'{form.get('purpose')}' is not one of ['fine-tune', "
                          "'assistants', 'batch', 'user_data'] - 'purpose'", "purpose")
        upload = form.get("file")
        if upload is None or not hasattr(upload, "file"):
            return _error(400, "No file provided", "file")
        self.uploads += 1
        made = self._add_file(upload.filename, upload.file.read(), form["purpose"])
        return self._lost("upload") or web.json_response(made)

    @staticmethod
    def _page(items: list[dict], query, most: int, default: int) -> web.Response:
        """Newest first, `limit` at a time after the `after` id (OpenAI's cursor lists)."""
        try:
            limit = int(query.get("limit", default))
        except ValueError:
            return _error(400, f"Invalid 'limit': {query.get('limit')!r}", "limit")
        if not 1 <= limit <= most:
            return _error(400, f"Invalid 'limit': integer below minimum value or above maximum "
                          f"value. Expected a value between 1 and {most}, but got {limit}.",
                          "limit")
        items = items[::-1]
        if "after" in query:
            ids = [x["id"] for x in items]
            if query["after"] not in ids:
                return _error(404, f"No such object: '{query['after']}'", "after")
            items = items[ids.index(query["after"]) + 1:]
        page = items[:limit]
        return web.json_response({"object": "list", "data": page,
                                  "first_id": page[0]["id"] if page else None,
                                  "last_id": page[-1]["id"] if page else None,
                                  "has_more": len(items) > limit})

    async def list_files(self, request):
        files = [f for f in self.files.values()
                 if request.query.get("purpose") in (None, f["purpose"])]
        return self._page(files, request.query, 10_000, 10_000)

    async def content(self, request):
        fid = request.match_info["id"]
        if fid not in self.contents:
            return _error(404, f"No such File object: {fid}", "id")
        return web.Response(body=self.contents[fid], content_type="application/octet-stream")

    def _batch_object(self, input_file_id: str, endpoint: str, metadata) -> dict:
        now = int(time.time())
        bid = self._new_id("batch")
        self.batches[bid] = {
            "id": bid, "object": "batch", "endpoint": endpoint, "errors": None,
            "input_file_id": input_file_id, "completion_window": "24h", "status": "validating",
            "output_file_id": None, "error_file_id": None, "created_at": now,
            "in_progress_at": None, "expires_at": now + 86400, "finalizing_at": None,
            "completed_at": None, "failed_at": None, "expired_at": None, "cancelling_at": None,
            "cancelled_at": None, "request_counts": {"total": 0, "completed": 0, "failed": 0},
            "metadata": metadata}
        return self.batches[bid]

    def _other_batch(self, status: str = "completed") -> None:
        """A batch of someone else's on the same account."""
        made = self._add_file("other.jsonl", b"", "batch")
        self._batch_object(made["id"], "/v1/chat/completions", None)["status"] = status

    async def create(self, request):
        body = await request.json()
        if body.get("completion_window") != "24h":
            return _error(400, "Invalid value for 'completion_window': only '24h' is "
                          "supported.", "completion_window")
        if body.get("endpoint") not in ("/v1/chat/completions", "/v1/responses",
                                        "/v1/embeddings", "/v1/completions"):
            return _error(400, f"Invalid value for 'endpoint': {body.get('endpoint')!r}.",
                          "endpoint")
        metadata = body.get("metadata") or {}
        if len(metadata) > 16 or any(len(str(v)) > 512 for v in metadata.values()):
            return _error(400, "Invalid 'metadata': at most 16 pairs of strings up to 512 "
                          "characters.", "metadata")
        fid = body.get("input_file_id")
        if fid not in self.files:
            return _error(404, f"No such File object: {fid}", "input_file_id")
        lines = [json.loads(x) for x in self.contents[fid].splitlines() if x.strip()]
        batch = self._batch_object(fid, body["endpoint"], body.get("metadata"))
        plan = self.plans.pop(0) if self.plans else Plan()
        self.ours[batch["id"]] = (plan, lines, 0)
        self.received.update(line.get("custom_id") for line in lines)
        self.created += 1
        for _ in range(self.busy):  # the account is busy: our batch moves down the list
            self._other_batch()
        return self._lost("batch") or web.json_response(batch)

    async def list_batches(self, request):
        return self._page(list(self.batches.values()), request.query, 100, 20)

    async def retrieve(self, request):
        bid = request.match_info["id"]
        if bid not in self.batches:
            return _error(404, f"No batch found with id '{bid}'.", "batch_id")
        batch = self.batches[bid]
        if bid in self.ours:
            plan, lines, polls = self.ours[bid]
            self.ours[bid] = (plan, lines, polls + 1)
            steps = ["in_progress", *(["cancelling"] if plan.status == "cancelled" else [])]
            if polls < len(steps):
                batch["status"] = steps[polls]
                batch[f"{steps[polls]}_at"] = int(time.time())
            elif batch["status"] not in ("completed", "expired", "cancelled", "failed"):
                self._end(batch, plan, lines)
        return web.json_response(batch)

    def _invalid(self, batch: dict, lines: list[dict]) -> dict | None:
        seen: set = set()
        for number, line in enumerate(lines, 1):
            if line.get("custom_id") in seen:
                return {"code": "duplicate_custom_id", "line": number, "param": "custom_id",
                        "message": "The custom_id for this request is a duplicate of another "
                                   "request. The custom_id parameter must be unique for each "
                                   "request in a batch."}
            seen.add(line.get("custom_id"))
            if line.get("url") != batch["endpoint"] or line.get("method") != "POST":
                return {"code": "invalid_url", "line": number, "param": "url",
                        "message": f"The URL provided for this request does not match the batch "
                                   f"endpoint {batch['endpoint']}."}
        return None

    def _end(self, batch: dict, plan: Plan, lines: list[dict]) -> None:
        invalid = self._invalid(batch, lines) or (plan.status == "failed" and TOKEN_LIMIT)
        if invalid:
            batch.update(status="failed", failed_at=int(time.time()),
                         errors={"object": "list", "data": [invalid]})
            return
        ids = [line["custom_id"] for line in lines]
        out, err = [], []
        for line, fate in zip(lines, plan.fates(ids, self.rng), strict=True):
            cid, rid = line["custom_id"], self._new_id("batch_req")
            if fate == "ok":
                self.answered[cid] += 1
                body = chat_completion(self.answer(line))
                out.append({"id": rid, "custom_id": cid, "error": None, "response": {
                    "status_code": 200, "request_id": self._new_id("req"), "body": body}})
            elif fate in ERROR_CODES:
                err.append({"id": rid, "custom_id": cid, "response": None,
                            "error": ERROR_CODES[fate]})
            elif fate in STATUS_BODIES:
                err.append({"id": rid, "custom_id": cid, "error": None, "response": {
                    "status_code": fate, "request_id": self._new_id("req"),
                    "body": {"error": STATUS_BODIES[fate]}}})
        for key, found in (("output_file_id", out), ("error_file_id", err)):
            if found:  # lines in any order, as the real files hold them
                self.rng.shuffle(found)
                data = "".join(json.dumps(x) + "\n" for x in found).encode()
                batch[key] = self._add_file(f"{batch['id']}_{key[:-8]}.jsonl", data,
                                            "batch_output")["id"]
        batch.update(status=plan.status, request_counts={
            "total": len(lines), "completed": len(out), "failed": len(err)})
        batch[f"{plan.status}_at"] = int(time.time())
