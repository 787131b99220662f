"""training/cpu_attention.py on the bundled model: eager attention while a bfloat16 model trains
on a CPU, SDPA again afterwards; a float32 model is left alone; the eager attention used gives
transformers' eager numbers."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_training_attention_switches_only_bfloat16_on_a_cpu(dtype) -> None:
    import torch

    from training.cpu_attention import BFLOAT16_EAGER, training_attention
    from wim.models import BUNDLED_POLICY, load_causal_lm

    model, _ = load_causal_lm(BUNDLED_POLICY, dtype=dtype)
    assert model.config._attn_implementation == "sdpa"
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        before = model(input_ids=ids).logits
    expected = BFLOAT16_EAGER if dtype == "bfloat16" else "sdpa"
    with training_attention(model, 192) as used:
        assert used == expected
        assert model.config._attn_implementation == expected
        assert all(layer.self_attn.config._attn_implementation == expected
                   for layer in model.model.layers)
    assert model.config._attn_implementation == "sdpa"
    with torch.no_grad():  # restored: the very same numbers as before
        assert torch.equal(model(input_ids=ids).logits, before)


def test_the_implementation_is_restored_when_training_fails() -> None:
    from training.cpu_attention import training_attention
    from wim.models import BUNDLED_POLICY, load_causal_lm

    model, _ = load_causal_lm(BUNDLED_POLICY, dtype="bfloat16")
    with pytest.raises(RuntimeError), training_attention(model, 192):
        raise RuntimeError("a failing step")
    assert model.config._attn_implementation == "sdpa"


def test_long_sequences_keep_sdpa() -> None:
    """Eager attention keeps [batch, heads, length, length] per layer for the backward."""
    from training.cpu_attention import BFLOAT16_EAGER, EAGER_MAX_LENGTH, training_attention
    from wim.models import BUNDLED_POLICY, load_causal_lm

    model, _ = load_causal_lm(BUNDLED_POLICY, dtype="bfloat16")
    for length, expected in ((EAGER_MAX_LENGTH, BFLOAT16_EAGER), (EAGER_MAX_LENGTH + 1, "sdpa"),
                             (None, "sdpa")):
        with training_attention(model, length) as used:
            assert used == expected == model.config._attn_implementation


def _loss_and_lora_grads(model, implementation, ids, mask, autocast: bool):
    import torch

    model.base_model.model.set_attn_implementation(implementation)
    model.zero_grad()
    # Labels on the real tokens, predicted from real tokens (right padding).
    labels = ids.masked_fill(mask == 0, -100)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    grads = torch.cat([p.grad.float().flatten() for n, p in model.named_parameters()
                       if p.grad is not None])
    logits = out.logits.detach().float()[mask.bool()]
    return out.loss.item(), grads, logits


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_bfloat16_eager_gives_transformers_eager_numbers(dtype) -> None:
    """SmolLM2 (9 query heads on 3 key/value heads) with a LoRA adapter, a padded batch: loss,
    logits and LoRA gradients of `BFLOAT16_EAGER` against transformers' eager; equal to float
    rounding in float32, within bfloat16's rounding under bfloat16 autocast."""
    import torch
    from peft import LoraConfig, get_peft_model

    from training.cpu_attention import BFLOAT16_EAGER, register_bfloat16_eager
    from wim.models import BUNDLED_POLICY, load_causal_lm

    register_bfloat16_eager()
    model, tokenizer = load_causal_lm(BUNDLED_POLICY, dtype=dtype)
    torch.manual_seed(0)
    model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"],
                                             init_lora_weights=False))
    tokenizer.padding_side = "right"
    batch = tokenizer(["Explain why ice floats on water.", "The quick brown fox jumps over "
                       "the lazy dog, and then it runs far away into the woods.", "Hi"],
                      return_tensors="pt", padding=True)
    autocast = dtype == "bfloat16"
    loss, grads, logits = _loss_and_lora_grads(model, "eager", batch.input_ids,
                                               batch.attention_mask, autocast)
    ours = _loss_and_lora_grads(model, BFLOAT16_EAGER, batch.input_ids, batch.attention_mask,
                                autocast)
    grad_error = float((ours[1] - grads).norm() / grads.norm())
    logit_error = float((ours[2] - logits).abs().max())
    if dtype == "float32":
        assert abs(ours[0] - loss) < 1e-5 and grad_error < 1e-4 and logit_error < 1e-3
    else:  # bfloat16: SDPA differs from eager by as much (measured: grads 0.008 apart)
        assert abs(ours[0] - loss) < 0.02 and grad_error < 0.03, (loss, ours[0], grad_error)
