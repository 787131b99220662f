"""Per-token log-probabilities through the LM head on a CPU, one token tile at a time.

The same quantity as TRL's `trl.kernels.ChunkedLogProbFunction` (log p(target), and on request
the entropy, log sum p^2, the mean logit and whether the target is the first argmax), computed
without the `[tokens, vocabulary]` logits: the head is applied in `VOCAB_TILE`-column tiles and
folded into online-logsumexp statistics; the backward recomputes each tile. What differs from
TRL's torch fallback is the arithmetic a CPU pays for (tests/benchmarks/bench_cpu_head.py):

- fewer passes over each tile (a dozen in TRL's fold, five here);
- in bfloat16, the gradient of the hidden states is one bfloat16 product over the whole
  vocabulary (the GEMM accumulates in float32 and rounds once), where TRL upcasts every tile and
  its weights to float32 for the product (`_addmm_fp32`; its `out_dtype` path is CUDA-only).
  Like TRL, it never rounds a partial sum over vocabulary tiles to bfloat16.

Float32 inputs give TRL's values to float rounding (tests/training/test_cpu_logprobs.py).
"""

from __future__ import annotations

import torch

#: Vocabulary columns per tile: 512 tokens x 4096 columns of float32 is 8 MB, the fastest
#: on a 2-core CPU (tests/benchmarks/results/cpu_head.txt).
VOCAB_TILE = 4096


def completion_log_probs(hidden, weight, bias, targets, outputs: tuple[str, ...]):
    """(log_probs, entropy, log_sum_sq_probs, mean_logits, is_top1) of `hidden @ weight.T
    (+ bias)` at `targets`, each `[tokens]` float32 (is_top1 bool), None where not in
    `outputs`. Differentiable in hidden, weight and bias through log_probs and entropy."""
    return _LogProbs.apply(hidden, weight, bias, targets, tuple(outputs))


def _tiles(vocab: int):
    return ((start, min(start + VOCAB_TILE, vocab)) for start in range(0, vocab, VOCAB_TILE))


class _Tiles:
    """One call's tile buffers, reused for every tile: a fresh 8 MB tensor per tile is a fresh
    allocation the allocator hands back to the system when freed, and touching its pages again
    cost about as much as the arithmetic (docs/benchmarks.md, "DPO training on a CPU")."""

    def __init__(self, rows: int, dtype: torch.dtype, device) -> None:
        self.z = torch.empty(rows * VOCAB_TILE, dtype=torch.float32, device=device)
        self.e = torch.empty_like(self.z)
        self.low = None if dtype == torch.float32 else \
            torch.empty(rows * VOCAB_TILE, dtype=dtype, device=device)
        self.rows = rows

    def view(self, buffer: torch.Tensor, width: int) -> torch.Tensor:
        """A contiguous [rows, width] tile of `buffer`."""
        return buffer[: self.rows * width].view(self.rows, width)

    def logits(self, hidden, weight, bias, start: int, end: int) -> torch.Tensor:
        """One tile of logits in float32 (a bfloat16 product is upcast after the GEMM)."""
        z = self.view(self.z, end - start)
        tile = z if self.low is None else self.view(self.low, end - start)
        torch.mm(hidden, weight[start:end].t(), out=tile)
        if bias is not None:
            tile += bias[start:end].to(tile.dtype)
        return z if tile is z else z.copy_(tile)


class _LogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, outputs):
        ctx.set_materialize_grads(False)  # entropy is usually logged only: no gradient to fold
        device = hidden.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) \
            else hidden.dtype
        # The precision is set here; autocast would also put the folds' float32 dot products
        # (linalg.vecdot is on its bfloat16 list) into bfloat16: two 8 MB casts and a product
        # in fresh memory per tile, a third of a DPO step, and an entropy summed in bfloat16.
        with torch.autocast(hidden.device.type, enabled=False):
            return _LogProbs._forward(ctx, hidden, weight, bias, targets, outputs, dtype)

    @staticmethod
    def _forward(ctx, hidden, weight, bias, targets, outputs, dtype):
        h, w = hidden.to(dtype), weight.to(dtype)
        b = None if bias is None else bias.to(dtype)
        n, vocab = len(hidden), weight.shape[0]
        f32 = dict(device=hidden.device, dtype=torch.float32)
        running_max = torch.full((n,), -torch.inf, **f32)
        sum_exp, sum_exp_z, sum_sq, sum_z, target_logit = (torch.zeros(n, **f32) for _ in range(5))
        argmax = torch.zeros(n, dtype=torch.long, device=hidden.device)
        rows = torch.arange(n, device=hidden.device)
        tiles = _Tiles(n, dtype, hidden.device)
        for start, end in _tiles(vocab):
            z = tiles.logits(h, w, b, start, end)
            tile_max, tile_arg = z.max(-1)
            if "is_top1" in outputs:  # the first maximum, as argmax over the whole row
                argmax = torch.where(tile_max > running_max, tile_arg + start, argmax)
            new_max = torch.maximum(running_max, tile_max)
            rescale = torch.exp(running_max - new_max)
            e = torch.sub(z, new_max[:, None], out=tiles.view(tiles.e, end - start)).exp_()
            sum_exp.mul_(rescale).add_(e.sum(-1))
            if "entropy" in outputs:
                sum_exp_z.mul_(rescale).add_(torch.linalg.vecdot(e, z))
            if "log_sum_sq_probs" in outputs:
                sum_sq.mul_(rescale * rescale).add_(torch.linalg.vecdot(e, e))
            if "mean_logits" in outputs:
                sum_z.add_(z.sum(-1))
            running_max = new_max
            local = targets - start
            here = (local >= 0) & (local < end - start)
            target_logit[here] = z[rows[here], local[here]]
        log_z = running_max + torch.log(sum_exp)
        entropy = log_z - sum_exp_z / sum_exp if "entropy" in outputs else None
        result = (target_logit - log_z, entropy,
                  torch.log(sum_sq) - 2 * torch.log(sum_exp) if "log_sum_sq_probs" in outputs
                  else None,
                  sum_z / vocab if "mean_logits" in outputs else None,
                  argmax == targets if "is_top1" in outputs else None)
        ctx.save_for_backward(hidden, weight, bias, targets, log_z,
                              log_z if entropy is None else entropy)
        ctx.dtype = dtype
        ctx.mark_non_differentiable(*(x for x in result[2:] if x is not None))
        return result

    @staticmethod
    def backward(ctx, grad_log_probs, grad_entropy, *_):
        hidden, weight, bias, targets, log_z, entropy = ctx.saved_tensors
        if grad_log_probs is None and grad_entropy is None:
            return None, None, None, None, None
        with torch.autocast(hidden.device.type, enabled=False):
            return _LogProbs._backward(ctx, grad_log_probs, grad_entropy, hidden, weight, bias,
                                       targets, log_z, entropy)

    @staticmethod
    def _backward(ctx, grad_log_probs, grad_entropy, hidden, weight, bias, targets, log_z, entropy):
        needs_hidden, needs_weight, needs_bias = ctx.needs_input_grad[:3]
        dtype = ctx.dtype
        h, w = hidden.to(dtype), weight.to(dtype)
        b = None if bias is None else bias.to(dtype)
        n, vocab = len(hidden), weight.shape[0]
        rows = torch.arange(n, device=hidden.device)
        low_precision = dtype != torch.float32
        # bfloat16: the logits' gradient, tile by tile, for one product at the end.
        grad_logits = torch.empty((n, vocab), dtype=dtype, device=hidden.device) \
            if needs_hidden and low_precision else None
        grad_hidden = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device) \
            if needs_hidden and not low_precision else None
        grad_weight = torch.zeros_like(weight) if needs_weight else None
        grad_bias = torch.zeros_like(bias, dtype=torch.float32) if needs_bias else None
        tiles = _Tiles(n, dtype, hidden.device)
        for start, end in _tiles(vocab):
            log_p = tiles.logits(h, w, b, start, end).sub_(log_z[:, None])
            p = torch.exp(log_p, out=tiles.view(tiles.e, end - start))
            # d log p_target / dz_j = 1[j = target] - p_j;  d entropy / dz_j = -p_j (log p_j + H)
            if grad_entropy is not None:
                grad = log_p.add_(entropy[:, None]).mul_(grad_entropy[:, None])
                if grad_log_probs is not None:
                    grad.add_(grad_log_probs[:, None])
                grad = grad.mul_(p).neg_()
            else:
                grad = p.mul_(-grad_log_probs[:, None])
            if grad_log_probs is not None:
                local = targets - start
                here = (local >= 0) & (local < end - start)
                grad[rows[here], local[here]] += grad_log_probs[here]
            if grad_bias is not None:
                grad_bias[start:end] = grad.sum(0)
            if grad_weight is not None:
                grad_weight[start:end] = torch.mm(grad.to(dtype).t(), h)
            if grad_logits is not None:
                grad_logits[:, start:end] = grad
            elif grad_hidden is not None:
                grad_hidden.addmm_(grad, w[start:end])
        if grad_logits is not None:
            grad_hidden = torch.mm(grad_logits, w)
        return (None if grad_hidden is None else grad_hidden.to(hidden.dtype),
                grad_weight,
                None if grad_bias is None else grad_bias.to(bias.dtype),
                None, None)
