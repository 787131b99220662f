"""HTTPBackend over real HTTP: a fault proxy in front of a small OpenAI-compatible stub server,
and (slow, with the llama extra) a real llama-cpp-python server.

`StubServer` is a stdlib HTTP server that answers POST /v1/chat/completions with a well-formed
completion whose text is derived from the request (last user message, seed), so the HTTP is
real and only the faults are staged. `FaultProxy` sits in front of it (or stands alone) and
misbehaves on purpose, request by request. These run without llama-cpp-python.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import free_port

from wim.backends import SamplingParams
from wim.backends.http_backend import HTTPBackend

CONVS = [
    [{"role": "user", "content": "Name three colours."}],
    [{"role": "user", "content": "Why is the sky blue?"}],
]
PARAMS = SamplingParams(max_new_tokens=16, temperature=0.8)
JSON_HEADERS = {"Content-Type": "application/json"}
CANNED = {
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "canned"}}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1},
}


# `server_url` (a real llama-cpp-python server on 127.0.0.1) comes from tests/conftest.py.


class StubServer:
    """An OpenAI-compatible chat-completions endpoint with canned, request-derived replies."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.requests.append(request)
                if self.path != "/v1/chat/completions":
                    self.send_error(404)
                    return
                question = request["messages"][-1]["content"]
                text = f"stub answer to {question!r} with seed {request.get('seed')}"
                body = json.dumps({
                    "object": "chat.completion", "model": request.get("model"),
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": text}}],
                    "usage": {"prompt_tokens": len(question.split()),
                              "completion_tokens": len(text.split())},
                }).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def stub_url():
    stub = StubServer()
    yield stub.url
    stub.close()


def _forward(url: str, body: bytes) -> tuple[int, bytes]:
    """POST `body` to `url`: (status, reply body), an error status too."""
    request = urllib.request.Request(url, data=body, headers=JSON_HEADERS)
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


class FaultProxy:
    """An HTTP server whose i-th request gets the action `plan(i)`.

    Actions: forward (to `upstream`), canned (a valid reply), 500, 429, 400, echo401 (401 whose
    body echoes the Authorization header, as careless servers do), slow (no reply until closed),
    malformed (invalid JSON), nochoices (JSON without choices), close (drop the connection),
    refuse_n (400 naming `n` to a request with n > 1, else forward),
    forward_then_die (forward, then shut the whole server down: later connects are refused).
    """

    def __init__(self, plan: Callable[[int], str], upstream: str | None = None) -> None:
        self.plan = plan
        self.upstream = upstream
        self.count = 0
        self.auth_headers: list[str | None] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.server.handle_error = lambda request, address: None  # client gone: expected here
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        if not self._closed.is_set():
            self._closed.set()
            self.server.shutdown()
            self.server.server_close()

    def _handler(self):
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with proxy._lock:
                    index = proxy.count
                    proxy.count += 1
                    proxy.auth_headers.append(self.headers.get("Authorization"))
                action = proxy.plan(index)
                if action in ("forward", "forward_then_die"):
                    self._reply(*_forward(proxy.upstream + self.path.removeprefix("/v1"), body))
                    if action == "forward_then_die":
                        threading.Thread(target=proxy.close).start()
                elif action == "refuse_n" and json.loads(body).get("n", 1) > 1:
                    self._reply(400, b'{"error": {"message": "\'n\' must be 1"}}')
                elif action == "refuse_n":
                    self._reply(*_forward(proxy.upstream + self.path.removeprefix("/v1"), body))
                elif action == "canned":
                    self._reply(200, json.dumps(CANNED).encode())
                elif action in ("500", "429", "400"):
                    self._reply(int(action), b'{"error": "injected"}')
                elif action == "echo401":
                    echoed = f"bad key: {self.headers.get('Authorization')}"
                    self._reply(401, json.dumps({"error": echoed}).encode())
                elif action == "slow":
                    proxy._closed.wait(30)
                elif action == "malformed":
                    self._reply(200, b'{"choices": [{"message": ')
                elif action == "nochoices":
                    self._reply(200, b'{"object": "chat.completion"}')
                elif action != "close":
                    raise ValueError(f"unknown action {action}")

            def _reply(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        return Handler


@pytest.fixture
def proxies():
    made: list[FaultProxy] = []

    def make(plan: Callable[[int], str], upstream: str | None = None) -> FaultProxy:
        made.append(FaultProxy(plan, upstream))
        return made[-1]

    yield make
    for proxy in made:
        proxy.close()


def _backend(urls: list[str], **kw) -> HTTPBackend:
    kw = {"model": "smollm2", "concurrency": 2, "timeout_s": 30.0, "backoff_s": 0.02, **kw}
    return HTTPBackend(urls, **kw)


def _counts(backend: HTTPBackend) -> dict[str, int]:
    """The backend's request counts over all URLs (the per-URL ones, failovers and the rate
    limits have tests of their own, in test_http_client.py and test_rate_limits.py)."""
    return {k: v for k, v in backend.stats.items() if not k.startswith("url")
            and k not in ("failovers", "rate_limited", "concurrency_limit")}


def _texts(results) -> list[str]:
    return [c.text for row in results for c in row]


@pytest.mark.slow
def test_real_completions(server_url):
    backend = _backend([server_url])
    results = backend.generate(CONVS, PARAMS, n=2, seed=1)
    assert [len(row) for row in results] == [2, 2]
    for c in (c for row in results for c in row):
        assert c.ok and c.error is None and c.text.strip()
        assert c.prompt_tokens > 0 and c.completion_tokens > 0
    # llama-cpp-python's server ignores n and answers one choice: each prompt's second sample
    # comes from a single request (2 requests with n=2, then 2 with n=1), counted.
    assert {k: backend.stats[k] for k in ("requests", "retries", "failures")} == {
        "requests": 4, "retries": 0, "failures": 0}
    assert 1 <= backend.stats["n_fallback"] <= 2


@pytest.mark.slow
def test_same_seed_same_text(server_url):
    # The llama.cpp server honours the per-request seed. Its prefix cache makes a logit
    # depend slightly on the previous request, so each run starts after the same warm-up
    # prompt and sends its requests in one order (concurrency 1).
    backend = _backend([server_url], concurrency=1)
    warm_up = [[{"role": "user", "content": "Say hello."}]]

    def run(seed: int) -> list[str]:
        backend.generate(warm_up, PARAMS, seed=0)
        return _texts(backend.generate(CONVS, PARAMS, n=2, seed=seed))

    first, second, other = run(7), run(7), run(8)
    assert first == second
    assert first != other
    assert len(set(first)) > 1  # each sample has its own seed


def test_round_robin_over_urls(stub_url, proxies):
    a = proxies(lambda i: "forward", stub_url)
    b = proxies(lambda i: "forward", stub_url)
    backend = _backend([a.url, b.url])
    results = backend.generate(CONVS, PARAMS, n=2)
    assert all(c.ok for row in results for c in row)
    assert (a.count, b.count) == (2, 2)
    assert backend.stats["requests"] == 4


def test_a_server_that_refuses_n_gets_one_request_per_sample(stub_url, proxies):
    proxy = proxies(lambda i: "refuse_n", stub_url)
    backend = _backend([proxy.url], concurrency=1)
    results = backend.generate(CONVS, PARAMS, n=3, seed=4)
    assert [len(row) for row in results] == [3, 3]
    assert all(c.ok for row in results for c in row)
    # Each sample has its own seed once the server takes one sample per request.
    assert len({c.text for c in results[0]}) == 3
    # The first request with n=3 was refused (no retry, no failure), then 6 single requests.
    assert proxy.count == 7 and backend.stats["requests"] == 7
    assert backend.stats["n_fallback"] == 1
    assert backend.stats["failures"] == backend.stats["retries"] == 0


def test_slow_reply_is_retried_on_next_url(proxies):
    slow, fast = proxies(lambda i: "slow"), proxies(lambda i: "canned")
    backend = _backend([slow.url, fast.url], concurrency=1, timeout_s=0.5)
    [[c]] = backend.generate(CONVS[:1], PARAMS)
    assert c.ok and c.text == "canned"
    assert (slow.count, fast.count) == (1, 1)
    assert _counts(backend) == {"requests": 2, "retries": 1, "failures": 0, "guided_refused": 0,
                             "n_fallback": 0}


def test_slow_reply_everywhere_is_a_counted_failure(proxies):
    slow = proxies(lambda i: "slow")
    backend = _backend([slow.url], timeout_s=0.3, max_retries=1)
    start = time.monotonic()
    [[c]] = backend.generate(CONVS[:1], PARAMS)
    assert time.monotonic() - start < 10
    assert not c.ok and c.text == ""
    assert "timeout" in c.error and slow.url in c.error and "2 attempts" in c.error
    assert _counts(backend) == {"requests": 2, "retries": 1, "failures": 1, "guided_refused": 0,
                             "n_fallback": 0}


@pytest.mark.parametrize("fault", ["500", "429"])
def test_server_error_then_success(stub_url, proxies, fault):
    proxy = proxies(lambda i: fault if i < 2 else "forward", stub_url)
    backend = _backend([proxy.url], concurrency=1)
    [[c]] = backend.generate(CONVS[:1], PARAMS, seed=5)
    # The reply of the upstream, parsed from real HTTP: the text it derived from this request.
    assert c.ok and c.text == f"stub answer to {CONVS[0][0]['content']!r} with seed 5"
    assert c.completion_tokens == len(c.text.split())
    assert proxy.count == 3
    retries = 0 if fault == "429" else 2  # a 429 pauses and goes again: not a retry
    assert _counts(backend) == {"requests": 3, "retries": retries, "failures": 0,
                                "guided_refused": 0, "n_fallback": 0}
    assert backend.stats["rate_limited"] == (2 if fault == "429" else 0)


def test_client_error_is_not_retried(proxies):
    proxy = proxies(lambda i: "400")
    backend = _backend([proxy.url])
    [[c]] = backend.generate(CONVS[:1], PARAMS)
    assert not c.ok and "HTTP 400" in c.error and proxy.url in c.error
    assert proxy.count == 1
    assert _counts(backend) == {"requests": 1, "retries": 0, "failures": 1, "guided_refused": 0,
                             "n_fallback": 0}


@pytest.mark.parametrize("fault", ["malformed", "nochoices"])
def test_malformed_body_is_retried_then_fails(proxies, fault):
    proxy = proxies(lambda i: fault)
    backend = _backend([proxy.url], max_retries=2)
    [[c]] = backend.generate(CONVS[:1], PARAMS)
    assert not c.ok and c.error.startswith("malformed response from") and "\n" not in c.error
    assert proxy.count == 3
    assert _counts(backend) == {"requests": 3, "retries": 2, "failures": 1, "guided_refused": 0,
                             "n_fallback": 0}


@pytest.mark.parametrize("with_spare", [False, True])
def test_server_dying_mid_run(stub_url, proxies, with_spare):
    dying = proxies(lambda i: "forward_then_die" if i == 0 else "close", stub_url)
    urls = [dying.url] + ([stub_url] if with_spare else [])
    backend = _backend(urls, concurrency=2, max_retries=2)
    convs = CONVS + [[{"role": "user", "content": "Count to three."}]]
    start = time.monotonic()
    results = backend.generate(convs, PARAMS, n=2)
    assert time.monotonic() - start < 30  # a hang guard, not a benchmark
    assert [len(row) for row in results] == [2, 2, 2]  # no silent gap
    done = [c for row in results for c in row]
    failed = [c for c in done if not c.ok]
    # A failed request with n=2 fails both its samples; a single request, one.
    assert len(failed) / 2 <= backend.stats["failures"] <= len(failed)
    assert all(c.error and not c.text for c in failed)
    if with_spare:
        assert not failed  # every retry found the live URL
    else:
        assert len(failed) == 5  # only the first request got through before the server died
        assert dying.url in failed[0].error


def test_api_key_never_leaks(monkeypatch, caplog, proxies):
    secret = secrets.token_hex(16)
    monkeypatch.setenv("WIM_API_KEY", secret)
    caplog.set_level(logging.DEBUG)  # aiohttp logs at DEBUG too
    echo = proxies(lambda i: "echo401")
    refused = f"http://127.0.0.1:{free_port()}/v1"
    backend = _backend([echo.url, refused], max_retries=1)
    results = backend.generate(CONVS, PARAMS, n=1)
    assert echo.auth_headers[0] == f"Bearer {secret}"  # the key is sent...
    errors = [c.error for row in results for c in row]
    assert all(errors) and any("HTTP 401" in e for e in errors)
    for text in [repr(backend), str(backend), caplog.text, *errors]:  # ...and shown nowhere
        assert secret not in text
    assert "WIM_API_KEY" in repr(backend)
