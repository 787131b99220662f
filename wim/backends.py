"""Text generation backends: one small interface used for both sampling and judging.

- `TransformersBackend`: any causal LM on this machine, batched with left padding, prompts
  sorted by length, n samples per prompt in one `generate` call.
- `LlamaCppBackend` (wim/llama_cpp_backend.py): llama-cpp-python, the fast choice on CPU.
- `HTTPBackend` (wim/http_backend.py): any OpenAI-compatible server (vLLM, SGLang, TGI,
  llama.cpp server, OpenAI), concurrent, with retries and round-robin base URLs.

A backend never raises for one bad request: it returns a `Completion` with `ok=False` and the
error, so the caller counts the failure and nothing already done is lost.
"""

from __future__ import annotations

import contextlib
import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass

logger = logging.getLogger(__name__)

Conversation = list[dict[str, str]]  # chat messages: [{"role": ..., "content": ...}, ...]


@dataclass(frozen=True)
class Completion:
    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ok: bool = True
    error: str | None = None


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 0.8  # 0 means greedy
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    guide_label: str | None = None
    """Judge format guide (backends with `supports_guide`): after one line of critique, force
    this label (e.g. "Rating:") and allow a few tokens for the value, all in one call."""


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

    @abstractmethod
    def generate(
        self,
        conversations: list[Conversation],
        params: SamplingParams,
        *,
        n: int = 1,
        seed: int = 0,
        prefill: str | list[str] | None = None,
    ) -> list[list[Completion]]:
        """Return `n` completions for each conversation, in input order.

        `seed` makes the call reproducible: the same conversations, params and seed give the
        same texts. `prefill` is text the assistant turn starts with (one string for all, or
        one per conversation); the model continues it and the returned text excludes it (only
        where `supports_prefill`).
        """

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release servers, threads or memory held by the backend."""


class TransformersBackend(Backend):
    """Batched generation with a local transformers causal LM."""

    name = "transformers"
    supports_prefill = True
    supports_guide = True

    def __init__(
        self, model, tokenizer, batch_size: int = 8, label: str = "", without_adapter: bool = False
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.label = label
        self.without_adapter = without_adapter
        tokenizer.padding_side = "left"  # decoder-only models continue from the right edge
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token

    @classmethod
    def load(cls, name: str, batch_size: int = 8) -> TransformersBackend:
        model, tokenizer = load_causal_lm(name)
        return cls(model, tokenizer, batch_size=batch_size, label=name)

    def reference_view(self, batch_size: int | None = None) -> TransformersBackend:
        """The same weights with any LoRA adapter disabled: the frozen reference, no copy."""
        return TransformersBackend(self.model, self.tokenizer, batch_size or self.batch_size,
                                   label=self.label, without_adapter=True)

    def render(self, conversation: Conversation, prefill: str | None = None) -> str:
        text = self.tokenizer.apply_chat_template(
            conversation, tokenize=False, add_generation_prompt=True
        )
        return text + (prefill or "")

    def generate(self, conversations, params, *, n=1, seed=0, prefill=None):
        import torch

        prefills = prefill if isinstance(prefill, list) else [prefill] * len(conversations)
        texts = [self.render(c, p) for c, p in zip(conversations, prefills, strict=True)]
        lengths = [len(self.tokenizer(t).input_ids) for t in texts]
        # Sort by length so each batch holds similar lengths and little padding.
        order = sorted(range(len(texts)), key=lambda i: (lengths[i], i))
        results: list[list[Completion] | None] = [None] * len(texts)
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            torch.manual_seed(seed + start)
            batch = self._generate_batch([texts[i] for i in idx], params, n)
            for i, completions in zip(idx, batch, strict=True):
                results[i] = completions
        return results  # type: ignore[return-value]

    def _generate_batch(self, texts: list[str], params: SamplingParams, n: int):
        import torch

        enc = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        sample = params.temperature > 0
        kwargs = dict(
            max_new_tokens=params.max_new_tokens,
            do_sample=sample,
            num_return_sequences=n,
            pad_token_id=self.tokenizer.pad_token_id,
        )
        if sample:
            kwargs.update(temperature=params.temperature, top_p=params.top_p)
        if params.stop:
            kwargs.update(stop_strings=list(params.stop), tokenizer=self.tokenizer)
        if params.guide_label:
            from wim.guided import FormatGuide

            guide = FormatGuide(self.tokenizer, enc.input_ids.shape[1], len(texts) * n,
                                label=params.guide_label,
                                max_critique_tokens=max(1, params.max_new_tokens - 6))
            kwargs.update(logits_processor=[guide], stopping_criteria=[guide.stopper()])
        adapter_off = getattr(self.model, "disable_adapter", None) if self.without_adapter else None
        with torch.inference_mode(), (adapter_off() if adapter_off else contextlib.nullcontext()):
            out = self.model.generate(**enc, **kwargs)
        prompt_len = enc.input_ids.shape[1]
        new = out[:, prompt_len:]
        results = []
        for row in range(len(texts)):
            prompt_tokens = int(enc.attention_mask[row].sum())
            completions = []
            for j in range(n):
                ids = new[row * n + j]
                count = _count_generated(ids, self.tokenizer)
                text = self.tokenizer.decode(ids[:count], skip_special_tokens=True)
                text = _cut_at_stop(text, params.stop)
                completions.append(Completion(text, prompt_tokens, count))
            results.append(completions)
        return results


def _count_generated(ids, tokenizer) -> int:
    """Generated tokens up to and including the first end-of-sequence token."""
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id
    stops = {t for t in (eos, pad) if t is not None}
    for i, token in enumerate(ids.tolist()):
        if token in stops:
            return i + 1 if token == eos else i
    return len(ids)


def _cut_at_stop(text: str, stop: tuple[str, ...]) -> str:
    for s in stop:
        pos = text.find(s)
        if pos >= 0:
            text = text[:pos]
    return text


def load_causal_lm(name: str):
    """Load a causal LM and its tokenizer, resolving `bundled:` names (float32 on CPU)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from wim.models import model_load_error, resolve_causal_lm

    path = resolve_causal_lm(name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path)
    except (OSError, ValueError) as err:
        raise model_load_error(name, err) from None
    model.eval()
    return model, tokenizer


def open_backend(kind: str, model: str, cfg, batch_size: int = 8) -> Backend:
    """Build a backend from config: `transformers`, `llama_cpp` or `http` (`cfg` is a Config)."""
    if kind == "transformers":
        return TransformersBackend.load(model, batch_size=batch_size)
    if kind == "llama_cpp":
        from wim.llama_cpp_backend import LlamaCppBackend

        return LlamaCppBackend.load(model)
    if kind == "http":
        from wim.http_backend import HTTPBackend

        h = cfg.http
        return HTTPBackend(h.base_urls, h.model or model, api_key_env=h.api_key_env,
                           concurrency=h.concurrency, timeout_s=h.timeout_s,
                           max_retries=h.max_retries)
    raise ValueError(f"unknown backend '{kind}': expected transformers, llama_cpp or http")
