"""training/cpu_norm.py on the bundled model: the norms of a bfloat16 model give transformers'
numbers while it trains on a CPU, frozen weights only, and are restored afterwards."""

from __future__ import annotations

import pytest


def _hidden_and_grad(norm, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(4, 37, norm.weight.shape[0], generator=g) * 3).bfloat16()
    grad = torch.randn(x.shape, generator=g).bfloat16()
    return x, grad


def _forward_backward(norm, x, grad):
    x = x.clone().requires_grad_()
    y = norm(x)
    y.backward(grad)
    return y.detach(), x.grad


def test_frozen_norm_gives_transformers_numbers() -> None:
    """Forward: transformers' bfloat16 values. Backward: as close to float64 as transformers'
    own bfloat16 gradient (the two differ by bfloat16 rounding only)."""
    import torch

    from training.cpu_norm import training_norms
    from wim.models import BUNDLED_POLICY, load_causal_lm

    model, _ = load_causal_lm(BUNDLED_POLICY, dtype="bfloat16")
    model.requires_grad_(False)  # as under LoRA
    norm = model.model.layers[3].post_attention_layernorm
    x, grad = _hidden_and_grad(norm)
    want_y, want_grad = _forward_backward(norm, x, grad)
    with training_norms(model) as switched:
        assert switched == 2 * len(model.model.layers) + 1
        y, got_grad = _forward_backward(norm, x, grad)
    torch.testing.assert_close(y, want_y)  # bfloat16 tolerances: rounding of the last bit
    assert float((y.float() - want_y.float()).ne(0).float().mean()) < 0.01

    exact = x.double().requires_grad_()
    w = norm.weight.double()
    (w * exact * torch.rsqrt(exact.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
     ).backward(grad.double())

    def error(g):
        return float((g.double() - exact.grad).norm() / exact.grad.norm())

    assert error(got_grad) <= 1.2 * error(want_grad) + 1e-4, (error(got_grad), error(want_grad))
    assert error(got_grad) < 0.01
    # Restored: the class's own forward again.
    assert "forward" not in vars(norm)


def test_trained_weights_and_float32_keep_transformers_norm() -> None:
    """A norm whose weight trains gets its gradient (transformers' forward), and a float32
    model is not switched at all."""
    from training.cpu_norm import training_norms
    from wim.models import BUNDLED_POLICY, load_causal_lm

    model, _ = load_causal_lm(BUNDLED_POLICY, dtype="bfloat16")
    norm = model.model.norm
    x, grad = _hidden_and_grad(norm)
    with training_norms(model):
        _forward_backward(norm, x, grad)
    assert norm.weight.grad is not None and norm.weight.grad.abs().max() > 0

    model32, _ = load_causal_lm(BUNDLED_POLICY, dtype="float32")
    with training_norms(model32) as switched:
        assert switched == 0


def test_norms_are_restored_when_training_fails() -> None:
    from training.cpu_norm import training_norms
    from wim.models import BUNDLED_POLICY, load_causal_lm

    model, _ = load_causal_lm(BUNDLED_POLICY, dtype="bfloat16")
    with pytest.raises(RuntimeError), training_norms(model):
        raise RuntimeError("a failing step")
    assert not any("forward" in vars(m) for m in model.modules())
