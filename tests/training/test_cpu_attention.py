"""training/cpu_attention.py on the bundled model: eager attention while a bfloat16 model trains
on a CPU, SDPA again afterwards; a float32 model is left alone."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_training_attention_switches_only_bfloat16_on_a_cpu(dtype) -> None:
    import torch

    from training.cpu_attention import training_attention
    from wim.models import BUNDLED_POLICY, load_causal_lm

    model, _ = load_causal_lm(BUNDLED_POLICY, dtype=dtype)
    assert model.config._attn_implementation == "sdpa"
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        before = model(input_ids=ids).logits
    expected = "eager" if dtype == "bfloat16" else "sdpa"
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
    from training.cpu_attention import EAGER_MAX_LENGTH, training_attention
    from wim.models import BUNDLED_POLICY, load_causal_lm

    model, _ = load_causal_lm(BUNDLED_POLICY, dtype="bfloat16")
    for length, expected in ((EAGER_MAX_LENGTH, "eager"), (EAGER_MAX_LENGTH + 1, "sdpa"),
                             (None, "sdpa")):
        with training_attention(model, length) as used:
            assert used == expected == model.config._attn_implementation
