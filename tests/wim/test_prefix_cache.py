"""Shared-prefix KV reuse (wim/backends/prefix_cache.py): the same greedy judgements with and
without it, on the real bundled model; the reuse path really runs; prefix arithmetic."""

from __future__ import annotations

import re

import pytest
from conftest import check_two_step_judgement

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


def test_the_sampler_takes_generates_settings_and_names_those_it_lacks():
    """generate's defaults (transformers 5.24): top-k 50 unless the generation config sets it;
    a setting the sampler does not apply is named, so that the backend lets `generate` sample
    with its own warpers instead."""
    from transformers import GenerationConfig

    from wim.backends.decode import CandidateSampler, end_tokens, unsupported_settings

    assert CandidateSampler(GenerationConfig(), 0.7, 0.9).top_k == 50
    assert CandidateSampler(GenerationConfig(top_k=7), 0.7, 1.0).top_k == 7
    assert CandidateSampler(GenerationConfig(top_k=0), 0.7, 1.0).top_k == 0
    assert unsupported_settings(GenerationConfig(eos_token_id=[1, 2], top_k=20)) == []
    assert unsupported_settings(GenerationConfig(repetition_penalty=1.2)) == [
        "repetition_penalty"]
    assert end_tokens(GenerationConfig(eos_token_id=[5, 9])) == [5, 9]
    assert end_tokens(GenerationConfig(eos_token_id=5)) == [5]
    assert end_tokens(GenerationConfig()) == []


def _kept_scores(scores, top_k, top_p):
    """`top_k_top_p`'s choice as scores over the vocabulary (-inf where removed)."""
    import torch

    from wim.backends.decode import top_k_top_p

    values, indices = top_k_top_p(scores, top_k, top_p)
    return torch.full_like(scores, -float("inf")).scatter_(-1, indices, values)


@pytest.mark.parametrize("top_p", [0.95, 0.5, 0.01, 1.0])
def test_top_k_top_p_gives_generates_scores(top_p):
    """top_k_top_p against transformers' TopKLogitsWarper then TopPLogitsWarper: random
    scores, a tie at the k-th score, fewer finite scores than k (a format guide's mask)."""
    import torch
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    def generates(scores):
        scores = TopKLogitsWarper(top_k=50)(None, scores)
        return TopPLogitsWarper(top_p=top_p)(None, scores) if top_p < 1.0 else scores

    scores = torch.randn(6, 3000, generator=torch.Generator().manual_seed(0)) * 3
    tied = scores.clone()
    tied[0, :60] = tied[0].topk(50).values[-1]  # the k-th score shared by 60 tokens
    guided = torch.full_like(scores, -float("inf"))
    guided[:, :7] = scores[:, :7]
    for case in (scores, guided):
        expected, got = generates(case.clone()), _kept_scores(case.clone(), 50, top_p)
        assert torch.equal(torch.isinf(got), torch.isinf(expected))
        assert torch.equal(got[~torch.isinf(got)], expected[~torch.isinf(expected)])
    # With ties on the top-p boundary, which of the equal scores stay follows the sort's order:
    # the same scores stay, maybe at other ones of the tied tokens.
    expected, got = generates(tied.clone()), _kept_scores(tied.clone(), 50, top_p)
    for row_expected, row_got in zip(expected, got, strict=True):
        assert torch.equal(row_got.sort().values, row_expected.sort().values)
    kept = (~torch.isinf(_kept_scores(scores, 50, top_p))).sum(-1)
    assert (kept <= 50).all() and (kept >= 1).all() and (top_p < 1.0 or (kept == 50).all())


def _generates_probabilities(scores, temperature, top_k, top_p):
    """The softmax `generate` samples from: transformers' own warpers, in its order."""
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    if temperature != 1.0:
        scores = TemperatureLogitsWarper(temperature)(None, scores)
    if top_k:
        scores = TopKLogitsWarper(top_k=top_k)(None, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p=top_p)(None, scores)
    return scores.softmax(dim=-1)


@pytest.mark.parametrize("temperature, top_k, top_p",
                         [(0.8, 50, 0.95), (1.0, 50, 1.0), (0.7, 20, 0.5), (1.3, 0, 0.9)])
def test_candidate_sampler_has_generates_probabilities(temperature, top_k, top_p):
    """The sampler over its candidates: generate's probabilities for every token (those
    outside the candidates 0), on random scores and under a format guide's mask."""
    import torch
    from transformers import GenerationConfig

    from wim.backends.decode import CandidateSampler

    scores = torch.randn(6, 3000, generator=torch.Generator().manual_seed(1)) * 3
    guided = torch.full_like(scores, -float("inf"))
    guided[:, :7] = scores[:, :7]
    sampler = CandidateSampler(GenerationConfig(top_k=top_k), temperature, top_p)
    for case in (scores, guided):
        expected = _generates_probabilities(case.clone(), temperature, top_k, top_p)
        probs, indices = sampler.candidates(case.clone())
        if indices is not None:
            probs = torch.zeros_like(case).scatter_(-1, indices, probs)
        torch.testing.assert_close(probs, expected, rtol=1e-5, atol=1e-7)


def test_candidate_sampler_draws_by_those_probabilities():
    """50,000 draws from one row of scores: each token's frequency is its probability (total
    variation under 0.02; without the temperature it is 0.17 away, drawn uniformly over the
    candidates 0.47), no token outside the candidates, and a seed draws the same tokens again.
    What it hands `generate` leaves one token possible per row, the drawn one."""
    import torch
    from transformers import GenerationConfig

    from wim.backends.decode import CandidateSampler

    row = torch.randn(1, 500, generator=torch.Generator().manual_seed(2)) * 2
    scores = row.expand(50_000, -1).clone()
    sampler = CandidateSampler(GenerationConfig(), 0.7, 0.95)
    torch.manual_seed(0)
    chosen = sampler(None, scores)
    assert bool((torch.isfinite(chosen).sum(-1) == 1).all())
    tokens = chosen.argmax(-1)
    expected = _generates_probabilities(row.clone(), 0.7, 50, 0.95)[0]
    frequency = torch.bincount(tokens, minlength=500) / len(tokens)
    assert float((frequency - expected).abs().sum()) / 2 < 0.02
    assert bool((expected[tokens] > 0).all())
    torch.manual_seed(0)
    assert torch.equal(sampler(None, scores).argmax(-1), tokens)


@pytest.mark.slow
@pytest.mark.parametrize("mode, prompt", [("wim", "ours"), ("numeric", "ours"), ("wim", "authors")])
def test_same_greedy_judgements_with_and_without_reuse(monkeypatch, mode, prompt) -> None:
    """wim: the guided format (a stateful logits processor); numeric and authors: stop strings."""
    backend = _bundled_float32(batch_size=3)
    batches = []
    real_batch = PrefixCache.batch
    monkeypatch.setattr(PrefixCache, "batch",
                        lambda self, suffixes, *args: batches.append((len(self), len(suffixes)))
                        or real_batch(self, suffixes, *args))
    raws = {}
    for reuse in (False, True):
        view = backend.reference_view()
        view.reuse_prefix = reuse
        judge = BackendJudge(view, role="fixed", model_name="bundled", mode=mode, prompt=prompt,
                             criteria="accuracy", max_new_tokens=32, max_retries=0)
        results = judge.judge(ITEMS, seed=1)
        raws[reuse] = [r.raw for r in results]
        assert bool(batches) == reuse  # the reuse path ran only when switched on
        if mode == "wim" and prompt == "ours":
            # The guide's work: one line of critique, then "Rating:" and digits only. Which
            # number is the model's (in float32 the 135M judge wrote "100" once, which the
            # parser then rightly refuses), so the shape is checked, not the range.
            assert all(re.fullmatch(r"Missing: [^\n]*\S[^\n]*\nRating:\s?\d{1,3}\n?", r.raw)
                       for r in results), raws[reuse]
            assert sum(r.parse_ok for r in results) >= len(results) - 1, raws[reuse]
    calls = {"ours": 1, "authors": 3}[prompt]  # the authors' format takes three calls
    # Per call: two batches (3 + 2) after one prefix of the instructions (over the minimum).
    assert [n for _, n in batches] == [3, 2] * calls
    assert all(length >= max(MIN_PREFIX_TOKENS, 100) for length, _ in batches)
    assert raws[True] == raws[False]


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
            results = judge.judge(ITEMS, seed=1)
            raws[reuse] = [r.raw for r in results]
            # Two calls (critique, then rating); the prefix is evaluated once per call and
            # restored for the other four prompts.
            assert len(restored) == (8 if reuse else 0)
    finally:
        backend.close()
    assert raws[True] == raws[False]
    for r in results:
        check_two_step_judgement(r.raw, r.critique, r.rating, r.parse_ok)
    assert sum(r.parse_ok for r in results) >= len(results) - 1, raws[True]


@pytest.mark.slow
def test_sampling_after_a_shared_prefix_follows_the_seed(monkeypatch) -> None:
    """Sampling after a shared prefix (a judge's retries): the sampler draws on generate's
    pre-filled cache; a seed gives the same texts again, another seed other texts."""
    from wim.backends import SamplingParams
    from wim.backends.decode import CandidateSampler

    calls = []
    real_batch, real_draw = PrefixCache.batch, CandidateSampler.__call__
    monkeypatch.setattr(PrefixCache, "batch", lambda self, *a: calls.append("prefix") or
                        real_batch(self, *a))
    monkeypatch.setattr(CandidateSampler, "__call__", lambda self, *a: calls.append("draw") or
                        real_draw(self, *a))

    backend = _bundled_float32(batch_size=4)
    system = {"role": "system", "content": "You answer in one short sentence. " * 8}
    convs = [[system, {"role": "user", "content": q}] for q, _ in ITEMS]
    params = SamplingParams(max_new_tokens=12, temperature=1.0, top_p=0.9)

    def texts(seed: int) -> list[str]:
        return [row[0].text for row in backend.generate(convs, params, seed=seed)]

    first = texts(3)
    assert calls[0] == "prefix" and "draw" in calls  # the sampler drew after the prefix
    assert texts(3) == first
    assert texts(4) != first
    assert all(first)


def _bundled_float32(batch_size: int) -> TransformersBackend:
    """The bundled model pinned to float32 (not `auto`): these tests compare outputs across code
    paths token for token, and bfloat16's rounding depends on the matmuls' shapes, so a greedy
    tie may break differently (bench_dtype.py)."""
    return TransformersBackend.load("bundled:smollm2-135m-instruct", batch_size=batch_size,
                                    dtype="float32")


# The bundled tokenizer's ids used by the tiny model below.
IM_END, END_OF_TEXT, SEVEN, SALT, NEWLINE = 2, 0, 39, 5420, 198


def _two_end_token_model(end: int):
    """A tiny Llama, built in place over the bundled tokenizer, whose generation config lists
    two end tokens (<|im_end|>, the tokenizer's own, and <|endoftext|>).

    Its layers add nothing (zero output projections), so each next token depends on the
    current one only: " salt" -> newline, "7" -> `end`, anything else -> "7", then " salt". A
    judge after "Missing:" writes " salt", a newline, (the guide's) "Rating:", "7" and `end`;
    after "Rating:" (numeric mode) "7" and `end`. Decoding that did not stop at `end` would write
    "7" again."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from wim.models import resolve_causal_lm

    tokenizer = AutoTokenizer.from_pretrained(resolve_causal_lm("bundled:smollm2-135m-instruct"))
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=16,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=4096, tie_word_embeddings=False)
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    with torch.no_grad():
        layer = model.model.layers[0]
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
        # Three kinds of current token: anything (0), "7" (1), " salt" (2).
        emb = model.model.embed_tokens.weight
        emb.zero_()
        emb[:, 0] = 1.0
        emb[SEVEN], emb[SALT] = torch.eye(16)[1], torch.eye(16)[2]
        head = model.lm_head.weight
        head.zero_()
        head[SEVEN, 0], head[SALT, 0] = 10.0, 5.0
        head[end, 1] = 10.0
        head[NEWLINE, 2] = 10.0
    model.generation_config.eos_token_id = [IM_END, END_OF_TEXT]
    model.generation_config.pad_token_id = IM_END
    return model, tokenizer


@pytest.mark.slow
@pytest.mark.parametrize("end", [IM_END, END_OF_TEXT])
@pytest.mark.parametrize("mode", ["wim", "numeric"])
def test_the_judge_stops_at_either_end_token_of_the_generation_config(end, mode):
    model, tokenizer = _two_end_token_model(end)
    forwards = []
    model.register_forward_hook(lambda *args: forwards.append(1))
    # generate from the whole prompts; generate after the shared prefix.
    for reuse in (False, True):
        backend = TransformersBackend(model, tokenizer, batch_size=8, reuse_prefix=reuse)
        assert backend.end_ids() == [IM_END, END_OF_TEXT]
        judge = BackendJudge(backend, role="external", model_name="tiny", mode=mode,
                             criteria="accuracy", max_new_tokens=24, max_retries=0)
        forwards.clear()
        results = judge.judge(ITEMS[:3], seed=0)
        # Decoding stopped at the end token, not merely the text: one forward pass per token
        # written (one batch), and with reuse one more for the prefix.
        assert len(forwards) == results[0].completion_tokens + reuse
        for r in results:
            if mode == "wim":
                # " salt", newline, "Rating:" (3 tokens), "7", the end token.
                assert (r.raw, r.completion_tokens) == ("Missing: salt\nRating:7", 7), reuse
                assert (r.critique, r.rating) == ("salt", 7)
            else:  # "7", the end token
                assert (r.raw, r.completion_tokens, r.rating) == ("Rating:7", 2, 7), reuse


@pytest.mark.slow
def test_a_seeded_judge_retry_samples_the_same_text_with_and_without_reuse():
    """A retry samples at the judge's retry temperature (0.7) with generate's top-k of 50:
    after the prefix it draws what it draws from the whole prompts."""
    backend = _bundled_float32(batch_size=3)
    texts = {}
    for reuse in (False, True):
        backend.reuse_prefix = reuse
        judge = BackendJudge(backend, role="fixed", model_name="bundled", criteria="accuracy",
                             max_new_tokens=32, max_retries=1)
        # What `judge` asks on a retry (wim/judges.py): the retry temperature, a new seed.
        for seed in (1, 2):
            raws = judge._ask(ITEMS, judge.retry_temperature, seed + 7919)
            texts[reuse, seed] = [raw for raw, *_ in raws]
        greedy = [raw for raw, *_ in judge._ask(ITEMS, 0.0, 1)]
    assert texts[True, 1] == texts[False, 1]
    assert texts[True, 2] == texts[False, 2]
    assert texts[True, 1] != texts[True, 2] and texts[True, 1] != greedy  # it did sample


@pytest.mark.slow
def test_samples_per_prompt() -> None:
    """A policy's call (no shared prefix, n samples per prompt): n rows per prompt, greedy
    rows equal to the prompt's one greedy answer, sampled rows that differ from each other and
    come again with the seed."""
    from wim.backends import SamplingParams

    backend = _bundled_float32(batch_size=4)
    convs = [[{"role": "user", "content": q}] for q, _ in ITEMS[:3]]
    greedy = SamplingParams(max_new_tokens=12, temperature=0.0)
    one = [row[0].text for row in backend.generate(convs, greedy, n=1)]
    two = backend.generate(convs, greedy, n=2)
    assert [[c.text for c in row] for row in two] == [[t, t] for t in one]
    sampled = SamplingParams(max_new_tokens=12, temperature=1.0, top_p=0.95)
    first = [[c.text for c in row] for row in backend.generate(convs, sampled, n=2, seed=5)]
    assert [[c.text for c in row] for row in backend.generate(convs, sampled, n=2, seed=5)] == first
    assert any(a != b for a, b in first)
