"""The HTTP backends against a real vLLM server (the CPU build, `vllm_server` in conftest.py):
policy sampling with n = k, the WIM judge with the guided JSON, the blind evaluator, and LoRA
adapters registered at run time. One server for the session; small workloads."""

from __future__ import annotations

import pytest
from conftest import QUICKSTART, served_models
from recording_server import ForwardingServer

from wim.backends import SamplingParams, sample_seed
from wim.backends.adapter_serving import adapter_name, register_adapter
from wim.backends.http_backend import HTTPBackend
from wim.blind import BlindEvaluator
from wim.config import load_config
from wim.judges import BackendJudge
from wim.prompts import load_prompts

PARAMS = SamplingParams(max_new_tokens=32, temperature=0.8, top_p=0.95)


def _convs(n: int) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": p.text}] for p in load_prompts("bundled")[:n]]


def _backend(server, **kw) -> HTTPBackend:
    return HTTPBackend([server.url], kw.pop("model", server.name), concurrency=4,
                       timeout_s=120, **kw)


def test_k_samples_per_prompt_in_one_request(vllm_server) -> None:
    """n=3 is one request per prompt carrying its seed, and its samples differ. Whether the
    same seed repeats the same texts is the server's numerics, not ours: vLLM's CPU build
    computes in bfloat16, and on a CPU with AMX its results depend on which requests it
    batched together, so repeats are not asserted; the seed is checked on the requests the
    server received (a recording proxy in front of it)."""
    proxy = ForwardingServer(vllm_server.url)
    try:
        backend = HTTPBackend([proxy.url], vllm_server.name, concurrency=4, timeout_s=120)
        convs = _convs(3)
        first = backend.generate(convs, PARAMS, n=3, seed=11)
        other = backend.generate(convs, PARAMS, n=3, seed=12)
    finally:
        proxy.close()
    # One request per prompt (n=3): the server reads each prompt once.
    assert backend.stats["n_fallback"] == 0 and len(proxy.bodies) == 6
    assert all(body["n"] == 3 for body in proxy.bodies)
    sent = {(body["messages"][0]["content"], body["seed"]) for body in proxy.bodies}
    asked = {(conv[0]["content"], sample_seed(seed, i, 0))
             for seed in (11, 12) for i, conv in enumerate(convs)}
    assert sent == asked  # each prompt's own seed, from the call's seed
    assert [len(row) for row in first] == [3, 3, 3]
    assert all(c.ok and c.text.strip() and c.completion_tokens > 0 for row in first for c in row)
    # The prompt is read once: its tokens are on the first sample only.
    assert all(row[0].prompt_tokens > 0 and row[1].prompt_tokens == 0 for row in first)
    assert any(len({c.text for c in row}) > 1 for row in first)  # k samples, not one copy
    assert [[c.text for c in row] for row in other] != [[c.text for c in row] for row in first]


def test_guided_judge_always_ends_with_its_rating(vllm_server) -> None:
    """The critique's maxLength comes from judge.max_new_tokens: every guided verdict is JSON
    that ends with a rating, even from a 135M judge that would ramble past its budget."""
    backend = _backend(vllm_server)
    convs = _convs(8)
    answers = backend.generate(convs, SamplingParams(64, 0.8, 0.95), n=2, seed=3)
    items = [(conv[0]["content"], c.text) for conv, row in zip(convs, answers, strict=True)
             for c in row]
    judge = BackendJudge(backend, role="external", model_name=vllm_server.name,
                         max_new_tokens=48, max_retries=2)
    before = backend.stats["requests"]
    results = judge.judge(items, seed=1)
    assert len(results) == 16 and not any(r.backend_failed for r in results)
    assert [r.error for r in results if r.error and "no rating" in r.error] == []
    unrated = [(r.error, r.attempts, r.raw[-200:]) for r in results
               if r.rating is None or not 1 <= r.rating <= 10]
    assert unrated == []
    assert all(r.raw.rstrip().endswith("}") for r in results)
    attempts = sum(r.attempts for r in results)
    assert backend.stats["requests"] - before == attempts  # one request per attempt
    assert attempts <= 24, [r.error for r in results]  # at most 1.5 attempts per judgement


def test_blind_evaluator_on_vllm(vllm_server) -> None:
    backend = _backend(vllm_server)
    evaluator = BlindEvaluator(backend, max_retries=1, max_new_tokens=48)
    questions = [c[0]["content"] for c in _convs(3)]
    good = ["A clear, correct and complete answer with the key facts."] * 3
    verdicts = evaluator.pairwise(questions, good, ["zq xv blorp"] * 3)
    # Each pair asked in both orders; a verdict is a winner/tie or a failure with its reason.
    assert len(verdicts) == 3 and backend.stats["requests"] >= 6
    assert all((v.winner in ("a", "b", "tie")) != (v.failure is not None) for v in verdicts)
    assert all(len(v.raw) >= 2 and all(v.raw) and v.tokens > 0 for v in verdicts)
    # The server answered every request. (Over HTTP the verdict is plain text, which the 135M
    # bundled model rarely writes in the format: its failures are parse failures, counted.)
    assert not any((v.failure or "").startswith("backend failed") for v in verdicts)


@pytest.mark.slow
def test_a_registered_adapter_changes_the_answers(vllm_server, trained_adapter) -> None:
    name = "wim-test-adapter"
    register_adapter(vllm_server.url, name, str(trained_adapter))
    register_adapter(vllm_server.url, name, str(trained_adapter))  # "already loaded" is fine
    assert name in served_models(vllm_server.url)
    greedy = SamplingParams(24, 0.0)
    convs = _convs(4)
    base = _backend(vllm_server).generate(convs, greedy)
    tuned = _backend(vllm_server, model=name).generate(convs, greedy)
    assert [r[0].text for r in base] != [r[0].text for r in tuned]


@pytest.mark.slow
def test_eval_answers_by_each_systems_served_name(vllm_server, trained_adapter) -> None:
    """`wim eval` / `wim compare` with served adapters: each system answers on the server by
    its adapter's name (registered on the way), the base by the base name."""
    from training.evaluate import System, generate_answers

    cfg = load_config(QUICKSTART, ["policy.backend=http", f"http.base_urls=[{vllm_server.url}]",
                                   f"http.model={vllm_server.name}", "http.adapter_serving=vllm",
                                   "generation.max_new_tokens=24"])
    prompts = load_prompts("bundled")[:4]
    systems = [System("policy", cfg.policy.model, str(trained_adapter)),
               System("base", cfg.policy.model, None)]
    answers = generate_answers(cfg, systems, prompts, progress=False)
    name = adapter_name(trained_adapter)
    assert {a["served_model"] for a in answers["policy"]} == {name}
    assert {a["served_model"] for a in answers["base"]} == {vllm_server.name}
    assert name in served_models(vllm_server.url)
    assert [a["response"] for a in answers["policy"]] != [a["response"] for a in answers["base"]]
