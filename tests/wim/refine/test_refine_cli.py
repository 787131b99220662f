"""`wim refine` for real on the bundled model (small: 2 prompts, 2 attempts, few tokens)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_wim, sets

SMALL = ["prompts.limit=2", "refine.max_attempts=2", "generation.max_new_tokens=16",
         "judge.max_new_tokens=16", "judge.max_retries=0", "refine.max_retries=1",
         "refine.vrr.m=2", "refine.vrr.k=2", "refine.vrr.delta=1", "blind.max_new_tokens=16",
         "blind.max_retries=1", "refine.pairs_rule=accepted"]


@pytest.mark.slow
def test_refine_writes_auditable_trajectories_and_a_policy_table(tmp_path):
    out = tmp_path / "run"
    proc = run_wim(["refine", "configs/refine.yaml", "--out", str(out), "--no-progress",
                    *sets(SMALL)])
    assert "refine_quality_vs_tokens.png" in proc.stdout
    rows = [json.loads(line) for line in (out / "refine" / "trajectories.jsonl").open()]
    assert len(rows) == 2 * 3  # attempts 0, 1, 2 for each prompt
    for row in rows:
        assert row["tokens"]["generate"] > 0 and row["tokens"]["evaluate"] > 0
        if row["attempt"] == 0:
            assert row["decision"] is None
        else:
            d = row["decision"]
            assert d["rule"] in ("accepted", "evaluation_failed", "veto", "low_gain",
                                 "critical_drop:factuality", "critical_drop:evidence_support")
            assert d["reason"]
            # A failed evaluation has no scores and is never accepted.
            if row["scores"] is None:
                assert not d["accept"] and d["rule"] == "evaluation_failed"
    summary = json.loads((out / "refine" / "summary.json").read_text())
    table = summary["policies"]
    assert {"none", "hard_cap", "dynamic"} <= set(table)
    assert table["hard_cap"]["attempts_mean"] == 2
    for row in table.values():
        assert row["blind_scored"] + row["blind_failed"] == 2
    # The policies' costs come from one trajectory: nothing costs more than the hard cap,
    # except the VRR policies' votes.
    for name, row in table.items():
        if not name.startswith("vrr"):
            assert row["tokens_total"] <= table["hard_cap"]["tokens_total"]
    assert "mechanical" in (out / "refine" / "summary.md").read_text()
    assert (out / "plots" / "refine_quality_vs_tokens.png").stat().st_size > 1000
    _check_decisions(out, rows)
    # pairs_rule "accepted": one pair per prompt whose hard-cap trajectory retained a later
    # attempt; chosen is that retained answer, rejected the first answer (attempt 0).
    by_prompt = {}
    for row in rows:
        by_prompt.setdefault(row["prompt_id"], {})[row["attempt"]] = row
    pairs = [json.loads(line) for line in (out / "refine" / "pairs.jsonl").open()]
    retained = {pid: t[2]["retained_attempt"] for pid, t in by_prompt.items()}
    assert sorted(p["prompt_id"] for p in pairs) == sorted(
        pid for pid, kept in retained.items() if kept != 0)
    for p in pairs:
        attempts = by_prompt[p["prompt_id"]]
        assert p["chosen_attempt"] == retained[p["prompt_id"]]
        assert p["chosen"] == [{"role": "assistant",
                                "content": attempts[p["chosen_attempt"]]["answer"]}]
        assert p["rejected"] == [{"role": "assistant", "content": attempts[0]["answer"]}]


def _check_decisions(out, rows) -> None:
    """Every logged decision, recomputed from the recorded scores, verdicts and flags by the
    pure controller with the run's resolved settings; the retained attempt follows from it."""
    import yaml

    from wim.refine.controller import ControllerParams, Evaluation, decide

    r = yaml.safe_load((out / "refine" / "resolved_config.yaml").read_text())["config"]["refine"]
    params = ControllerParams(gamma=r["gamma"], tau_c=r["tau_c"],
                              critical_guard=r["critical_guard"],
                              penalties={k: dict(v) for k, v in r["penalties"].items()})
    rules = set()
    for pid in {row["prompt_id"] for row in rows}:
        attempts = sorted((row for row in rows if row["prompt_id"] == pid),
                          key=lambda row: row["attempt"])
        evals = [Evaluation(a["scores"], a["verdict"], tuple(a["flags"])) for a in attempts]
        held = 0
        assert attempts[0]["retained_attempt"] == 0
        for t in range(1, len(attempts)):
            d = decide(evals[held], evals[t], params)
            logged = attempts[t]["decision"]
            assert (logged["accept"], logged["rule"]) == (d.accept, d.rule), (pid, t)
            for key in ("gain", "candidate_aggregate", "retained_aggregate"):
                assert logged[key] == pytest.approx(getattr(d, key)), (pid, t, key)
            held = t if d.accept else held
            assert attempts[t]["retained_attempt"] == held
            rules.add(d.rule)
    assert rules  # at least one decision was recomputed


def test_refine_bad_config_names_the_key(tmp_path):
    proc = run_wim(["refine", "configs/refine.yaml", "--out", str(tmp_path / "r"),
                    "--set", "refine.penalties={typo_flag: {factuality: 0.1}}"], check=False)
    assert proc.returncode == 2 and "'refine.penalties'" in proc.stderr
    assert "typo_flag" in proc.stderr and not (tmp_path / "r").exists()
