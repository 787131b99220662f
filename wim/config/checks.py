"""Range and combination checks of a loaded config, before any model loads: each failure is a
`ConfigError` naming the dotted key, what was expected and the value. A string field's allowed
values are its `Literal` type, checked as it loads (yaml_dataclasses.py).
"""

from __future__ import annotations

import re
from functools import reduce
from typing import Any

from wim.config.endpoints import ENDPOINT_SECTIONS, WIM_REQUEST_FIELDS
from wim.config.refine import CRITERIA, FLAGS
from wim.config.sampling import SOURCE_COLUMN_KEYS
from wim.errors import ConfigError

_POSITIVE = ("generation.max_new_tokens", "generation.batch_size", "judge.max_new_tokens",
             "judge.batch_size", "scoring.batch_size", "http.max_concurrency", "lora.r",
             "dpo.per_device_train_batch_size", "dpo.max_steps", "dpo.learning_rate",
             "blind.max_new_tokens", "eval.bootstrap_resamples", "eval.compare_holdout",
             "training.rounds", "training.online_max_new_tokens")
_POSITIVE_OR_NULL = ("generation.max_prompt_tokens", "judge.max_input_tokens",
                     "http.context_tokens", "http.requests_per_minute", "http.tokens_per_minute",
                     "prompts.limit", "blind.batch_size", "eval.limit", "eval.max_new_tokens")
_NOT_NEGATIVE = ("generation.temperature", "judge.max_retries", "judge.batch_resubmits",
                 "prompts.holdout", "blind.max_retries", "eval.temperature", "pairs.tie_tolerance",
                 "refine.max_retries", "refine.dynamic.min_progress",
                 "refine.dynamic.stability_eps")
_AT_LEAST_ONE = ("refine.max_attempts", "refine.ensemble_n", "refine.dynamic.reject_streak",
                 "refine.dynamic.window", "refine.dynamic.stability_window")
# (keys, the test that fails a value, what the message says is expected), checked in this order
_RANGES = ((_POSITIVE, lambda v: v <= 0, "be positive"),
           (_POSITIVE_OR_NULL, lambda v: v is not None and v <= 0, "be positive or null"),
           (_NOT_NEGATIVE, lambda v: v < 0, "be >= 0"),
           (_AT_LEAST_ONE, lambda v: v < 1, "be at least 1"))
_LICENSE = re.compile(r"[a-z0-9][a-z0-9.+-]*")


def _get(cfg, key: str) -> Any:
    return reduce(getattr, key.split("."), cfg)


def validate(cfg, source: str = "config") -> None:
    """Check ranges and combinations; raise ConfigError naming the key and what is expected."""

    def fail(key: str, expected: str, value: Any) -> None:
        raise ConfigError(f"{source}: '{key}' must {expected}, got {value!r}.")

    if not 0.0 <= cfg.scoring.zeta <= 1.0:
        fail("scoring.zeta", "lie in [0, 1]", cfg.scoring.zeta)
    for key in ("scoring.report_zetas", "eval.compare_zetas"):
        for z in _get(cfg, key):
            if not 0.0 <= z <= 1.0:
                fail(key, "hold values in [0, 1]", z)
    if cfg.generation.k < 2:
        fail("generation.k", "be at least 2 (a pair needs two samples of one prompt)",
             cfg.generation.k)
    for keys, bad, expected in _RANGES:
        for key in keys:
            if bad(_get(cfg, key)):
                fail(key, expected, _get(cfg, key))
    if cfg.http.concurrency != "auto" and cfg.http.concurrency <= 0:
        fail("http.concurrency", "be positive or 'auto'", cfg.http.concurrency)
    if cfg.dpo.save_steps < 0:
        fail("dpo.save_steps", "be >= 0 (0: no checkpoints)", cfg.dpo.save_steps)
    if cfg.training.online_temperature <= 0:
        fail("training.online_temperature", "be > 0 (two greedy completions are identical)",
             cfg.training.online_temperature)
    if not 0.0 < cfg.generation.top_p <= 1.0:
        fail("generation.top_p", "lie in (0, 1]", cfg.generation.top_p)
    for name in ("scoring", "blind"):  # a server of their own, or the policy's
        section = getattr(cfg, name)
        if section.backend == "http" and not (section.http.base_urls or cfg.http.base_urls):
            fail(f"{name}.http.base_urls", f"list at least one URL when {name}.backend is "
                 "'http' (or set http.base_urls)", section.http.base_urls)
    _validate_combinations(cfg, fail)
    _validate_prices(cfg, fail)
    _validate_source(cfg, fail)
    _validate_refine(cfg.refine, fail)
    _validate_output(cfg, fail)


def _validate_combinations(cfg, fail) -> None:
    """Values that are fine alone but not together."""
    if cfg.judge.prompt == "authors" and cfg.judge.mode != "wim":
        fail("judge.prompt", "be 'ours' when judge.mode is 'numeric' (the authors' prompt asks "
             "for a critique; their numeric baseline is scoring.zeta 0 on the WIM pass)",
             cfg.judge.prompt)
    served = cfg.policy.backend == "http" and cfg.http.adapter_serving == "vllm"
    if cfg.policy.adapter and cfg.policy.backend != "transformers" and not served:
        fail("policy.adapter", "be null unless policy.backend is 'transformers', or 'http' "
             "with http.adapter_serving 'vllm' (the server then serves the adapter)",
             cfg.policy.adapter)
    if cfg.training.rounds > 1 and cfg.policy.backend != "transformers" and not served:
        fail("training.rounds", "be 1 unless policy.backend is 'transformers', or 'http' with "
             "http.adapter_serving 'vllm' (later rounds sample from the trained adapter)",
             cfg.training.rounds)
    if cfg.http.adapter_serving != "none" and cfg.policy.backend != "http":
        fail("http.adapter_serving", "be 'none' unless policy.backend is 'http'",
             cfg.http.adapter_serving)
    own = cfg.judge.http
    given = {k: v for k, v in vars(own).items() if v is not None}
    if given and not (cfg.judge.role == "external" and cfg.judge.backend == "http"):
        fail("judge.http", "be left empty unless judge.role is 'external' and judge.backend "
             "is 'http' (fixed and changing judges are the policy and answer where it does)", given)
    if cfg.training.mode == "online" and (cfg.policy.backend != "transformers"
                                          or cfg.judge.role == "external"):
        fail("training.mode", "be 'offline' unless policy.backend is 'transformers' and "
             "judge.role is fixed or changing (the online reward judges with the live model)",
             cfg.training.mode)
    if cfg.judge.role == "external" and not cfg.judge.model and cfg.judge.backend != "http":
        fail("judge.model", "name a model when judge.role is 'external'", cfg.judge.model)
    if cfg.policy.backend == "http" and not cfg.http.base_urls:
        fail("http.base_urls", "list at least one URL when policy.backend is 'http'",
             cfg.http.base_urls)
    if cfg.judge.role == "external" and cfg.judge.backend == "http" and not (
            own.base_urls or cfg.http.base_urls):
        fail("http.base_urls", "list at least one URL when judge.backend is 'http' (or set "
             "judge.http.base_urls)", cfg.http.base_urls)
    for name, section in (("judge", own), ("scoring", cfg.scoring.http), ("blind", cfg.blind.http)):
        for key in ("concurrency", "timeout_s", "context_tokens", "max_concurrency",
                    "requests_per_minute", "tokens_per_minute"):
            if getattr(section, key) not in (None, "auto") and getattr(section, key) <= 0:
                fail(f"{name}.http.{key}", "be positive or null", getattr(section, key))
    _validate_params(cfg, fail)


def _validate_params(cfg, fail) -> None:
    """`params` holds only fields wim does not set itself (it would overwrite or contradict
    them: `max_tokens` is judge.max_new_tokens, `temperature` the sampling's, ...)."""
    for key, params in (("http.params", cfg.http.params), ("judge.http.params",
                        cfg.judge.http.params), ("scoring.http.params", cfg.scoring.http.params),
                        ("blind.http.params", cfg.blind.http.params)):
        clash = sorted(str(k) for k in (params or {}) if k in WIM_REQUEST_FIELDS)
        if clash:
            fail(key, f"name only request fields wim does not set itself (it sets "
                 f"{', '.join(sorted(WIM_REQUEST_FIELDS))}; set those through wim's own keys, "
                 f"e.g. judge.max_new_tokens), but it names {', '.join(clash)}", params)


def _validate_prices(cfg, fail) -> None:
    """Each endpoint's `price` (endpoints.py PriceConfig): input and output given, none below
    0, and a batch discount that leaves something to pay."""
    for name in ENDPOINT_SECTIONS:
        price = _get(cfg, name).price
        if price is None:
            continue
        if name in ("scoring.http", "blind.http"):  # wim/pricing.py prices policy and judge
            fail(f"{name}.price", "be null: the tokens of this server (embeddings, the blind "
                 "evaluator) are not counted, so wim shows no cost for them", vars(price))
        for key in ("input", "output"):
            if getattr(price, key) is None:
                fail(f"{name}.price.{key}", "be given: the price per million "
                     f"{key} tokens (e.g. {{input: 1.25, output: 10.0}})", None)
        for key in ("input", "output", "cached_input"):
            if getattr(price, key) is not None and getattr(price, key) < 0:
                fail(f"{name}.price.{key}", "be >= 0 (a price per million tokens)",
                     getattr(price, key))
        if not 0.0 <= price.batch_discount < 1.0:
            fail(f"{name}.price.batch_discount", "lie in [0, 1) (the share taken off a Batch "
                 "API request's price: 0.5 = half price)", price.batch_discount)


def _validate_source(cfg, fail) -> None:
    """generation.source: existing responses instead of sampling (wim/sources.py)."""
    g = cfg.generation
    for key, name in g.source_columns.items():
        if key not in SOURCE_COLUMN_KEYS:
            fail("generation.source_columns",
                 f"use only the keys {', '.join(SOURCE_COLUMN_KEYS)}", key)
        if not isinstance(name, str) or not name:
            fail(f"generation.source_columns.{key}", "be a column or key name", name)
    if g.source is None:
        return
    if not isinstance(g.source, str) or not g.source.strip():
        fail("generation.source", "be a file, a saved dataset folder or a datasets name, or "
             "null", g.source)
    why = "the prompts come with generation.source"
    if cfg.prompts.source != "bundled":
        fail("prompts.source", f"stay 'bundled' (unused) when generation.source is set: {why}",
             cfg.prompts.source)
    if cfg.prompts.holdout:
        fail("prompts.holdout", "be 0 when generation.source is set (held-out prompts are "
             "answered by the policy in `wim eval`; give the source's held-out prompts to "
             "prompts.source in a run of their own)", cfg.prompts.holdout)
    if cfg.training.rounds > 1 or cfg.training.mode == "online":
        fail("training.rounds", "be 1 with offline training when generation.source is set "
             "(later rounds and online DPO sample from the trained policy)",
             (cfg.training.rounds, cfg.training.mode))


def _validate_refine(r, fail) -> None:
    """The `refine:` section (refine.py)."""
    for key in ("gamma", "tau_c"):
        if not 0.0 <= getattr(r, key) <= 1.0:
            fail(f"refine.{key}", "lie in [0, 1] (scores are in [0, 1])", getattr(r, key))
    for flag, table in r.penalties.items():
        if flag not in FLAGS:
            fail("refine.penalties", f"use only the flags {', '.join(FLAGS)}", flag)
        if not isinstance(table, dict) or not table:
            fail(f"refine.penalties.{flag}", "map criteria to amounts, e.g. "
                 "{evidence_support: 0.1}", table)
        for criterion, amount in table.items():
            if criterion not in CRITERIA:
                fail(f"refine.penalties.{flag}", f"name criteria among {', '.join(CRITERIA)}",
                     criterion)
            if isinstance(amount, bool) or not isinstance(amount, (int, float)) \
                    or not 0 <= amount <= 1:
                fail(f"refine.penalties.{flag}.{criterion}", "be a number in [0, 1]", amount)
    v = r.vrr
    if v.m < 1 or v.k < 0 or v.delta < 0:
        fail("refine.vrr", "have m >= 1, k >= 0 and delta >= 0", (v.m, v.k, v.delta))
    for key in ("prior", "rho0", "rho1", "alpha", "beta"):
        if not 0.0 <= getattr(v, key) <= 1.0:
            fail(f"refine.vrr.{key}", "lie in [0, 1] (a probability)", getattr(v, key))
    if v.vote_temperature <= 0:
        fail("refine.vrr.vote_temperature", "be positive (M votes must be sampled)",
             v.vote_temperature)


def _validate_output(cfg, fail) -> None:
    """`report.browser_prompts` and `card.license` (output.py)."""
    shown = cfg.report.browser_prompts
    if isinstance(shown, bool) or not isinstance(shown, int) or shown < 1:
        fail("report.browser_prompts", "be a positive integer (prompts shown in report.html)",
             shown)
    license_ = cfg.card.license
    if license_ is not None and not (isinstance(license_, str) and _LICENSE.fullmatch(license_)):
        fail("card.license", "be a Hub license id in lower case (e.g. apache-2.0, cc-by-4.0, "
             "mit, other) or null", license_)
