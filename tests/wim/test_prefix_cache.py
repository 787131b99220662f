"""Shared-prefix KV reuse (wim/backends/prefix_cache.py): the same greedy judgements with and
without it, on the real bundled model; the reuse path really runs; prefix arithmetic."""

from __future__ import annotations

import pytest

from wim.backends import TransformersBackend
from wim.backends.prefix_cache import MIN_PREFIX_TOKENS, PrefixCache, common_prefix_length
from wim.judges import BackendJudge

# Different lengths, so that the batches hold left padding between the prefix and the suffix.
ITEMS = [
    ("Why is the sky blue?", "Because of the sun."),
    ("What is 2 + 2?", "4, because two and two make four."),
    ("Explain why ice floats on water.",
     "Ice is less dense than liquid water: its molecules form an open hexagonal lattice."),
    ("Give me tips for sleeping better.", "Sleep."),
    ("What is compound interest?",
     "Interest on the interest: each period the interest is added to the principal, so the "
     "next period earns interest on a larger sum, and the balance grows exponentially."),
]


def test_common_prefix_length():
    assert common_prefix_length([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 9]]) == 2
    # At least one token of each list stays after the prefix.
    assert common_prefix_length([[1, 2, 3], [1, 2, 3, 4]]) == 2
    assert common_prefix_length([[7, 8], [9]]) == 0
    assert common_prefix_length([]) == 0


@pytest.mark.slow
@pytest.mark.parametrize("mode, prompt", [("wim", "ours"), ("numeric", "ours"), ("wim", "authors")])
def test_same_greedy_judgements_with_and_without_reuse(monkeypatch, mode, prompt) -> None:
    """wim: the guided format (a stateful logits processor); numeric and authors: stop strings."""
    from transformers import StaticCache

    # Pinned: two code paths agree token for token in float32; bfloat16's rounding depends on
    # the shapes of the matmuls, so a greedy tie may break differently (bench_dtype.py).
    backend = TransformersBackend.load("bundled:smollm2-135m-instruct", batch_size=3,
                                       dtype="float32")
    batches, kept = [], []
    real_batch, real_reorder = PrefixCache.batch, StaticCache.reorder_cache
    monkeypatch.setattr(PrefixCache, "batch",
                        lambda self, suffixes, *args: batches.append((len(self), len(suffixes)))
                        or real_batch(self, suffixes, *args))
    monkeypatch.setattr(StaticCache, "reorder_cache",
                        lambda self, keep: kept.append(len(keep)) or real_reorder(self, keep))
    raws = {}
    for reuse in (False, True):
        view = backend.reference_view()
        view.reuse_prefix = reuse
        judge = BackendJudge(view, role="fixed", model_name="bundled", mode=mode, prompt=prompt,
                             criteria="accuracy", max_new_tokens=32, max_retries=0)
        raws[reuse] = [r.raw for r in judge.judge(ITEMS, seed=1)]
        assert bool(batches) == reuse  # the reuse path ran only when switched on
    calls = {"ours": 1, "authors": 3}[prompt]  # the authors' format takes three calls
    # Per call: two batches (3 + 2) after one prefix of the instructions (over the minimum).
    assert [n for _, n in batches] == [3, 2] * calls
    assert all(length >= max(MIN_PREFIX_TOKENS, 100) for length, _ in batches)
    assert raws[True] == raws[False]
    if mode == "wim" and prompt == "ours":
        assert all(raw.startswith("Missing:") and "\nRating:" in raw for raw in raws[True])
        # Rows that finished early left their batch (wim/backends/decode.py) while others ran on.
        assert kept and all(0 < n < 3 for n in kept)


@pytest.mark.slow
def test_llama_cpp_same_judgements_with_and_without_reuse(monkeypatch) -> None:
    pytest.importorskip("llama_cpp", reason="needs the llama extra: pip install 'wim[llama]'")
    from wim.backends.llama_cpp_backend import LlamaCppBackend

    backend = LlamaCppBackend.load("bundled:smollm2-135m-instruct", n_threads=1)
    restored = []
    real = backend.llama.load_state
    monkeypatch.setattr(backend.llama, "load_state", lambda s: restored.append(1) or real(s))
    raws = {}
    try:
        for reuse in (False, True):
            backend.reuse_prefix = reuse
            judge = BackendJudge(backend, role="fixed", model_name="bundled", max_new_tokens=24,
                                 max_retries=0)
            raws[reuse] = [r.raw for r in judge.judge(ITEMS, seed=1)]
            # Two calls (critique, then rating); the prefix is evaluated once per call and
            # restored for the other four prompts.
            assert len(restored) == (8 if reuse else 0)
    finally:
        backend.close()
    assert raws[True] == raws[False]
    assert all(raw.startswith("Missing:") and "\nRating:" in raw for raw in raws[True])


@pytest.mark.slow
def test_sampling_after_a_shared_prefix_follows_the_seed(monkeypatch) -> None:
    """A judge's retries sample (temperature 0.7) in the same decoding loop: a seed gives the
    same texts again, another seed other texts."""
    import wim.backends.decode as decode_module
    from wim.backends import SamplingParams

    calls = []
    real = decode_module.decode
    monkeypatch.setattr(decode_module, "decode", lambda *a, **k: calls.append(k) or real(*a, **k))

    backend = TransformersBackend.load("bundled:smollm2-135m-instruct", batch_size=4)
    system = {"role": "system", "content": "You answer in one short sentence. " * 8}
    convs = [[system, {"role": "user", "content": q}] for q, _ in ITEMS]
    params = SamplingParams(max_new_tokens=12, temperature=1.0, top_p=0.9)

    def texts(seed: int) -> list[str]:
        return [row[0].text for row in backend.generate(convs, params, seed=seed)]

    first = texts(3)
    assert calls and calls[0]["temperature"] == 1.0  # the loop after the prefix sampled
    assert texts(3) == first
    assert texts(4) != first
    assert all(first)
