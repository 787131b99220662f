"""training/cpu_logprobs.py against TRL's ChunkedLogProbFunction (the kernel it replaces on a
CPU): the same five outputs and the same gradients, through log p and through the entropy."""

from __future__ import annotations

import pytest

OUTPUTS = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1")


def _inputs(dtype, with_bias: bool, tokens: int = 37, hidden: int = 24, vocab: int = 9000):
    """A vocabulary over two tiles and a ragged third, targets in each. Rows 4 and 5 have their
    maximum at column 100 and, tied, at 8200 (another tile): is_top1 counts the first only."""
    import torch

    g = torch.Generator().manual_seed(0)
    h = torch.randn(tokens, hidden, generator=g)
    w = torch.randn(vocab, hidden, generator=g) * 0.3
    h[5] = h[4]
    w[100] = w[8200] = 3 * h[4] / h[4].norm()
    b = torch.randn(vocab, generator=g) * 0.1 if with_bias else None
    if b is not None:
        b[8200] = b[100]
    t = torch.randint(0, vocab, (tokens,), generator=g)
    t[:6] = torch.tensor([0, 4095, 8999, 0, 8200, 100])
    logits = h @ w.T + (0 if b is None else b)
    assert int(logits[4].argmax()) == 100 and logits[4, 100] == logits[4, 8200]
    t[3] = int(logits[3].argmax())  # a top-1 target
    leaves = [x.to(dtype).requires_grad_() if x is not None else None for x in (h, w, b)]
    return leaves, t


def _run(fn, leaves, targets, seed_grads: bool):
    import torch

    h, w, b = leaves
    out = fn(h, w, b, targets)
    gen = torch.Generator().manual_seed(1)
    g_lp = torch.randn(len(targets), generator=gen)
    g_ent = torch.randn(len(targets), generator=gen)
    loss = (out[0] * g_lp).sum() + ((out[1] * g_ent).sum() if seed_grads else 0)
    grads = torch.autograd.grad(loss, [x for x in leaves if x is not None])
    return out, grads


def _trl(h, w, b, t):
    from trl.kernels import ChunkedLogProbFunction

    return ChunkedLogProbFunction.apply(h, w, b, t, 1.0, 4096, None, 1.0, OUTPUTS)


def _ours(h, w, b, t):
    from training.cpu_logprobs import completion_log_probs

    return completion_log_probs(h, w, b, t, OUTPUTS)


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("entropy_grad", [False, True])
def test_float32_equals_trls_kernel(with_bias, entropy_grad) -> None:
    import torch

    leaves, targets = _inputs(torch.float32, with_bias)
    ours, our_grads = _run(_ours, leaves, targets, entropy_grad)
    trl, trl_grads = _run(_trl, leaves, targets, entropy_grad)
    for name, a, b in zip(OUTPUTS, ours, trl, strict=True):
        if name == "is_top1":
            assert torch.equal(a, b) and a[3] and a[5] and not a[4] and a.sum() < len(a), name
        else:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=name)
    for a, b in zip(our_grads, trl_grads, strict=True):
        assert a.abs().max() > 0
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 * float(b.abs().max()))


def test_bfloat16_under_autocast_is_close_to_float32() -> None:
    """bfloat16 as training runs it (autocast, bfloat16 weights): within bfloat16's rounding of
    the float32 values, and no worse than TRL's kernel in bfloat16."""
    import torch

    leaves32, targets = _inputs(torch.float32, False)
    exact, exact_grads = _run(_ours, leaves32, targets, False)
    results = {}
    for name, fn in (("ours", _ours), ("trl", _trl)):
        leaves = [x.detach().bfloat16().requires_grad_() if x is not None else None
                  for x in leaves32]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out, grads = _run(fn, leaves, targets, False)
        assert grads[0].dtype == torch.bfloat16
        err_lp = float((out[0].detach() - exact[0].detach()).abs().max())
        err_grad = float((grads[0].float() - exact_grads[0]).abs().max()
                         / exact_grads[0].abs().max())
        results[name] = (err_lp, err_grad)
    assert results["ours"][0] < 0.1 and results["ours"][1] < 0.02, results
    assert results["ours"][0] <= 1.5 * results["trl"][0] + 1e-3, results
    assert results["ours"][1] <= 1.5 * results["trl"][1] + 1e-3, results


def test_autocast_changes_nothing_on_bfloat16_inputs() -> None:
    """The kernel sets its own precision: under bfloat16 autocast, bfloat16 inputs give exactly
    what they give without it. (Autocast would otherwise run the entropy's and log sum p^2's
    float32 dot products in bfloat16, as it does `linalg.vecdot`.)"""
    import torch

    leaves32, targets = _inputs(torch.float32, True)
    results = []
    for autocast in (False, True):
        leaves = [x.detach().bfloat16().requires_grad_() for x in leaves32]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            results.append(_run(_ours, leaves, targets, seed_grads=True))
    (plain, plain_grads), (cast, cast_grads) = results
    for name, a, b in zip(OUTPUTS, plain, cast, strict=True):
        assert torch.equal(a, b), name
    for a, b in zip(plain_grads, cast_grads, strict=True):
        assert torch.equal(a, b)
