"""A real OpenAI-compatible chat server on 127.0.0.1 that records every request it receives.

Not a model: `reply(messages) -> text` decides each answer. Tests use it to see exactly what a
backend sends (the blind evaluator must send nothing but its template, questions and answers).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class RecordingServer:
    def __init__(self, reply: Callable[[list[dict]], str]) -> None:
        self.reply = reply
        self.requests: list[dict] = []  # the full JSON bodies, in arrival order
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.requests.append(body)
                text = server.reply(body["messages"])
                data = json.dumps({"choices": [{"message": {"role": "assistant",
                                                            "content": text}}],
                                   "usage": {"prompt_tokens": 11, "completion_tokens": 3}})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data.encode())

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
