"""Token probabilities over HTTP: `SamplingParams.top_logprobs` asks the server for them
(OpenAI's `logprobs: true, top_logprobs: N`) and `Completion.top_logprobs` carries what it
sent back, per generated token; a server that sends none gives ()."""

from __future__ import annotations

import math

from recording_server import JSONServer, chat_completion

from wim.backends import SamplingParams
from wim.backends.http_backend import HTTPBackend

CONV = [[{"role": "user", "content": "Which answer is better?"}]]


class LogprobServer(JSONServer):
    """Answers "A" with a verdict distribution in OpenAI's chat format, when asked for one."""

    def respond(self, path: str, body: dict) -> tuple[int, dict]:
        reply = chat_completion("A", 5, 1)
        if body.get("logprobs"):
            top = [{"token": "A", "logprob": math.log(0.6)},
                   {"token": "B", "logprob": math.log(0.3)},
                   {"token": "t", "logprob": math.log(0.1)}][: body["top_logprobs"]]
            reply["choices"][0]["logprobs"] = {"content": [
                {"token": "A", "logprob": top[0]["logprob"], "top_logprobs": top}]}
        return 200, reply


def test_top_logprobs_are_asked_for_and_read() -> None:
    server = LogprobServer()
    try:
        backend = HTTPBackend([server.url], "m", max_retries=0)
        [[asked]] = backend.generate(CONV, SamplingParams(4, 0.0, top_logprobs=3))
        [[plain]] = backend.generate(CONV, SamplingParams(4, 0.0))
        backend.close()
    finally:
        server.close()
    assert server.bodies[0]["logprobs"] is True and server.bodies[0]["top_logprobs"] == 3
    assert "logprobs" not in server.bodies[1] and "top_logprobs" not in server.bodies[1]
    assert len(asked.top_logprobs) == 1
    probs = {t: math.exp(lp) for t, lp in asked.top_logprobs[0].items()}
    assert probs.keys() == {"A", "B", "t"}
    assert all(math.isclose(probs[t], p) for t, p in {"A": 0.6, "B": 0.3, "t": 0.1}.items())
    assert plain.ok and plain.top_logprobs == ()
