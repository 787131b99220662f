"""Text generation backends: one small interface (base.py) used for both sampling and judging.

- `TransformersBackend` (transformers_backend.py): any causal LM on this machine, batched.
- `LlamaCppBackend` (llama_cpp_backend.py): llama-cpp-python, the fast choice on CPU.
- `HTTPBackend` (http_backend.py): any OpenAI-compatible server (vLLM, SGLang, TGI,
  llama.cpp server, OpenAI), concurrent, with retries and round-robin base URLs.

`open_backend` builds one from config; the llama.cpp and HTTP modules are imported only when
used, so the optional llama-cpp-python stays optional.
"""

from __future__ import annotations

from wim.backends.base import Backend, Completion, Conversation, SamplingParams, sample_seed
from wim.backends.transformers_backend import TransformersBackend

__all__ = ["Backend", "Completion", "Conversation", "SamplingParams", "TransformersBackend",
           "client_settings", "open_backend", "open_http_backend", "sample_seed"]


def open_backend(kind: str, model: str, http=None, batch_size: int = 8,
                 adapter: str | None = None, dtype: str = "auto") -> Backend:
    """A `transformers`, `llama_cpp` or `http` backend. `http`: the resolved endpoint (an
    HTTPConfig: `cfg.http`, `wim.config.judge_http(cfg)`, ...); `adapter` (a LoRA folder) and
    `dtype` (wim/precision.py) are for transformers only."""
    if kind == "transformers":
        return TransformersBackend.load(model, batch_size=batch_size, adapter=adapter,
                                        dtype=dtype)
    if kind == "llama_cpp":
        from wim.backends.llama_cpp_backend import LlamaCppBackend

        return LlamaCppBackend.load(model)
    if kind == "http":
        return open_http_backend(http, model)
    raise ValueError(f"unknown backend '{kind}': expected transformers, llama_cpp or http")


def open_http_backend(h, model: str = "") -> Backend:
    """An HTTPBackend from an `http:` section; `h.model`, else `model`, is the name sent."""
    from wim.backends.http_backend import HTTPBackend

    return HTTPBackend(h.base_urls, h.model or model, context_tokens=h.context_tokens,
                       params=h.params, **client_settings(h))


def client_settings(h) -> dict:
    """The transport settings of an `http:` section, as HTTPClient's keyword arguments."""
    names = ("api_key_env", "concurrency", "timeout_s", "max_retries", "max_concurrency",
             "requests_per_minute", "tokens_per_minute")
    return {name: getattr(h, name) for name in names}
