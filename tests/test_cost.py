"""What a run cost (wim/pricing.py) through the real CLI: tokens by kind from the servers'
`usage`, priced by `http.price`, in stats/*.json and the report; batch answers with the batch
discount; `--batch-submit`'s estimate. The stand-in answers as the servers it stands for do:
an OpenAI judge's `usage` with every detail (cached and reasoning tokens), a vLLM policy's with
null details, `n` choices under one `usage`, and latency that varies. The expected costs are
worked out by hand from the per-request token counts below."""

from __future__ import annotations

import json
import random
import re
import time
from pathlib import Path

import pytest
from conftest import QUICKSTART, FlakyServer, http_overrides, run_wim, sets

from data_gen.fingerprints import input_fingerprint
from wim.config import ConfigError, PriceConfig, load_config
from wim.pricing import role_price, run_costs
from wim.records import read_keyed
from wim.rundir import RunDir
from wim.stages import STAGES

PROMPTS = [{"id": f"p{i}", "domain": "x", "prompt": f"Question number {i}?"} for i in range(4)]

# Per request. The policy (vLLM without --enable-prompt-tokens-details): no details, and one
# `usage` for the n choices of a request. The judge (a hosted reasoning model): cached and
# reasoning tokens, each part of the prompt and completion counts.
POLICY_PROMPT, POLICY_COMPLETION_PER_CHOICE = 20, 7
JUDGE_USAGE = {"prompt_tokens": 100, "completion_tokens": 30, "total_tokens": 130,
               "prompt_tokens_details": {"cached_tokens": 64, "audio_tokens": 0},
               "completion_tokens_details": {"reasoning_tokens": 22, "audio_tokens": 0,
                                             "accepted_prediction_tokens": 0,
                                             "rejected_prediction_tokens": 0}}
HTTP_PRICE = "http.price={input: 2.0, output: 8.0}"  # the policy's server (and the default)
JUDGE_PRICE = "judge.http.price={input: 1.25, cached_input: 0.125, output: 10.0, " \
              "batch_discount: 0.5}"
# By hand: 4 prompts x 2 samples. Generation: 4 requests of n=2, each 20 prompt tokens and
# 2 x 7 completion tokens: 80 in, 56 out -> (80 x 2.0 + 56 x 8.0) / 1e6.
POLICY_COST = (80 * 2.0 + 56 * 8.0) / 1e6  # 608e-6
# Judging: 8 requests of 100 prompt tokens (64 cached) and 30 completion tokens (22 of them
# reasoning, billed as output, already inside the 30): 288 uncached, 512 cached, 240 out.
JUDGE_COST = (288 * 1.25 + 512 * 0.125 + 240 * 10.0) / 1e6  # 2824e-6


class PricedServer(FlakyServer):
    """FlakyServer's answers (and its downtime), with the `usage` above, `n` choices per
    request, and a latency of 0-20 ms that varies from request to request."""

    def respond(self, path: str, body: dict) -> tuple[int, dict]:
        time.sleep(random.uniform(0.0, 0.02))
        status, text = self.answer(body["messages"])
        if status != 200:
            return status, {"error": {"message": "down", "type": "server_error"}}
        judge = any(m["role"] == "system" for m in body["messages"])
        n = 1 if judge else int(body.get("n") or 1)
        usage = JUDGE_USAGE if judge else {
            "prompt_tokens": POLICY_PROMPT, "completion_tokens": POLICY_COMPLETION_PER_CHOICE * n,
            "total_tokens": POLICY_PROMPT + POLICY_COMPLETION_PER_CHOICE * n,
            "prompt_tokens_details": None, "completion_tokens_details": None}
        choices = [{"index": i, "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop", "logprobs": None} for i in range(n)]
        return 200, {"id": "chatcmpl-1", "object": "chat.completion", "model": body["model"],
                     "choices": choices, "usage": usage}


@pytest.fixture
def priced_server():
    server = PricedServer()
    try:
        yield server
    finally:
        server.close()


def _command(server, tmp_path: Path, *overrides: str) -> list[str]:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return ["run", str(QUICKSTART), "--out", str(tmp_path / "run"), "--skip-train",
            "--no-progress", *sets([*http_overrides(server.url), f"prompts.source={prompts}",
                                    "judge.max_retries=0", *overrides])]


def _stats(out: Path, stage: str) -> dict:
    return json.loads((out / "stats" / f"{stage}.json").read_text())


def test_run_with_prices_shows_tokens_by_kind_and_the_cost(priced_server, tmp_path: Path
                                                           ) -> None:
    out = tmp_path / "run"
    # The judge is down after 4 verdicts: the run stops, and the same command finishes it.
    priced_server.judge_up = 4
    command = _command(priced_server, tmp_path, HTTP_PRICE, JUDGE_PRICE)
    assert run_wim(command, check=False).returncode == 3
    priced_server.judge_up = None
    run_wim(command)
    generate, judge = _stats(out, "generate"), _stats(out, "judge")
    assert {k: v for k, v in generate.items() if k.startswith("tokens/")} == {
        "tokens/policy/in": 80, "tokens/policy/out": 56}  # no details: none invented
    assert {k: v for k, v in judge.items() if k.startswith("tokens/")} == {
        "tokens/judge/in": 800, "tokens/judge/out": 240, "tokens/judge/cached": 512,
        "tokens/judge/reasoning": 176}  # each record once, though the stage ran twice
    assert generate["cost/policy"] == pytest.approx(POLICY_COST)
    assert judge["cost/judge"] == pytest.approx(JUDGE_COST)
    report = json.loads((out / "report.json").read_text())
    assert report["cost/policy"] == pytest.approx(POLICY_COST)
    assert report["cost/judge"] == pytest.approx(JUDGE_COST)
    assert report["cost/total"] == pytest.approx(POLICY_COST + JUDGE_COST)  # 0.003432
    assert report["tokens/judge/reasoning"] == 176
    md = (out / "report.md").read_text()
    assert "Cost 0.003432 (judge 0.002824, policy 0.000608)" in md
    assert "| tokens/judge/cached | 512 | tokens |" in md
    judged = read_keyed(out / "judgements.jsonl")
    assert all(j["cached_tokens"] == 64 and j["reasoning_tokens"] == 22 for j in judged)
    samples = read_keyed(out / "samples.jsonl")
    assert not any("cached_tokens" in s or "reasoning_tokens" in s for s in samples)
    assert "judge_http" in (out / "pairs" / "README.md").read_text()  # the card: the config
    assert "batch_discount" not in (out / "pairs" / "README.md").read_text()  # not its price


def test_prices_added_later_price_the_run_without_asking_again(priced_server, tmp_path: Path
                                                               ) -> None:
    out = tmp_path / "run"
    run_wim(_command(priced_server, tmp_path))
    assert not any(k.startswith("cost/") for k in _stats(out, "judge"))
    report = json.loads((out / "report.json").read_text())
    assert not any(k.startswith("cost/") for k in report)  # tokens, but no cost
    assert report["tokens/judge/cached"] == 512
    assert "No cost shown: no `http.price` is set" in (out / "report.md").read_text()
    kept = {name: (out / name).read_bytes() for name in
            ("samples.jsonl", "judgements.jsonl", "scores.jsonl", "pairs.jsonl")}
    asked = dict(priced_server.counts)
    run_wim(_command(priced_server, tmp_path, HTTP_PRICE, JUDGE_PRICE))
    assert priced_server.counts == asked  # nothing asked again: the stages were finished
    assert all((out / name).read_bytes() == data for name, data in kept.items())
    report = json.loads((out / "report.json").read_text())
    assert report["cost/total"] == pytest.approx(POLICY_COST + JUDGE_COST)


def _answer(request: dict) -> dict:
    """A Batch API output line: the body as the live API answers, `usage` included."""
    body = {"id": "chatcmpl-b", "object": "chat.completion", "model": "flaky",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "Rating: 6"}}],
            "usage": JUDGE_USAGE}
    return {"id": "batch_req_1", "custom_id": request["custom_id"], "error": None,
            "response": {"status_code": 200, "request_id": "r", "body": body}}


def _batch_run(server, tmp_path: Path, *overrides: str) -> Path:
    """Samples generated by the stand-in, then `wim judge` with judge.batch: the requests."""
    command = _command(server, tmp_path, JUDGE_PRICE, *overrides)
    command[0] = "generate"
    command.remove("--skip-train")
    run_wim(command)
    out = tmp_path / "run"
    first = run_wim(["judge", str(out), "--no-progress", "--set", "judge.batch=true",
                     *sets(overrides)], check=False)
    assert first.returncode == 3, first.stderr
    return out


def test_batch_answers_are_priced_with_the_batch_discount(priced_server, tmp_path: Path
                                                          ) -> None:
    out = _batch_run(priced_server, tmp_path)
    requests = [json.loads(x) for f in sorted((out / "batch").glob("requests-*.jsonl"))
                for x in f.read_text().splitlines()]
    results = tmp_path / "out.jsonl"
    results.write_text("".join(json.dumps(_answer(r)) + "\n" for r in requests))
    asked = priced_server.counts["judge"]
    run_wim(["judge", str(out), "--no-progress", "--set", "judge.batch=true",
             "--batch-results", str(results)])
    assert priced_server.counts["judge"] == asked  # every verdict from the batch
    judge = _stats(out, "judge")
    assert judge["tokens/judge/batch_in"] == 800 and judge["tokens/judge/batch_out"] == 240
    assert judge["tokens/judge/batch_cached"] == 512 and judge["tokens/judge/reasoning"] == 176
    assert judge["cost/judge"] == pytest.approx(JUDGE_COST * 0.5)  # batch_discount: 0.5
    assert all(j["batch"] is True for j in read_keyed(out / "judgements.jsonl"))


def test_batch_submit_says_what_it_would_cost_before_sending(priced_server, tmp_path: Path
                                                             ) -> None:
    # Nothing listens at the Batch API's URL: the message must come before any call.
    out = _batch_run(priced_server, tmp_path, "judge.http.base_urls=[http://127.0.0.1:9/v1]")
    bodies = [json.loads(x)["body"] for f in sorted((out / "batch").glob("requests-*.jsonl"))
              for x in f.read_text().splitlines()]
    sent = run_wim(["judge", str(out), "--no-progress", "--set", "judge.batch=true",
                    "--batch-submit"], check=False)
    assert sent.returncode == 2 and "the Batch API at" in sent.stderr, sent.stderr
    said = re.search(r"8 judge request\(s\) in 1 file\(s\): about ([\d,]+) prompt tokens "
                     r"\(4 characters a token\), at most ([\d,]+) completion tokens; at "
                     r"judge.http.price \(50% batch discount\) about ([0-9.e-]+) at most",
                     sent.stderr)
    assert said, sent.stderr
    prompt, output = (int(said[i].replace(",", "")) for i in (1, 2))
    assert output == sum(b["max_tokens"] for b in bodies)
    # Prompt characters / 4, every request: close to, never far from, the characters sent.
    chars = sum(len(m["content"]) for b in bodies for m in b["messages"])
    assert chars // 4 <= prompt <= chars // 4 + 8 * len(bodies)
    by_hand = (prompt * 1.25 + output * 10.0) / 1e6 * 0.5  # nothing assumed cached
    assert float(said[3]) == pytest.approx(by_hand, rel=1e-3)


@pytest.mark.parametrize(("override", "message"), [
    ("http.price={input: 1.0, outptu: 2.0}", "unknown key 'http.price.outptu'. Known keys "
     "here: batch_discount, cached_input, input, output"),
    ("http.price={input: 1.0}", "'http.price.output' must be given"),
    ("judge.http.price={input: -1.0, output: 2.0}", "'judge.http.price.input' must be >= 0"),
    ("http.price={input: 1.0, output: 2.0, batch_discount: 50}",
     "'http.price.batch_discount' must lie in [0, 1)"),
    ("http.price={input: 1.0, output: $3}", "'http.price.output' must be of type float"),
    ("scoring.http.price={input: 1.0, output: 2.0}", "'scoring.http.price' must be null"),
    ("blind.http.price={input: 1.0, output: 2.0}", "'blind.http.price' must be null"),
])
def test_a_bad_price_is_a_clear_error(override: str, message: str) -> None:
    base = ["policy.backend=http", "http.base_urls=[http://127.0.0.1:9/v1]",
            "judge.role=external", "judge.backend=http"]
    with pytest.raises(ConfigError) as err:
        load_config(QUICKSTART, [*base, override])
    assert message in str(err.value) and str(QUICKSTART) in str(err.value)


def test_a_bad_price_stops_the_cli_before_anything_runs(tmp_path: Path) -> None:
    proc = run_wim(["generate", str(QUICKSTART), "--out", str(tmp_path / "run"),
                    "--set", "http.price={input: 1.0}"], check=False)
    assert proc.returncode == 2 and "'http.price.output' must be given" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "run" / "samples.jsonl").exists()


def test_a_price_changes_the_reports_fingerprint_only(tmp_path: Path) -> None:
    """Prices set or changed later reprice the report; no stage that computes runs again."""
    base = ["policy.backend=http", "http.base_urls=[http://127.0.0.1:9/v1]",
            "judge.role=external", "judge.backend=http"]
    plain = load_config(QUICKSTART, base)
    priced = load_config(QUICKSTART, [*base, HTTP_PRICE, JUDGE_PRICE])
    cheaper = load_config(QUICKSTART, [*base, HTTP_PRICE, JUDGE_PRICE.replace("10.0", "9.0")])
    run = RunDir(tmp_path / "run")
    for stage in STAGES:
        prints = {input_fingerprint(c, run, stage, None, None) for c in (plain, priced, cheaper)}
        assert len(prints) == (3 if stage.name == "report" else 1), stage.name
    assert "price" not in json.dumps(plain.to_dict())  # a config without prices reads as before


def test_the_commented_price_in_configs_prices_the_http_judge_only(tmp_path: Path) -> None:
    """configs/http_judge.yaml's commented example, uncommented: the http judge is priced, the
    policy (a local model there) is not, whatever `http.price` says."""
    text = (QUICKSTART.parent / "http_judge.yaml").read_text()
    assert "  # price: {" in text
    path = tmp_path / "priced.yaml"
    path.write_text(text.replace("  # price: {", "  price: {"))
    cfg = load_config(path)
    assert role_price(cfg, "judge") == PriceConfig(1.25, 10.0, 0.125, 0.5)
    assert role_price(cfg, "policy") is None
    metrics = {"tokens/policy/in": 10**6, "tokens/policy/out": 10**6, "tokens/judge/in": 1000,
               "tokens/judge/out": 100, "tokens/judge/cached": 400}
    # 600 x 1.25 + 400 x 0.125 + 100 x 10.0 = 1800 per million tokens; no policy cost at all.
    assert run_costs(cfg, metrics) == pytest.approx({"cost/judge": 1800e-6,
                                                     "cost/total": 1800e-6})
