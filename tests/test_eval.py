"""`wim eval`: held-out prompts that training never saw, and a blind evaluator that receives
nothing but the question and the answers. Real CLI, real runs; the evaluator in the end-to-end
test is a real local HTTP server that records every request (its verdicts are not a model's)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import QUICKSTART, SHRUNK, http_overrides, run_wim, sets
from recording_server import RecordingServer

from wim.blind import build_pair_messages, build_point_messages
from wim.errors import InputError
from wim.holdout import split_prompts
from wim.prompts import load_prompts
from wim.records import read_keyed

# --- the split -------------------------------------------------------------------------------


def test_holdout_is_stable_spread_over_domains_and_chosen_before_the_limit():
    prompts = load_prompts("bundled")
    train, held = split_prompts(prompts, 8)
    assert len(held) == 8 and len(train) == 56
    assert len({p.domain for p in held}) == 8  # one per domain: the domains take turns
    assert not {p.id for p in held} & {p.id for p in train}
    # The same prompts whatever the order they come in (a hash of the id, no seed).
    again = split_prompts(list(reversed(prompts)), 8)[1]
    assert sorted(p.id for p in again) == sorted(p.id for p in held)
    assert split_prompts(prompts, 0) == (prompts, [])


def test_holdout_must_leave_prompts_to_train_on():
    with pytest.raises(InputError, match="only 64 prompts"):
        split_prompts(load_prompts("bundled"), 64)


PROMPTS = [{"id": f"p{i}", "domain": "ab"[i % 2], "prompt": f"Question number {i}?"}
           for i in range(6)]


def _prompts_file(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return path


def test_generation_leaves_the_held_out_prompts_out(flaky_server, tmp_path: Path):
    out = tmp_path / "run"
    run_wim(["generate", str(QUICKSTART), "--out", str(out), "--no-progress",
             *sets([*http_overrides(flaky_server.url), f"prompts.source={_prompts_file(tmp_path)}",
                    "prompts.holdout=2", "prompts.limit=3"])])
    split = json.loads((out / "split.json").read_text())
    assert len(split["holdout"]) == 2 and len(split["train"]) == 3
    sampled = {r["prompt_id"] for r in read_keyed(out / "samples.jsonl")}
    assert sampled == set(split["train"])
    assert not sampled & set(split["holdout"])


def test_eval_without_held_out_prompts_says_what_to_do(flaky_server, tmp_path: Path):
    out = tmp_path / "run"
    run_wim(["run", str(QUICKSTART), "--out", str(out), "--skip-train", "--no-progress",
             *sets([*http_overrides(flaky_server.url),
                    f"prompts.source={_prompts_file(tmp_path)}"])])
    proc = run_wim(["eval", str(out)], check=False)
    assert proc.returncode == 2
    assert "no held-out prompts" in proc.stderr and "prompts.holdout=16" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_multi_round_run_is_evaluated_with_its_last_adapter(tmp_path: Path):
    from training.evaluate import check_unseen
    from wim.rundir import RunDir, RunDirError

    run = RunDir(tmp_path / "run")
    (run.path / "rounds" / "11").mkdir(parents=True)  # the last round has not trained yet
    with pytest.raises(RunDirError, match=r"rounds/11/train/adapter/adapter_config.json is "
                       r"missing\). Train first: `wim run CONFIG --out"):
        run.final_adapter()
    (run.path / "rounds" / "11").rmdir()
    for r in (1, 2, 10):
        adapter = run.path / "rounds" / str(r) / "train" / "adapter"
        adapter.mkdir(parents=True)
        (adapter / "adapter_config.json").write_text("{}")
    assert run.final_adapter() == run.path / "rounds" / "10" / "train" / "adapter"
    prompt = load_prompts("bundled")[0]
    (run.path / "rounds" / "2" / "samples.jsonl").write_text(json.dumps(
        {"prompt_id": prompt.id, "sample_idx": 0, "prompt": prompt.text}) + "\n")
    with pytest.raises(InputError, match="rounds/2/samples.jsonl"):
        check_unseen([prompt], run)
    check_unseen(load_prompts("bundled")[1:3], run)


# --- end to end ------------------------------------------------------------------------------


def _answers(user: str) -> tuple[str, str]:
    m = re.search(r"Answer A:\n(.*)\n\nAnswer B:\n(.*)\Z", user, re.S)
    return m.group(1), m.group(2)


def _longer_wins(messages: list[dict]) -> str:
    """Not a model: names the longer answer, "tie" when both are equally long; pointwise, a
    score that grows with the length."""
    if "Answer A:" not in messages[-1]["content"]:
        return f"Reason: length.\nScore: {min(10, 1 + len(messages[-1]['content']) // 60)}"
    a, b = _answers(messages[-1]["content"])
    verdict = "A" if len(a) > len(b) else "B" if len(b) > len(a) else "tie"
    return f"Reason: length.\nVerdict: {verdict}"


def check_eval_json(report: dict, n_prompts: int) -> None:
    """The issue's checks on every comparison of an eval.json, against scipy and statsmodels."""
    from scipy.stats import binomtest
    from statsmodels.stats.multitest import multipletests

    comparisons = report["comparisons"]
    assert report["held_out_prompts"] == n_prompts
    assert report["min_attainable_p_holm"] == pytest.approx(
        min(1.0, len(comparisons) * binomtest(n_prompts, n_prompts).pvalue))
    assert report["power_statement"] and comparisons[0]["primary"]
    holm = multipletests([c["p_value"] for c in comparisons], method="holm")[1]
    for c, p_holm in zip(comparisons, holm, strict=True):
        w, lo = c["wins"], c["losses"]
        if w + lo:
            test = binomtest(w, w + lo)
            assert c["p_value"] == pytest.approx(test.pvalue)
            ci = test.proportion_ci(method="exact")
            assert c["decisive_95"] == pytest.approx([ci.low, ci.high])
            assert (c["p_value"] < 0.05) == (not ci.low <= 0.5 <= ci.high)
        else:
            assert c["p_value"] == 1.0 and c["decisive_95"] is None
        assert c["p_holm"] == pytest.approx(p_holm)
        assert c["order_agreement"] is None or 0.0 <= c["order_agreement"] <= 1.0
        assert "wilson_95" not in c
        assert sum(c["ties_split"].values()) == c["ties"] if c["ties_split"] else c["ties"] == 0


@pytest.mark.slow
def test_eval_end_to_end_sends_the_evaluator_only_questions_and_answers(tmp_path: Path):
    out = tmp_path / "run"
    run_wim(["run", str(QUICKSTART), "--out", str(out), "--no-progress",
             *sets([*SHRUNK, "prompts.holdout=3", "dpo.learning_rate=1e-2",
                    "eval.max_new_tokens=24", "blind.max_new_tokens=24"])])
    # `wim run` evaluated the trained policy against its base (the eval stage) and the report
    # starts with it: the "done when", on the bundled evaluator.
    check_eval_json(json.loads((out / "eval.json").read_text()), 3)
    md = (out / "report.md").read_text()
    assert md.index("Blind evaluation") < md.index("Numeric vs WIM vs mixed")
    assert "Mechanical numbers" in md and "**Power.**" in md
    assert "Primary comparison (pre-specified): policy vs base" in md
    assert "Power." in (out / "report.html").read_text()
    verdicts = [json.loads(line) for line in (out / "eval" / "verdicts.jsonl").open()]
    assert len(verdicts) == 3 and all("order_ab" in v and "order_ba" in v for v in verdicts)
    again = run_wim(["run", str(QUICKSTART), "--out", str(out), "--no-progress",
                     *sets([*SHRUNK, "prompts.holdout=3", "dpo.learning_rate=1e-2",
                            "eval.max_new_tokens=24", "blind.max_new_tokens=24"])])
    assert "eval" in again.stderr.split("skipped")[-1]  # unchanged: not evaluated again
    server = RecordingServer(_longer_wins)
    try:
        proc = run_wim(["eval", str(out), "--against", str(out), "--no-progress",
                        *sets(["blind.backend=http", f"blind.http.base_urls=[{server.url}]",
                               "blind.http.model=recorded", "eval.max_new_tokens=24"])])
    finally:
        server.close()
    assert "mechanical" in proc.stdout  # the bundled policy wrote the answers
    report = json.loads((out / "eval.json").read_text())
    assert report["evaluator"] == {"model": "recorded", "mode": "pairwise", "verdict": "weighted",
                                   "backend": "http",
                                   "max_retries": 2, "dtype": None}  # a server: not ours
    assert "not evidence for or against WIM" in report["mechanical_warning"]
    names = [c["name"] for c in report["comparisons"]]
    assert names == ["policy vs base", f"policy vs policy of {out.name}"]
    for c in report["comparisons"]:
        assert c["n"] == 3 and c["failures"] == 0 and c["wins"] + c["losses"] + c["ties"] == 3
        if c["bootstrap_95"]:
            assert c["bootstrap_95"][0] <= c["win_rate"] <= c["bootstrap_95"][1]
        assert 0 <= c["p_value"] <= c["p_holm"] <= 1
    check_eval_json(report, 3)
    # The same policy against itself: identical answers, so only ties, and no interval.
    same = report["comparisons"][1]
    assert same["ties"] == 3 and same["ties_split"]["identical"] == 3
    assert same["bootstrap_95"] is None and "equal" in same["bootstrap_note"]

    split = json.loads((out / "split.json").read_text())
    held = {p.id: p for p in load_prompts("bundled") if p.id in split["holdout"]}
    assert len(held) == 3
    assert not {r["prompt_id"] for r in read_keyed(out / "samples.jsonl")} & set(held)
    answers = [json.loads(line) for line in (out / "eval" / "answers.jsonl").open()]
    assert {a["prompt_id"] for a in answers} == set(held)
    by_prompt: dict[str, set[str]] = {}
    for a in answers:
        by_prompt.setdefault(a["prompt_id"], set()).add(a["response"])
    allowed = set()
    for pid, texts in by_prompt.items():
        for x in texts:
            for y in texts:
                allowed.add(json.dumps(build_pair_messages(held[pid].text, x, y)))
    # Each request is exactly the template, a question and two answers: 2 orders for each prompt
    # whose answers differ (the policy against itself never differs, so it costs no call).
    differing = sum(len(texts) > 1 for texts in by_prompt.values())
    # The large learning rate moved the policy away from its base. (24 answer tokens: in 12,
    # two steps on 4 pairs left all 3 greedy answers equal to the base's in one run.)
    assert differing > 0
    assert len(server.bodies) == 2 * differing
    secrets = [str(out), "zeta", "Missing:", "Rating:", "bundled:", "resolved_config",
               *{j["critique"] for j in read_keyed(out / "judgements.jsonl")
                 if j.get("critique") and len(j["critique"]) > 12}]
    for body in server.bodies:
        assert json.dumps(body["messages"]) in allowed
        text = json.dumps(body["messages"])
        assert not [s for s in secrets if s in text]
    assert (out / "eval.md").read_text().count("mechanical") == 1

    # Pointwise: each answer alone, once per system and prompt.
    server = RecordingServer(_longer_wins)
    try:
        run_wim(["eval", str(out), "--no-progress",
                 *sets(["blind.backend=http", f"blind.http.base_urls=[{server.url}]",
                        "blind.http.model=recorded", "eval.max_new_tokens=24",
                        "blind.mode=pointwise"])])
    finally:
        server.close()
    report = json.loads((out / "eval.json").read_text())
    assert report["evaluator"]["mode"] == "pointwise"
    c = report["comparisons"][0]
    assert c["n"] == 3 and c["failures"] == 0 and c["wins"] + c["losses"] + c["ties"] == 3
    allowed = {json.dumps(build_point_messages(held[a["prompt_id"]].text, a["response"]))
               for a in answers}
    assert len(server.bodies) == 2 * 3  # policy and base, 3 prompts
    assert all(json.dumps(body["messages"]) in allowed for body in server.bodies)

    # A hosted reasoning API as the evaluator: it refuses max_tokens, top_p, temperature and
    # logprobs (tests/reasoning_servers.py). `wim eval` finishes with hard verdicts, so marked.
    from reasoning_servers import HostedReasoningAPI

    server = HostedReasoningAPI()
    try:
        proc = run_wim(["eval", str(out), "--no-progress",
                        *sets(["blind.backend=http", f"blind.http.base_urls=[{server.url}]",
                               "blind.http.model=reasoner", "eval.max_new_tokens=24",
                               "blind.max_new_tokens=4096"])])
    finally:
        server.close()
    report = json.loads((out / "eval.json").read_text())
    note = "hard verdicts: the evaluator gives no token probabilities"
    assert report["evaluator"]["verdict"] == "hard" and report["evaluator"]["verdict_note"] == note
    assert note in proc.stdout and note in (out / "eval.md").read_text()
    assert report["comparisons"][0]["failures"] == 0 and server.refused["logprobs"] >= 1
    verdicts = [json.loads(line) for line in (out / "eval" / "verdicts.jsonl").open()]
    assert all(v["probs_ab"] is None and v["probs_ba"] is None for v in verdicts)
