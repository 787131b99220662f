"""Decode attention on a CPU (wim/backends/decode_attention.py): SDPA's values for one-row steps,
SDPA itself for everything else, switched on only while the backend decodes."""

from __future__ import annotations

import types

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from wim.backends.decode_attention import NAME, decode_attention_forward, decoding_attention

GQA = types.SimpleNamespace(num_key_value_groups=3, is_causal=True, training=False)


def _qkv(batch: int, q_len: int, kv: int, dtype=torch.float32):
    g = torch.Generator().manual_seed(q_len * 1000 + kv)
    shape = lambda heads, length: (batch, heads, length, 64)  # noqa: E731
    return (torch.randn(shape(9, q_len), generator=g, dtype=dtype),
            torch.randn(shape(3, kv), generator=g, dtype=dtype),
            torch.randn(shape(3, kv), generator=g, dtype=dtype))


def _left_padding_mask(batch: int, kv: int) -> torch.Tensor:
    """[batch, 1, 1, kv] booleans: row i has i padding positions on the left."""
    mask = torch.ones(batch, 1, 1, kv, dtype=torch.bool)
    for row in range(batch):
        mask[row, ..., :row] = False
    return mask


@pytest.mark.parametrize("masked", [True, False])
def test_one_row_step_gives_sdpas_values(masked):
    query, key, value = _qkv(batch=5, q_len=1, kv=37)
    mask = _left_padding_mask(5, 37) if masked else None
    expected, _ = sdpa_attention_forward(GQA, query, key, value, mask, scaling=0.125)
    got, weights = decode_attention_forward(GQA, query, key, value, mask, scaling=0.125)
    assert weights is None and got.shape == expected.shape == (5, 1, 9, 64)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_an_additive_mask_counts_like_a_boolean_one():
    query, key, value = _qkv(batch=4, q_len=1, kv=20)
    mask = _left_padding_mask(4, 20)
    additive = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    torch.testing.assert_close(decode_attention_forward(GQA, query, key, value, additive)[0],
                               decode_attention_forward(GQA, query, key, value, mask)[0])


def test_bfloat16_stays_close_to_sdpa():
    """Scores rounded to bfloat16 (eager's arithmetic) against SDPA's float32 scores."""
    query, key, value = _qkv(batch=4, q_len=1, kv=300, dtype=torch.bfloat16)
    mask = _left_padding_mask(4, 300)
    expected, _ = sdpa_attention_forward(GQA, query, key, value, mask)
    got, _ = decode_attention_forward(GQA, query, key, value, mask)
    assert got.dtype == torch.bfloat16
    assert (got.float() - expected.float()).abs().max() < 0.02


def test_prompt_prefill_goes_to_sdpa():
    query, key, value = _qkv(batch=2, q_len=6, kv=6)
    causal = torch.ones(6, 6, dtype=torch.bool).tril().expand(2, 1, 6, 6)
    expected, _ = sdpa_attention_forward(GQA, query, key, value, causal)
    assert torch.equal(decode_attention_forward(GQA, query, key, value, causal)[0], expected)


@pytest.mark.slow
def test_backend_decodes_with_it_and_gives_generates_greedy_tokens():
    """The backend's greedy completions (float32) equal `generate`'s with SDPA throughout;
    while it decodes, the model runs this attention; afterwards SDPA is back."""
    from wim.backends import TransformersBackend
    from wim.backends.base import SamplingParams
    from wim.models import load_causal_lm

    model, tokenizer = load_causal_lm("bundled:smollm2-135m-instruct", dtype="float32")
    backend = TransformersBackend(model, tokenizer, batch_size=4)
    seen = []
    forward = model.model.layers[0].self_attn.forward

    def spy(*args, **kwargs):
        seen.append(model.config._attn_implementation)
        return forward(*args, **kwargs)

    model.model.layers[0].self_attn.forward = spy
    conversations = [[{"role": "user", "content": text}] for text in
                     ("Why is the sky blue?", "Name a prime number and say why it is prime.",
                      "Hi", "What does a compiler do? Answer in two sentences.")]
    completions = backend.generate(conversations, SamplingParams(max_new_tokens=24,
                                                                 temperature=0.0))
    del model.model.layers[0].self_attn.forward
    assert set(seen) == {NAME} and model.config._attn_implementation == "sdpa"

    texts = [backend.render(c) for c in conversations]
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.inference_mode():
        out = model.generate(**enc, max_new_tokens=24, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id, eos_token_id=backend.end_ids())
    expected = tokenizer.batch_decode(out[:, enc.input_ids.shape[1]:], skip_special_tokens=True)
    assert [c[0].text for c in completions] == expected


def test_switch_is_restored_on_error_and_skips_other_implementations():
    config = types.SimpleNamespace(_attn_implementation="sdpa")
    calls = []
    model = types.SimpleNamespace(
        config=config, device=torch.device("cpu"),
        set_attn_implementation=lambda name: calls.append(name)
        or setattr(config, "_attn_implementation", name))
    with pytest.raises(RuntimeError), decoding_attention(model):
        assert config._attn_implementation == NAME
        raise RuntimeError("a decoding failure")
    assert config._attn_implementation == "sdpa" and calls == [NAME, "sdpa"]
    config._attn_implementation = "eager"
    with decoding_attention(model):
        assert config._attn_implementation == "eager"
    assert calls == [NAME, "sdpa"]
