"""Batched generation with a local transformers causal LM.

Left padding, prompts sorted by length, n samples per prompt in one `generate` call. The judge
format guide (guided.py) makes a local judge write critique and rating in one call. When every
prompt of a call starts with the same tokens (a judge's instructions), that prefix is read once
and its KV cache reused by every batch (prefix_cache.py; `reuse_prefix=False` turns it off).
On a CPU, one-token decoding steps use decode_attention.py's attention instead of SDPA's kernel.
"""

from __future__ import annotations

import contextlib

from wim.backends.base import Backend, Completion, Conversation, SamplingParams
from wim.backends.decode_attention import decoding_attention
from wim.backends.prefix_cache import PrefixCache, shared_prefix_length
from wim.models import load_causal_lm


class TransformersBackend(Backend):
    """Batched generation with a local transformers causal LM."""

    name = "transformers"
    supports_prefill = True
    supports_guide = True

    def __init__(
        self, model, tokenizer, batch_size: int = 8, label: str = "", without_adapter: bool = False,
        reuse_prefix: bool = True,
    ) -> None:
        self.model = model
        self.reuse_prefix = reuse_prefix
        """Read a prefix shared by all prompts of a call once (prefix_cache.py)."""
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.label = label
        self.without_adapter = without_adapter
        tokenizer.padding_side = "left"  # decoder-only models continue from the right edge
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token

    @classmethod
    def load(cls, name: str, batch_size: int = 8, adapter: str | None = None,
             dtype: str = "auto") -> TransformersBackend:
        """Load `name` (with the LoRA `adapter` folder) in `dtype` as the pipeline does."""
        model, tokenizer = load_causal_lm(name, adapter=adapter, dtype=dtype)
        return cls(model, tokenizer, batch_size=batch_size, label=name)

    def reference_view(self, batch_size: int | None = None) -> TransformersBackend:
        """The same weights with any LoRA adapter disabled (`adapters_off`), no copy; LoRA
        layers that cannot be switched off are refused, not silently judged with."""
        peft = callable(getattr(self.model, "disable_adapter", None))
        if not (peft or _tuner_layers(self.model)) and _has_lora_layers(self.model):
            raise RuntimeError(
                "the policy carries LoRA layers that are not peft adapter layers, so they "
                "cannot be switched off; a fixed judge would judge with them on"
            )
        return TransformersBackend(self.model, self.tokenizer, batch_size or self.batch_size,
                                   label=self.label, without_adapter=True,
                                   reuse_prefix=self.reuse_prefix)

    @property
    def dtype(self) -> str:
        """What the model computes in: `float32` or `bfloat16` (recorded in the stage stats)."""
        return str(self.model.dtype).removeprefix("torch.")

    @property
    def context_tokens(self) -> int | None:
        """The smaller of `max_position_embeddings` and the tokenizer's `model_max_length`."""
        limits = [getattr(self.model.config, "max_position_embeddings", None),
                  getattr(self.tokenizer, "model_max_length", None)]
        limits = [int(x) for x in limits if x and x < 10_000_000]  # 1e30 means "not set"
        return min(limits) if limits else None

    def count_tokens(self, conversation: Conversation, prefill: str | None = None) -> int:
        text = self.render(conversation, prefill)
        return len(self.tokenizer(text, add_special_tokens=False).input_ids)

    def render(self, conversation: Conversation, prefill: str | None = None) -> str:
        text = self.tokenizer.apply_chat_template(conversation, tokenize=False,
                                                  add_generation_prompt=True)
        return text + (prefill or "")

    def generate(self, conversations, params, *, n=1, seed=0, prefill=None):
        import torch

        prefills = prefill if isinstance(prefill, list) else [prefill] * len(conversations)
        texts = [self.render(c, p) for c, p in zip(conversations, prefills, strict=True)]
        token_ids = [self.tokenizer(t, add_special_tokens=False).input_ids for t in texts]
        lengths = [len(ids) for ids in token_ids]
        prefix = self._prefix_cache(token_ids, n)
        # Sort by length so each batch holds similar lengths and little padding.
        order = sorted(range(len(texts)), key=lambda i: (lengths[i], i))
        results: list[list[Completion] | None] = [None] * len(texts)
        for start, end in length_groups([lengths[i] for i in order], self.batch_size):
            idx = order[start:end]
            torch.manual_seed(seed + start)
            if prefix is not None:
                inputs = prefix.batch([token_ids[i][len(prefix):] for i in idx],
                                      self.tokenizer.pad_token_id, params.max_new_tokens)
            else:
                inputs = self._encode([texts[i] for i in idx])
            batch = self._generate_batch(inputs, params, n)
            for i, completions in zip(idx, batch, strict=True):
                results[i] = completions
        return results  # type: ignore[return-value]

    def _prefix_cache(self, token_ids: list[list[int]], n: int):
        """The shared prefix's KV cache; None without reuse, with n > 1 or a prefix too short."""
        if not (self.reuse_prefix and n == 1 and (length := shared_prefix_length(token_ids))):
            return None
        return PrefixCache(self.model, token_ids[0][:length], self._adapter_context)

    def _adapter_context(self):
        return adapters_off(self.model) if self.without_adapter else contextlib.nullcontext()

    def _encode(self, texts: list[str]):
        """(input_ids, attention_mask, None) for left-padded `texts`."""
        enc = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        return enc.input_ids.to(self.model.device), enc.attention_mask.to(self.model.device), None

    def _generate(self, inputs, params: SamplingParams, n: int, processors, criteria):
        """New tokens from `generate`, n rows per prompt (as `num_return_sequences` lays them
        out; with a cache in `inputs` it reads only the ids after the cached prefix); sampling
        draws in decode.py's `CandidateSampler` unless it lacks a setting."""
        from wim.backends.decode import CandidateSampler, unsupported_settings

        input_ids, attention_mask, cache = inputs
        if n > 1:
            input_ids = input_ids.repeat_interleave(n, dim=0)
            attention_mask = attention_mask.repeat_interleave(n, dim=0)
        kwargs = dict(max_new_tokens=params.max_new_tokens, do_sample=False,
                      pad_token_id=self.tokenizer.pad_token_id, eos_token_id=self.end_ids())
        config = self.model.generation_config
        if params.temperature > 0 and not unsupported_settings(config):
            processors = [*processors, CandidateSampler(config, params.temperature, params.top_p)]
        elif params.temperature > 0:
            kwargs.update(do_sample=True, temperature=params.temperature, top_p=params.top_p)
        if params.stop:
            kwargs.update(stop_strings=list(params.stop), tokenizer=self.tokenizer)
        if processors:
            kwargs.update(logits_processor=processors, stopping_criteria=criteria)
        if cache is not None:
            # No compilation: on CUDA a static cache would recompile for every batch shape.
            kwargs.update(cache=cache, disable_compile=True)
        out = self.model.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        return out[:, input_ids.shape[1]:]

    def end_ids(self) -> list[int]:
        """The tokens that end a completion, for `generate`, the format guide and the count: the
        generation config's (Llama-3 and Qwen list several), else the tokenizer's EOS."""
        from wim.backends.decode import end_tokens

        ids = end_tokens(self.model.generation_config)
        eos = self.tokenizer.eos_token_id
        return ids or ([eos] if eos is not None else [])

    def _generate_batch(self, inputs, params: SamplingParams, n: int):
        import torch

        input_ids, attention_mask, _ = inputs
        rows = input_ids.shape[0]
        processors, criteria, guide = [], [], None
        if params.guide_label:
            from wim.backends.guided import FormatGuide

            guide = FormatGuide(self.tokenizer, input_ids.shape[1], rows * n,
                                label=params.guide_label, end_ids=self.end_ids(),
                                max_critique_tokens=max(1, params.max_new_tokens - 6),
                                choices=params.guide_choices,
                                record=bool(params.top_logprobs and params.guide_choices))
            processors, criteria = [guide], [guide.stopper()]
        with torch.inference_mode(), self._adapter_context(), decoding_attention(self.model):
            new = self._generate(inputs, params, n, processors, criteria)
        end_ids, results = self.end_ids(), [[] for _ in range(rows)]
        for k, ids in enumerate(new):  # sample k % n of prompt row k // n
            count = _count_generated(ids, end_ids, self.tokenizer.pad_token_id)
            text = self.tokenizer.decode(ids[:count], skip_special_tokens=True)
            text = _cut_at_stop(text, params.stop)
            top = _value_top(guide, k, count) if params.top_logprobs and guide else ()
            prompt_tokens = int(attention_mask[k // n].sum())
            results[k // n].append(Completion(text, prompt_tokens, count, top_logprobs=top))
        return results


def length_groups(lengths: list[int], batch_size: int) -> list[tuple[int, int]]:
    """[start, end) batches over ascending `lengths`: at most `batch_size` each, and a new
    batch whenever a prompt is over twice as long as the batch's first (shortest) one, so an
    outlier pays its own padding instead of making its neighbours pad to its length."""
    groups, start = [], 0
    for i, length in enumerate(lengths):
        first = lengths[start]
        if i > start and (i - start >= batch_size or length > max(2 * first, first + 64)):
            groups.append((start, i))
            start = i
    if lengths:
        groups.append((start, len(lengths)))
    return groups


@contextlib.contextmanager
def adapters_off(model):
    """Run the block with every LoRA adapter of `model` disabled: a `PeftModel` by its
    `disable_adapter()`; one attached by transformers' `load_adapter` layer by layer, as its
    `disable_adapters()` does (which demands peft >= 0.22 in transformers 5.24 while the stack
    pins peft 0.21), restoring the trainable flags afterwards."""
    if callable(getattr(model, "disable_adapter", None)):
        with model.disable_adapter():
            yield
        return
    layers = _tuner_layers(model)
    was_disabled = [layer.disable_adapters for layer in layers]
    grads = [(p, p.requires_grad) for layer in layers for p in layer.parameters()]
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer, disabled in zip(layers, was_disabled, strict=True):
            layer.enable_adapters(not disabled)
        for param, grad in grads:
            param.requires_grad_(grad)


def _tuner_layers(model) -> list:
    """peft's adapter layers inside `model` ([] without peft or without adapters)."""
    if not (getattr(model, "_hf_peft_config_loaded", False) or _has_lora_layers(model)):
        return []
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [m for m in model.modules() if isinstance(m, BaseTunerLayer)]


def _has_lora_layers(model) -> bool:
    return any("lora_" in name for name, _ in model.named_modules())


def _value_top(guide, index: int, count: int) -> tuple[dict[str, float], ...]:
    """`Completion.top_logprobs` of a guided row: the choice distribution at its value's
    position, empty elsewhere (the guide records only that step); () when it has none."""
    row = guide.rows[index]
    if not row.value_top or not 0 <= row.value_position < count:
        return ()
    return tuple(row.value_top if i == row.value_position else {} for i in range(count))


def _count_generated(ids, end_ids: list[int], pad_id: int | None) -> int:
    """Generated tokens up to and including the first end token (padding after it)."""
    for i, token in enumerate(ids.tolist()):
        if token in end_ids:
            return i + 1
        if token == pad_id:
            return i
    return len(ids)


def _cut_at_stop(text: str, stop: tuple[str, ...]) -> str:
    for s in stop:
        pos = text.find(s)
        if pos >= 0:
            text = text[:pos]
    return text
