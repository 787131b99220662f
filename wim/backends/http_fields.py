"""Request fields a server refuses, learned from its 4xx, and the payload shaped by what it
accepts (wim/backends/http_backend.py keeps what one backend, so one endpoint and role, learned).

Contract:
- `refused_field(status, body)` names the field a refusal is about, or None. A refusal is a 4xx
  (not 401, 404 or 429) whose error says a field is unsupported or not allowed ("Unsupported
  parameter", "Unsupported value", "is not supported", "not allowed to request logprobs"); the
  field is OpenAI's `error.param`, else the first field of `ADAPTABLE` that the message names.
  Any other 4xx (a prompt too long, "'max_tokens' is too large", a bad model name) teaches
  nothing: it stays an ordinary failure.
- Only the fields of `ADAPTABLE` are learned, each to one fixed change (`shaped`):
  `max_tokens` is sent as `max_completion_tokens`; `temperature` and `top_p` are dropped (the
  server's default then holds); `logprobs` and `top_logprobs` are dropped together (the caller
  then gets no token probabilities).
- `shaped(payload, learned)` is a new dict; the payload given is not changed.
"""

from __future__ import annotations

import json
import re

ADAPTABLE = ("max_tokens", "temperature", "top_p", "logprobs", "top_logprobs")
"""The fields wim sends that a server may refuse, and that wim can do without or rename."""

# The word that makes a 4xx a refusal of a field, not a complaint about its value's size.
_REFUSAL = re.compile(r"unsupported|not supported|does not support|not allowed|not permitted"
                      r"|unrecognized|unknown (?:parameter|field)", re.IGNORECASE)
_NAMED = {name: re.compile(rf"(?<![\w.]){name}(?!\w)") for name in ADAPTABLE}


def refused_field(status: int, body: bytes) -> str | None:
    """The field of `ADAPTABLE` a 4xx refuses (`top_logprobs` is reported as `logprobs`: the
    two go together), or None when the reply refuses none (see the module docstring)."""
    if not 400 <= status < 500 or status in (401, 404, 429):
        return None
    text = body[:4000].decode("utf-8", errors="replace")
    message, param = text, None
    try:
        data = json.loads(text)
        error = data.get("error", data) if isinstance(data, dict) else {}
        if isinstance(error, dict):
            message = str(error.get("message") or text)
            param = error.get("param")
        elif isinstance(error, str):
            message = error
    except ValueError:
        pass
    if not _REFUSAL.search(message):
        return None
    if param not in ADAPTABLE:
        found = [(m.start(), name) for name, pattern in _NAMED.items()
                 if (m := pattern.search(message))]
        param = min(found)[1] if found else None
    return "logprobs" if param == "top_logprobs" else param


def shaped(payload: dict, learned: set[str]) -> dict:
    """`payload` as this server takes it, given the fields it refused (`learned`)."""
    out = dict(payload)
    if "max_tokens" in learned and "max_tokens" in out:
        out["max_completion_tokens"] = out.pop("max_tokens")
    for name in ("temperature", "top_p"):
        if name in learned:
            out.pop(name, None)
    if "logprobs" in learned:
        out.pop("logprobs", None)
        out.pop("top_logprobs", None)
    return out


def sent(payload: dict, field: str) -> bool:
    """Whether `payload` holds `field` (for `logprobs`: either of the pair)."""
    return field in payload or (field == "logprobs" and "top_logprobs" in payload)
