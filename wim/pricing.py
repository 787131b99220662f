"""What a run cost: the tokens the servers' `usage` reported, by kind, priced by `http.price`.

The rules it keeps:
- Tokens are counted from the records (samples.jsonl, judgements.jsonl), so a resumed or rescued
  run counts each record once, and only what was answered (a 5xx, a timeout or a failed batch
  line is not billed and has no record). A record holds `cached_tokens` and `reasoning_tokens`
  only where a server reported some (`usage.prompt_tokens_details.cached_tokens`,
  `usage.completion_tokens_details.reasoning_tokens`); local models count prompt and completion
  tokens only, and nothing is estimated in their place.
- Cached tokens are part of the prompt tokens, reasoning tokens part of the completion tokens,
  as OpenAI and vLLM count them. So the cached ones cost `cached_input` (else `input`), the
  rest of the prompt `input`, and every completion token, reasoning included, `output`: no
  token is priced twice.
- A judgement answered from a Batch API result line (`batch: true` in its record) is priced
  with `batch_discount` taken off, all its attempts included: with `judge.batch_retry: live`
  a parse retry asked live is priced at the batch price too.
- A role served by a local model has no price, whatever `http.price` says (a local judge under
  a priced `http:`): no cost key at all, never a cost of 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from wim.backends.base import Usage
from wim.config import Config, PriceConfig, judge_http

# The token counts of a record, beyond what the record is about (a judgement drops its sample's).
TOKEN_FIELDS = ("prompt_tokens", "completion_tokens", "cached_tokens", "reasoning_tokens",
                "batch")


def usage_fields(usage: Usage) -> dict[str, Any]:
    """The record fields of what a server reported beyond prompt and completion tokens: each
    only when there is some, so a record of a local model (or of a server that reports none)
    is what it was before these existed."""
    fields: dict[str, Any] = {}
    if usage.cached:
        fields["cached_tokens"] = usage.cached
    if usage.reasoning:
        fields["reasoning_tokens"] = usage.reasoning
    if usage.batch:
        fields["batch"] = True
    return fields


def role_price(cfg: Config, role: str) -> PriceConfig | None:
    """The price of the server that plays `role` (`policy` or `judge`); None when no price is
    set or a local model plays it."""
    policy_served = cfg.policy.backend == "http" and cfg.generation.source is None
    if role == "policy":
        return cfg.http.price if policy_served else None
    if role == "judge":
        j = cfg.judge
        if j.role == "external":
            return judge_http(cfg).price if j.backend == "http" else None
        return cfg.http.price if cfg.policy.backend == "http" else None
    raise ValueError(f"no price for role {role!r}")


def cost(price: PriceConfig, prompt: int, cached: int, completion: int,
         batch: bool = False) -> float:
    """The cost of these tokens at `price` (per million); `cached` is part of `prompt`."""
    cached = min(cached, prompt)
    cached_price = price.input if price.cached_input is None else price.cached_input
    amount = ((prompt - cached) * price.input + cached * cached_price
              + completion * price.output) / 1e6
    return amount * (1.0 - price.batch_discount) if batch else amount


def role_cost(tokens: Mapping[str, Any], role: str, price: PriceConfig) -> float:
    """The cost of a role's `tokens/<role>/...` counts (stats/*.json, report.json): the batch
    share (`batch_in`, `batch_cached`, `batch_out`) with the discount, the rest without."""
    def count(kind: str) -> int:
        return int(tokens.get(f"tokens/{role}/{kind}") or 0)

    batch = [count("batch_in"), count("batch_cached"), count("batch_out")]
    live = [count("in") - batch[0], count("cached") - batch[1], count("out") - batch[2]]
    return cost(price, *live) + cost(price, *batch, batch=True)


class TokenCounts:
    """`tokens/<role>/...` of a stage's records, one `add` per record (a streaming pass): in
    and out always; cached, reasoning and the batch share only when some record has them."""

    KINDS = ("in", "out", "cached", "reasoning", "batch_in", "batch_cached", "batch_out")

    def __init__(self, role: str) -> None:
        self.role = role
        self.sums = dict.fromkeys(self.KINDS, 0)

    def add(self, record: Mapping[str, Any]) -> None:
        tokens = {"in": record.get("prompt_tokens", 0), "out": record.get("completion_tokens", 0),
                  "cached": record.get("cached_tokens", 0),
                  "reasoning": record.get("reasoning_tokens", 0)}
        for kind, n in tokens.items():
            self.sums[kind] += n
        if record.get("batch"):
            for kind in ("in", "cached", "out"):
                self.sums[f"batch_{kind}"] += tokens[kind]

    def result(self, price: PriceConfig | None = None) -> dict[str, Any]:
        """The counts, and `cost/<role>` when `price` is given."""
        out: dict[str, Any] = {f"tokens/{self.role}/{k}": v for k, v in self.sums.items()
                               if k in ("in", "out") or v}
        if price is not None:
            out[f"cost/{self.role}"] = role_cost(out, self.role, price)
        return out


def run_costs(cfg: Config, metrics: Mapping[str, Any]) -> dict[str, float]:
    """`cost/<role>` of each priced role with token counts in `metrics` (the stats of every
    stage), at the config's prices now, and `cost/total`; {} when nothing is priced."""
    costs = {}
    for role in ("policy", "judge"):
        price = role_price(cfg, role)
        if price is not None and f"tokens/{role}/in" in metrics:
            costs[f"cost/{role}"] = role_cost(metrics, role, price)
    if costs:
        costs["cost/total"] = sum(costs.values())
    return costs


def batch_cost_note(cfg: Config, prompt_tokens: int, output_tokens: int) -> str:
    """For `--batch-submit`'s message: what the requests would cost at judge.http's price with
    the batch discount, every output token counted (each request's `max_tokens`, so an upper
    bound on output) and no prompt cached; "" when no price is set."""
    price = role_price(cfg, "judge")
    if price is None:
        return ""
    most = cost(price, prompt_tokens, 0, output_tokens, batch=True)
    return (f"; at judge.http.price ({price.batch_discount:.0%} batch discount) about "
            f"{most:.4g} at most")
