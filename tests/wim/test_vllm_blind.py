"""Weighted blind verdicts against a real vLLM server (the `vllm_server` fixture, bundled
SmolLM2-135M, which cannot really judge: the test checks where the probabilities come from and
how they are combined, not which answer is better). Requests pass through a recording proxy."""

from __future__ import annotations

import json
import math

from conftest import QUICKSTART
from recording_server import ForwardingServer

from training.evaluate import System, blind_comparisons, eval_report, write_eval
from wim.backends.http_backend import HTTPBackend
from wim.blind import BlindEvaluator, parse_verdict
from wim.config import load_config
from wim.prompts import Prompt

QUESTIONS = ["What is 2 + 2?", "Name a colour of the sky.", "Why do leaves fall in autumn?",
             "What is the capital of France?"]
A = ["4", "Blue, on a clear day.", "Trees shed them to save water in winter.", "Paris."]
B = ["5, I think", "Green", "Because of gravity.", "Lyon is the capital, I believe."]


def test_weighted_verdicts_come_from_top_logprobs(vllm_server, tmp_path):
    proxy = ForwardingServer(vllm_server.url)
    prompts = [Prompt(f"q{i}", "d", ({"role": "user", "content": q},))
               for i, q in enumerate(QUESTIONS)]
    answers = {name: [{"system": name, "prompt_id": p.id, "response": t}
                      for p, t in zip(prompts, texts, strict=True)]
               for name, texts in (("a", A), ("b", B))}
    # A loaded 2-core machine can take minutes per request.
    evaluator = BlindEvaluator(HTTPBackend([proxy.url], vllm_server.name, max_retries=1,
                                           timeout_s=600),
                               model_name=vllm_server.name)
    try:
        outcomes, records = blind_comparisons(evaluator, "pairwise", prompts, answers,
                                              [("a vs b", "a", "b")])
    finally:
        evaluator.close()
        proxy.close()
    cfg = load_config(QUICKSTART)
    report = eval_report(cfg, evaluator, outcomes, [("a vs b", "a", "b")],
                         [System("a", "x"), System("b", "x")], records, len(prompts))
    write_eval(tmp_path, report, answers, records)
    saved = json.loads((tmp_path / "eval.json").read_text())
    w = saved["comparisons"][0]["weighted"]
    # Every request asked for the verdict token's probabilities under the verdict enum.
    assert proxy.bodies and all(b["logprobs"] is True and b["top_logprobs"] == 8
                                and "verdict" in json.dumps(b["response_format"])
                                for b in proxy.bodies)
    parsed = [r for r in records if r["winner"] is not None]
    assert parsed, [r["failure"] for r in records]
    # eval.json names the path of each prompt's probabilities: the server's top_logprobs.
    assert {r["source"] for r in w["per_prompt"]} == {"top_logprobs"}
    assert w["hard_fallback"] == 0 and saved["hard_fallback"] == 0
    for r in parsed:
        for order, shown_a in (("ab", "A"), ("ba", "B")):
            probs = r[f"probs_{order}"]
            assert math.isclose(sum(probs.values()), 1.0)
            # The verdict the server wrote has mass in the distribution read at its position.
            # (Not necessarily the most: "tie" sums up to three tokens, t, ti and tie, and a
            # retry samples. The bundled model may pad the JSON with newlines.)
            verdict = parse_verdict(r["raw"][0 if order == "ab" else -1])[0]
            assert probs[verdict] > 0, (verdict, probs)
            assert r[f"p_{order}"] == probs[shown_a] + probs["tie"] / 2
        assert r["preference"] == round((r["p_ab"] + r["p_ba"]) / 2, 10)
