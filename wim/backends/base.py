"""The backend interface, for both sampling and judging. A backend never raises for one bad
request: it returns a `Completion` with `ok=False`, so the caller counts it and loses nothing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

Conversation = list[dict[str, str]]  # chat messages: [{"role": ..., "content": ...}, ...]


@dataclass(frozen=True)
class Usage:
    """Tokens of one call or of several summed (a judgement's attempts), by kind."""

    prompt: int = 0
    completion: int = 0
    cached: int = 0
    reasoning: int = 0
    batch: bool = False
    """Some call was answered from a Batch API result line."""

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.prompt + other.prompt, self.completion + other.completion,
                     self.cached + other.cached, self.reasoning + other.reasoning,
                     self.batch or other.batch)


@dataclass(frozen=True)
class Completion:
    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ok: bool = True
    error: str | None = None
    top_logprobs: tuple[dict[str, float], ...] = ()
    """Per generated token, {token text: logprob} of the most likely tokens there (with
    `SamplingParams.top_logprobs`; else empty, as when a server gives none)."""
    cached_tokens: int = 0
    """Of `prompt_tokens`, those a server read from its prompt cache (as its `usage` says)."""
    reasoning_tokens: int = 0
    """Of `completion_tokens`, those a server says went to reasoning; local models: 0."""
    batch: bool = False
    """Answered from a Batch API result line (billed with the batch discount)."""

    @property
    def usage(self) -> Usage:
        return Usage(self.prompt_tokens, self.completion_tokens, self.cached_tokens,
                     self.reasoning_tokens, self.batch)
    reasoning: str | None = None
    """A reasoning model's thinking, apart from `text` (a server's `reasoning` or
    `reasoning_content` field; wim/reasoning.py also moves a `<think>` block here); None: none."""
    finish_reason: str | None = None
    """Why generation stopped, as the server said ("stop", "length"); None when not told."""

    @property
    def failure(self) -> str | None:
        """The error as judges and the blind evaluator record it; None when the call succeeded."""
        return None if self.ok else f"backend failed: {self.error}"


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 0.8  # 0 means greedy
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    guide_label: str | None = None
    """Judge format guide (backends with `supports_guide`): after one line of critique, force
    this label (e.g. "Rating:") and allow a few tokens for the value, all in one call."""
    guide_choices: tuple[str, ...] = ()
    """With `guide_label`: the value after the label must be one of these strings (with or
    without a leading space); the model picks among them. Empty: any value (the parser checks)."""
    json_schema: dict | None = None
    """Judge format for servers (backends with `supports_json_schema`): ask for JSON that
    matches this schema (`response_format`); a server that refuses it gets plain text."""
    top_logprobs: int = 0
    """Most likely tokens per generated position (`Completion.top_logprobs`); 0: none."""


def sample_seed(seed: int, conv_index: int, sample_index: int) -> int:
    """The seed of one sample, so that a text does not depend on what else was in the call
    (non-negative 32-bit, which llama.cpp and servers accept)."""
    return (seed + 1000 * conv_index + sample_index) % 2**31


class Backend(ABC):
    """Generates chat completions."""

    name: str = "backend"
    #: True when the backend can continue a partly written assistant turn (`prefill`).
    supports_prefill: bool = False
    #: True when the backend honours `SamplingParams.guide_label`.
    supports_guide: bool = False
    #: True when the backend can ask for `SamplingParams.json_schema` (an HTTP server).
    supports_json_schema: bool = False
    #: Tokens the model attends to (prompt + generated); None when unknown (inputs unchecked).
    context_tokens: int | None = None
    #: The floating-point type a local model computes in; None for a server or llama.cpp.
    dtype: str | None = None
    #: Requests the backend serves at once. Above 1, `generate` may be called from several
    #: threads at the same time and the stages keep that many requests in flight across their
    #: batches (data_gen/flow.py); in-process models serve one call at a time.
    max_in_flight: int = 1

    def count_tokens(self, conversation: Conversation, prefill: str | None = None) -> int:
        """Prompt tokens of a conversation. This default, for backends without a tokenizer,
        estimates on the safe side: one token per 3 characters, plus a few per message."""
        chars = sum(len(m["content"]) for m in conversation) + len(prefill or "")
        return -(-chars // 3) + 8 * len(conversation)

    @abstractmethod
    def generate(self, conversations: list[Conversation], params: SamplingParams, *, n: int = 1,
                 seed: int = 0, prefill: str | list[str] | None = None) -> list[list[Completion]]:
        """`n` completions per conversation, in input order; the same conversations, params
        and seed give the same texts. `prefill` (one string, or one per conversation; only
        where `supports_prefill`) starts the assistant turn and is not part of the texts."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release servers, threads or memory held by the backend."""
