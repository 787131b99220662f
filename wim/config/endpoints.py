"""OpenAI-compatible endpoints: the `http:` section (the policy's, and every http backend's
default) and `EndpointConfig`, the shape of `judge.http`, `scoring.http` and `blind.http`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

# Where an endpoint section sits in the config (`Config.to_dict` and the fingerprints read it).
ENDPOINT_SECTIONS = ("http", "judge.http", "scoring.http", "blind.http")


@dataclass
class PriceConfig:
    """What a server charges, per million tokens, in one currency of your choice; the run's
    cost is these prices times the tokens the server's `usage` reported (wim/pricing.py)."""

    input: float | None = None
    """Per million prompt tokens (required)."""
    output: float | None = None
    """Per million completion tokens, reasoning tokens included (required)."""
    cached_input: float | None = None
    """Per million prompt tokens the server read from its prompt cache
    (`usage.prompt_tokens_details.cached_tokens`); null: priced as `input`."""
    batch_discount: float = 0.0
    """The share taken off for requests answered through a Batch API: 0.5 = half price."""
# The chat-completion request fields wim sets itself (wim/backends/http_backend.py); an
# endpoint's `params` may not name them: wim would overwrite or contradict them.
WIM_REQUEST_FIELDS = frozenset({
    "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed",
    "n", "stop", "logprobs", "top_logprobs", "response_format", "stream", "stream_options",
    "input", "encoding_format"})


@dataclass
class HTTPConfig:
    base_urls: list[str] = field(default_factory=list)
    """OpenAI-compatible endpoints (…/v1), used round-robin."""
    model: str = ""
    """Model name sent in each request (the server's name for it)."""
    api_key_env: str = "WIM_API_KEY"
    """Environment variable holding the API key; the key itself never goes into a config."""
    concurrency: int | Literal["auto"] = 8
    """Requests in flight at once, over all URLs. `auto`: found from the replies, per URL
    (start low, grow while latency holds, back off on 429, 503 or rising latency)."""
    max_concurrency: int = 256
    """With `concurrency: auto`, the most requests in flight it may reach."""
    requests_per_minute: float | None = None
    """A budget of requests a minute over all URLs, sent at an even pace; null: none."""
    tokens_per_minute: float | None = None
    """A budget of tokens a minute over all URLs (docs/design.md, "Backends"); null: none."""
    timeout_s: float = 60.0
    """Seconds to wait for one reply before it counts as a timeout (and is retried)."""
    max_retries: int = 4
    """Retries with exponential backoff on timeouts and 5xx (a 429 waits, and is not one)."""
    context_tokens: int | None = None
    """The server model's context length, if known (a prompt's length estimated as characters
    / 3); null: no check, the server decides."""
    adapter_serving: Literal["none", "vllm"] = "none"
    """`vllm`: each round's new LoRA adapter is registered with the server (vLLM with
    `--enable-lora`, VLLM_ALLOW_RUNTIME_LORA_UPDATING=True) and sampled by its name, so
    `training.rounds` > 1 works with an http policy (docs/design.md, "Backends"). `none`: local."""
    server_paths: dict[str, str] = field(default_factory=dict)
    """With `adapter_serving`: how the server sees this machine's folders (a shared mount), as
    {local prefix: server prefix}, e.g. {/work/runs: /mnt/runs}; empty: the same paths."""
    price: PriceConfig | None = None
    """What the server charges (input, cached_input, output per million tokens, batch_discount):
    the report then shows each stage's cost; null: tokens only."""
    params: dict[str, Any] = field(default_factory=dict)
    """Extra fields sent with every chat-completion request, as they are: `reasoning_effort:
    low`, `chat_template_kwargs: {enable_thinking: false}`, `service_tier: flex`. A field wim
    sets itself (`model`, `max_tokens`, `temperature`, `logprobs`, ...) is refused."""


@dataclass
class EndpointConfig:
    """The own endpoint of a judge (`judge.http`), an embeddings server (`scoring.http`) or the
    blind evaluator (`blind.http`); each field left null takes its value from `http:`."""

    base_urls: list[str] | None = None
    """This section's endpoints (…/v1); null: `http.base_urls`."""
    model: str | None = None
    """The server's name for the model; null: the section's `model` (`judge.model`,
    `blind.model`) where it has one, else `http.model`."""
    api_key_env: str | None = None
    """Environment variable holding this server's API key; null: `http.api_key_env`."""
    concurrency: int | Literal["auto"] | None = None
    """Requests in flight at once, or `auto`; null: `http.concurrency`."""
    max_concurrency: int | None = None
    """The most in flight under `auto`; null: `http.max_concurrency`."""
    requests_per_minute: float | None = None
    """This section's request budget a minute; null: `http.requests_per_minute`."""
    tokens_per_minute: float | None = None
    """This section's token budget a minute; null: `http.tokens_per_minute`."""
    timeout_s: float | None = None
    """Seconds per reply; null: `http.timeout_s`."""
    max_retries: int | None = None
    """Retries of a request; null: `http.max_retries`."""
    context_tokens: int | None = None
    """The model's context length; null: `http.context_tokens`."""
    price: PriceConfig | None = None
    """What this server charges (as `http.price`); null: `http.price`."""
    params: dict[str, Any] | None = None
    """Extra request fields for this section's server (see `http.params`); null:
    `http.params`."""


def endpoint(http: HTTPConfig, own: EndpointConfig, model: str | None = None) -> HTTPConfig:
    """The settings a backend opens with: `own`, each null field from `http` (the model name:
    `own.model`, else `model`, else `http.model`). Adapters are served by the policy's server
    only, so the result serves none."""
    merged = {f.name: getattr(http, f.name) if getattr(own, f.name) is None
              else getattr(own, f.name) for f in dataclasses.fields(EndpointConfig)}
    merged["model"] = own.model or model or http.model
    return dataclasses.replace(http, **merged, adapter_serving="none", server_paths={})


def drop_prices(data: dict[str, Any], unset_only: bool = False) -> dict[str, Any]:
    """`data` (a config as a dict) without its endpoints' `price` keys, or only those left
    null: a price changes what a run is said to cost, never what it computes. Empty `params`
    go too: like an unset price, they were not there before these keys existed, so a config
    written then keeps its sha256 and fingerprints."""
    for dotted in ENDPOINT_SECTIONS:
        section = data
        for part in dotted.split("."):
            section = section.get(part) if isinstance(section, dict) else None
        if not isinstance(section, dict):
            continue
        if not section.get("params"):
            section.pop("params", None)
        if not unset_only or section.get("price") is None:
            section.pop("price", None)
    return data
