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
                    *sets(SMALL)], timeout=1800)
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
    pairs = [json.loads(line) for line in (out / "refine" / "pairs.jsonl").open()]
    changed = sum(1 for r in rows if r["attempt"] == 2 and r["retained_attempt"] != 0)
    assert len(pairs) == changed
    for p in pairs:
        assert set(p) >= {"prompt", "chosen", "rejected"} and p["chosen"] != p["rejected"]


def test_refine_bad_config_names_the_key(tmp_path):
    proc = run_wim(["refine", "configs/refine.yaml", "--out", str(tmp_path / "r"),
                    "--set", "refine.penalties={typo_flag: {factuality: 0.1}}"], check=False)
    assert proc.returncode == 2 and "'refine.penalties'" in proc.stderr
    assert "typo_flag" in proc.stderr and not (tmp_path / "r").exists()
