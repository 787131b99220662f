"""`wim eval`'s verdicts and statistics (training/evaluate.py: blind_comparisons, eval_report,
_from_points) with a recorded evaluator: a real local HTTP server whose verdicts and verdict
probabilities are rules of the test (position only, longer answer), sent in OpenAI's chat format
with `logprobs.content[*].top_logprobs`, taken through the real HTTP backend."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable

import pytest
from conftest import QUICKSTART
from recording_server import JSONServer, chat_completion
from scipy.stats import ttest_1samp
from statsmodels.stats.multitest import multipletests

from training.evaluate import System, blind_comparisons, eval_markdown, eval_report, write_eval
from wim.backends.http_backend import HTTPBackend
from wim.blind import BlindEvaluator
from wim.config import load_config
from wim.prompts import Prompt
from wim.report.evaluation import evaluation_body
from wim.report.plots import plot_preferences

Decide = Callable[[str, str], dict[str, float]]
"""(answer shown as A, answer shown as B) -> probabilities of "A", "B", "tie"."""


def _shown(messages: list[dict]) -> tuple[str, str]:
    user = messages[-1]["content"]
    m = re.search(r"Answer A:\n(.*)\n\nAnswer B:\n(.*)\Z", user, re.S)
    return m.group(1), m.group(2)


class VerdictServer(JSONServer):
    """A chat server that answers the verdict JSON and, when asked for logprobs, the verdict
    token's distribution `decide(A, B)` ("tie" split over the tokens "t" and "tie", as vLLM's
    guided decoding lists it); `logprobs=False`: a server that never sends any. A pointwise
    request gets `Score: <len(answer) % 10 + 1>`; `garble(A, B)` true: an unparseable reply."""

    def __init__(self, decide: Decide, logprobs: bool = True,
                 garble: Callable[[str, str], bool] = lambda a, b: False) -> None:
        self.decide, self.logprobs, self.garble = decide, logprobs, garble
        super().__init__()

    def respond(self, path: str, body: dict) -> tuple[int, dict]:
        user = body["messages"][-1]["content"]
        if "Answer A:" not in user:
            answer = user.split("Answer:\n", 1)[1]
            return 200, chat_completion(f"Reason: r\nScore: {len(answer) % 10 + 1}", 9, 4)
        a, b = _shown(body["messages"])
        if self.garble(a, b):
            return 200, chat_completion("I cannot decide.", 9, 4)
        probs = self.decide(a, b)
        verdict = max(probs, key=probs.get)
        reply = chat_completion(json.dumps({"reason": "r", "verdict": verdict}), 9, 12)
        if body.get("logprobs") and self.logprobs:
            tokens = ['{"', "reason", '":', ' "', "r", '",', ' "', "verdict", '":', ' "',
                      {"A": "A", "B": "B", "tie": "t"}[verdict], '"}']
            top = {"A": probs["A"], "B": probs["B"], "t": 0.6 * probs["tie"],
                   "tie": 0.4 * probs["tie"], ",": 1e-9}
            content = []
            for i, token in enumerate(tokens):
                alts = ({t: p for t, p in top.items() if p > 0} if i == len(tokens) - 2
                        else {token: 1.0})
                content.append({"token": token, "logprob": math.log(alts[token]),
                                "top_logprobs": [{"token": t, "logprob": math.log(p)}
                                                 for t, p in alts.items()]})
            reply["choices"][0]["logprobs"] = {"content": content}
        return 200, reply


def always_a(a: str, b: str) -> dict[str, float]:
    return {"A": 0.9, "B": 0.04, "tie": 0.06}


def longer(a: str, b: str) -> dict[str, float]:
    """The longer answer with probability 0.8, in either order."""
    return {"A": 0.8, "B": 0.2, "tie": 0.0} if len(a) > len(b) else \
        {"A": 0.2, "B": 0.8, "tie": 0.0}


def _prompts(n: int) -> list[Prompt]:
    return [Prompt(f"p{i:02d}", "d", ({"role": "user", "content": f"Question {i}?"},))
            for i in range(n)]


def _answers(n: int, a_longer: int) -> dict[str, list[dict]]:
    """System a's answer is the longer one on the first `a_longer` prompts."""
    out: dict[str, list[dict]] = {"a": [], "b": [], "c": []}
    for i in range(n):
        short, long = f"short {i}", f"a much longer answer number {i}, with details"
        for name, text in (("a", long if i < a_longer else short),
                           ("b", short if i < a_longer else long), ("c", f"c{i} " * 3)):
            out[name].append({"system": name, "prompt_id": f"p{i:02d}", "response": text})
    return out


def run_eval(server: VerdictServer, n: int, a_longer: int, pairs=None, mode="pairwise",
             verdict="weighted"):
    cfg = load_config(QUICKSTART, [f"blind.mode={mode}", f"blind.verdict={verdict}"])
    pairs = pairs or [("a vs b", "a", "b")]
    evaluator = BlindEvaluator(HTTPBackend([server.url], "recorded", max_retries=0),
                               max_retries=0, model_name="recorded", verdict=verdict)
    prompts = _prompts(n)
    try:
        outcomes, records = blind_comparisons(evaluator, mode, prompts, _answers(n, a_longer),
                                              pairs)
    finally:
        evaluator.close()
    systems = [System(s, "recorded-policy") for s in ("a", "b", "c")]
    return eval_report(cfg, evaluator, outcomes, pairs, systems, records, n), records


@pytest.fixture
def serve():
    servers = []

    def start(*args, **kwargs) -> VerdictServer:
        servers.append(VerdictServer(*args, **kwargs))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def test_a_position_only_evaluator_gives_exactly_one_half_and_nothing_significant(serve):
    report, records = run_eval(serve(always_a), 30, 24)
    c = report["comparisons"][0]
    w = c["weighted"]
    assert w["preference"] == 0.5 and all(r["preference"] == 0.5 for r in records)
    assert w["p_value"] == 1.0 and w["ci95"] == [0.5, 0.5]
    # Both orders kept: a shown first P(a) = 0.9 + 0.06 / 2; b shown first P(a) = 0.04 + 0.03.
    assert records[0]["p_ab"] == pytest.approx(0.93) and records[0]["p_ba"] == pytest.approx(0.07)
    assert records[0]["probs_ab"] == pytest.approx({"A": 0.9, "B": 0.04, "tie": 0.06})
    assert w["sources"] == {"top_logprobs": 30} and report["hard_fallback"] == 0
    # The hard verdicts: every prompt's two orders disagree, so order agreement is 0.
    assert c["order_agreement"] == 0.0 and c["orders_compared"] == 30
    assert c["ties_split"]["order_disagreement"] == 30
    assert w["per_prompt"][0] == {"prompt_id": "p00", "p": 0.5, "p_ab": pytest.approx(0.93),
                                  "p_ba": pytest.approx(0.07), "source": "top_logprobs"}


def test_a_longer_answer_evaluator_is_found_significant_on_30_prompts(serve):
    server = serve(longer)
    report, records = run_eval(server, 30, 24)
    w = report["comparisons"][0]["weighted"]
    prefs = [r["preference"] for r in records]
    assert prefs[:24] == pytest.approx([0.8] * 24) and prefs[24:] == pytest.approx([0.2] * 6)
    t = ttest_1samp(prefs, 0.5)
    assert w["preference"] == pytest.approx(0.68) and w["p_value"] == pytest.approx(t.pvalue)
    assert w["p_value"] < 0.05 and w["ci95"] == pytest.approx(list(t.confidence_interval()))
    assert w["ci95"][0] > 0.5  # the interval agrees with the test
    # Every request asked for the verdict's probabilities under a verdict enum.
    assert all(b["logprobs"] is True and b["top_logprobs"] >= 3 for b in server.bodies)
    assert all(b["response_format"]["json_schema"]["schema"]["properties"]["verdict"]["enum"]
               == ["A", "B", "tie"] for b in server.bodies)
    md = eval_markdown(report)
    lead = md.split("**Hard verdicts**")[0]
    assert "`a` is preferred: weighted win rate 0.680" in lead
    assert f"{w['ci95'][0]:.3f}" in lead and "Power of the weighted test" in lead


def test_a_server_without_logprobs_falls_back_to_hard_verdicts_counted(serve):
    report, records = run_eval(serve(longer, logprobs=False), 10, 10)
    w = report["comparisons"][0]["weighted"]
    assert w["sources"] == {"hard": 10} and w["hard_fallback"] == 10
    assert report["hard_fallback"] == 10
    assert w["preference"] == 1.0  # the hard verdict, probability 1, in both orders
    assert "Hard-verdict fallback.** 10 prompt(s)" in eval_markdown(report)
    assert {r["preference_source"] for r in records} == {"hard"}


def test_failures_are_counted_not_ties_and_holm_spans_the_family(serve):
    server = serve(longer, garble=lambda a, b: a.startswith("c0 ") or b.startswith("c0 "))
    pairs = [("a vs b", "a", "b"), ("a vs c", "a", "c")]
    report, records = run_eval(server, 12, 11, pairs=pairs)
    ab, ac = report["comparisons"]
    assert ab["failures"] == 0 and ac["failures"] == 1
    assert ac["n"] == 12 and ac["wins"] + ac["losses"] + ac["ties"] == 11
    assert ac["weighted"]["n"] == 11 and len(ac["weighted"]["per_prompt"]) == 11
    failed = [r for r in records if r["comparison"] == "a vs c" and r["winner"] is None]
    assert len(failed) == 1 and failed[0]["preference"] is None and failed[0]["failure"]
    sign = multipletests([ab["p_value"], ac["p_value"]], method="holm")[1]
    weighted = multipletests([ab["weighted"]["p_value"], ac["weighted"]["p_value"]],
                             method="holm")[1]
    assert [ab["p_holm"], ac["p_holm"]] == pytest.approx(list(sign))
    assert [ab["weighted"]["p_holm"], ac["weighted"]["p_holm"]] == pytest.approx(list(weighted))
    assert ab["weighted"]["p_holm"] > ab["weighted"]["p_value"]  # not per comparison


def test_pointwise_scores_become_pair_verdicts(serve):
    # Score = len(answer) % 10 + 1: "short 0" (7 chars) scores 8; the long answer (44) 5.
    report, records = run_eval(serve(longer), 4, 2, mode="pointwise")
    c = report["comparisons"][0]
    a_scores = {r["prompt_id"]: r for r in records}
    assert [a_scores[f"p{i:02d}"]["winner"] for i in range(4)] == ["b", "b", "a", "a"]
    assert c["wins"] == 2 and c["losses"] == 2 and c["failures"] == 0
    assert c["weighted"]["sources"] == {"pointwise": 4}
    assert report["evaluator"]["verdict"] == "pointwise"


def test_the_power_line_counts_the_decisive_prompts(serve):
    report, _ = run_eval(serve(longer), 3, 2, verdict="hard")
    c = report["comparisons"][0]
    assert c["wins"] == 2 and c["losses"] == 1
    assert "With 3 decisive prompt(s) (2 wins, 1 losses; ties left out) the smallest " \
           "sign-test p was 0.25." in eval_markdown(report)
    assert report["evaluator"]["verdict"] == "hard" and report["hard_fallback"] == 0


def test_the_picture_shows_both_orders_and_the_mean_with_its_interval(serve, tmp_path):
    report, records = run_eval(serve(longer), 12, 9)
    write_eval(tmp_path, report, _answers(12, 9), records)
    md = (tmp_path / "eval.md").read_text()
    assert "](plots/eval_preferences.png)" in md and (tmp_path / "plots" /
                                                       "eval_preferences.png").is_file()
    assert md.index("weighted win rate") < md.index("](plots/eval_preferences.png)")
    saved = [json.loads(line) for line in (tmp_path / "eval" / "verdicts.jsonl").open()]
    assert [r["p_ab"] for r in saved] == [r["p_ab"] for r in records]
    drawn = plot_preferences(report["comparisons"][0], tmp_path / "again.png")
    w = report["comparisons"][0]["weighted"]
    by_p = sorted(w["per_prompt"], key=lambda r: r["p"])
    assert drawn["p"] == [r["p"] for r in by_p] and drawn["p_ab"] == [r["p_ab"] for r in by_p]
    assert drawn["mean"] == w["preference"] and drawn["ci95"] == w["ci95"]
    # The report's section leads with the picture make_plots drew.
    doc = {**report, "picture": "plots/preferences.png"}
    body = evaluation_body(doc)
    assert body.index("![Each held-out prompt's preference in both orders (a spread is "
                      "position bias); the mean with its t 95% interval]"
                      "(plots/preferences.png)") < next(
        i for i, line in enumerate(body) if "weighted win rate" in line)


def test_the_cost_table_names_its_units():
    from wim.report.build import render_markdown

    cfg = load_config(QUICKSTART)
    run = {"policy/model": "p", "judge/model": "j", "judge/role": "fixed", "judge/mode": "wim",
           "judge/prompt": "ours", "score/embedder": "e", "time/eval": 39.061,
           "tokens/judge/in": 1200, "http/judge/retries": 2}
    md = render_markdown(run, cfg, [])
    assert "| what | value | unit |" in md
    assert "| time/eval | 39.061 | seconds (wall clock) |" in md
    assert "| tokens/judge/in | 1200 | tokens |" in md
    assert "| http/judge/retries | 2 | count |" in md
