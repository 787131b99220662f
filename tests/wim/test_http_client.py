"""The HTTP transport (wim/backends/http_client.py) under the chat backend, over real HTTP on
127.0.0.1: one in-flight cap shared by every generate call from any thread and kept full
across batches, a dead replica routed around at once, the whole reply under a deadline, the
JSON API other backends use, and no log line per request unless asked for."""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import free_port
from recording_server import JSONServer, chat_completion

from data_gen.flow import batch_window, ordered_map
from wim.backends import SamplingParams
from wim.backends.http_backend import HTTPBackend
from wim.backends.http_client import Failure, HTTPClient

PARAMS = SamplingParams(max_new_tokens=8, temperature=0.0)


def _conv(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


class TimedServer(JSONServer):
    """Answers after the number of seconds the last message says; records each request's
    (start, end) and the most requests it held at once."""

    def __init__(self) -> None:
        self.spans: list[tuple[float, float]] = []
        self.holding = 0
        self.most = 0
        super().__init__()

    def respond(self, path: str, body: dict) -> tuple[int, dict]:
        text = body["messages"][-1]["content"]
        with self.lock:
            self.holding += 1
            self.most = max(self.most, self.holding)
        start = time.monotonic()
        time.sleep(float(text))
        with self.lock:
            self.holding -= 1
            self.spans.append((start, time.monotonic()))
        return 200, chat_completion(f"answer to {text}", 1, 1)


def test_concurrent_calls_share_one_cap_and_keep_it_full():
    """Batches through ordered_map, as the stages run them: several generate calls at once from
    several threads. The server never holds more than the cap, and holds the cap nearly all
    the time: a finished request is replaced from whichever batch waits, not after its own
    batch's slowest. (Calls serialised behind one another would keep it under 50% busy here;
    a pool per call would exceed the cap.)"""
    server = TimedServer()
    cap = 4
    rng = random.Random(0)
    batches = [[f"{rng.choice([0.04, 0.08, 0.3]):.2f}" for _ in range(2)] for _ in range(24)]
    backend = HTTPBackend([server.url], "m", concurrency=cap)
    try:
        def ask(batch):
            return backend.generate([_conv(t) for t in batch], PARAMS)

        got = list(ordered_map(ask, batches, batch_window(backend.max_in_flight, 2)))
    finally:
        backend.close()
        server.close()
    assert [b for b, _ in got] == batches  # results in batch order, each its own batch's
    assert all([c.text for [c] in r] == [f"answer to {t}" for t in b] for b, r in got)
    assert server.most == cap
    work = sum(end - start for start, end in server.spans)
    wall = max(e for _, e in server.spans) - min(s for s, _ in server.spans)
    ideal = max(work / cap, max(float(t) for b in batches for t in b))
    assert work / (cap * wall) > 0.7, (work, wall, ideal)


def test_a_dead_replica_is_routed_around_without_waiting(caplog):
    """One of three base URLs refuses connections. The run finishes with every sample, in far
    less than one backoff (5 s): its requests move to the others at once, not as retries, it
    is marked down once and sent no more than the requests in flight when it was found dead."""
    live = [TimedServer(), TimedServer()]
    dead = f"http://127.0.0.1:{free_port()}/v1"
    backend = HTTPBackend([live[0].url, dead, live[1].url], "m", concurrency=4,
                          backoff_s=5.0, max_retries=2)
    start = time.monotonic()
    try:
        results = backend.generate([_conv("0.01") for _ in range(30)], PARAMS)
    finally:
        backend.close()
        for server in live:
            server.close()
    assert time.monotonic() - start < 4.0
    assert all(c.ok for [c] in results)
    s = backend.stats
    assert s["failures"] == 0 and s["url1_down"] == 1
    assert 1 <= s["url1_requests"] == s["url1_errors"] == s["failovers"] <= 4
    assert s["retries"] == 0  # a failover is not a retry
    assert s["url0_requests"] + s["url2_requests"] == 30
    assert s["url0_down"] == s["url2_down"] == 0
    assert sum("is down" in r.message for r in caplog.records) == 1


def _canned_server(port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers["Content-Length"]))
            body = json.dumps(chat_completion("back", 1, 1)).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server


def test_a_replica_that_comes_back_gets_requests_again(caplog):
    live = TimedServer()
    port = free_port()
    client_urls = [live.url, f"http://127.0.0.1:{port}/v1"]
    backend = HTTPBackend(client_urls, "m", concurrency=1, backoff_s=5.0)
    backend._client.cooldown_s = 0.2
    try:
        backend.generate([_conv("0") for _ in range(4)], PARAMS)
        assert backend.stats["url1_down"] == 1 and backend.stats["url1_requests"] == 1
        revived = _canned_server(port)
        time.sleep(0.3)  # past the cooldown: the next request probes it
        results = backend.generate([_conv("0") for _ in range(4)], PARAMS)
    finally:
        backend.close()
        live.close()
    revived.shutdown()
    revived.server_close()
    assert [c.text for [c] in results].count("back") == 2  # round-robin over both again
    assert backend.stats["url1_requests"] == 3 and backend.stats["failures"] == 0
    assert any("answers again" in r.message for r in caplog.records)


def test_a_trickling_reply_ends_at_the_deadline():
    """Headers at once, then one byte every 0.1 s: the whole reply has timeout_s, not each
    read, so the attempt ends and the request fails within a few timeouts."""
    class Trickle(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            try:
                for _ in range(100):
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(0.1)
            except OSError:
                pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    backend = HTTPBackend([f"http://127.0.0.1:{server.server_address[1]}/v1"], "m",
                          timeout_s=0.5, max_retries=1, backoff_s=0.01)
    start = time.monotonic()
    try:
        [[c]] = backend.generate([_conv("hi")], PARAMS)
    finally:
        backend.close()
        server.shutdown()
        server.server_close()
    assert time.monotonic() - start < 3.0
    assert not c.ok and "timeout after 0.5s" in c.error and "2 attempts" in c.error


class EmbeddingServer(JSONServer):
    def respond(self, path: str, body: dict) -> tuple[int, dict]:
        if path != "/v1/embeddings":
            return 404, {"error": "no such route"}
        return 200, {"data": [{"embedding": [float(len(t))]} for t in body["input"]]}


def test_post_json_and_post_many_from_threads():
    server = EmbeddingServer()
    client = HTTPClient([server.url], concurrency=3, max_retries=2, backoff_s=0.01)
    try:
        payloads = [{"model": "e", "input": ["x" * i]} for i in range(20)]
        many = client.post_many("/embeddings", payloads)
        threaded: list = [None] * 6

        def one(i: int) -> None:
            threaded[i] = client.post_json("/embeddings", {"model": "e", "input": ["y" * i]})

        threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        missing = client.post_json("/nowhere", {"model": "e"})
    finally:
        client.close()
        server.close()
    assert [r["data"][0]["embedding"] for r in many] == [[float(i)] for i in range(20)]
    assert [r["data"][0]["embedding"] for r in threaded] == [[float(i)] for i in range(6)]
    assert isinstance(missing, Failure) and "HTTP 404" in missing.reason
    assert not missing.retry and client.stats["retries"] == 0  # a 404 is not retried
    assert client.stats["requests"] == 27 and client.stats["failures"] == 1


@pytest.mark.parametrize("level", [logging.INFO, logging.DEBUG])
def test_one_log_line_per_request_only_at_debug(caplog, level):
    caplog.set_level(level)
    server = TimedServer()
    backend = HTTPBackend([server.url], "m", concurrency=4)
    try:
        backend.generate([_conv("0") for _ in range(12)], PARAMS)
    finally:
        backend.close()
        server.close()
    per_request = [r for r in caplog.records if r.getMessage().startswith("POST ")]
    assert len(per_request) == (12 if level == logging.DEBUG else 0)
    assert not [r for r in caplog.records if r.levelno == logging.INFO]


def test_a_lagging_batch_does_not_empty_the_slots():
    """Results come in batch order, so a batch whose slow request lags holds its place in the
    window while later batches finish. One request in ten takes 8x the others: with
    flow.batch_window's window the slots stay busy (simulated 94%; a window of one slots'
    worth, 2 + ceil(cap / batch) batches, 66%)."""
    server = TimedServer()
    cap = 4
    rng = random.Random(0)
    texts = ["0.40" if rng.random() < 0.1 else "0.05" for _ in range(160)]
    batches = [texts[i : i + 2] for i in range(0, len(texts), 2)]
    backend = HTTPBackend([server.url], "m", concurrency=cap)
    try:
        window = batch_window(backend.max_in_flight, 2)
        done = sum(len(r) for _, r in ordered_map(
            lambda b: backend.generate([_conv(t) for t in b], PARAMS), batches, window))
    finally:
        backend.close()
        server.close()
    assert done == len(texts)
    work = sum(end - start for start, end in server.spans)
    wall = max(e for _, e in server.spans) - min(s for s, _ in server.spans)
    assert work / (cap * wall) > 0.75, (work, wall)  # measured here, loaded: 85% (old: 62%)
