"""Real HTTP servers on 127.0.0.1 that record every request they receive.

`JSONServer` is the plumbing (a thread, a free port, each POST's JSON body recorded in arrival
order); a stand-in overrides `respond(path, body)` with what it answers. `RecordingServer` is
the OpenAI-compatible chat stand-in: not a model, `reply(messages) -> text` decides each
answer. Tests use them to see exactly what a backend sends (the blind evaluator must send
nothing but its template, questions and answers) and how it takes a server's answers.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class JSONServer:
    """POSTs of JSON on a free port of 127.0.0.1, served in a thread of its own. `bodies`: the
    JSON body of every request, in arrival order, and `requests` its (path, Authorization
    header); `url`: the server's OpenAI-style base URL."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.requests: list[tuple[str, str | None]] = []  # (path, Authorization header)
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.bodies.append(body)
                    server.requests.append((self.path, self.headers.get("Authorization")))
                status, reply = server.respond(self.path, body)
                data = reply if isinstance(reply, bytes) else json.dumps(reply).encode()
                self.send_response(status)
                if not isinstance(reply, bytes):
                    self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def respond(self, path: str, body: dict) -> tuple[int, dict | bytes]:
        """(HTTP status, reply): a dict is sent as JSON, bytes as they are."""
        raise NotImplementedError

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def chat_completion(text: str, prompt_tokens: int, completion_tokens: int) -> dict:
    """An OpenAI chat completion holding one assistant message, with its token usage."""
    return {"choices": [{"message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}}


class RecordingServer(JSONServer):
    """Chat completions whose text is `reply(messages)`."""

    def __init__(self, reply: Callable[[list[dict]], str]) -> None:
        self.reply = reply
        super().__init__()

    def respond(self, path: str, body: dict) -> tuple[int, dict]:
        return 200, chat_completion(self.reply(body["messages"]), 11, 3)


class ForwardingServer(JSONServer):
    """A recording proxy: each POST is recorded, then sent on to `target` (a base URL ending
    in /v1) and its answer returned as it came. Tests read what a real server received."""

    def __init__(self, target: str, timeout_s: float = 300.0) -> None:
        self.origin = target.rstrip("/").removesuffix("/v1")
        self.timeout_s = timeout_s
        super().__init__()

    def respond(self, path: str, body: dict) -> tuple[int, bytes]:
        import urllib.error
        import urllib.request

        request = urllib.request.Request(self.origin + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
                return reply.status, reply.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
