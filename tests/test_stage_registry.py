"""The stages are listed once, in wim/stages.py: a stage added to that table (and a module with
`run_stage`) is a command with its help, runs through the pipeline, has a fingerprint over the
sections and files the table names, and its stats reach the report. No other list to edit."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from conftest import QUICKSTART, run_wim
from test_dataset_export import _scores

from data_gen.fingerprints import input_fingerprint
from wim import stages
from wim.config import load_config
from wim.records import write_records_atomic
from wim.rundir import RunDir

FAKE_MODULE = textwrap.dedent('''
    """A stage for tests/test_stage_registry.py: writes fake.txt from pairs.jsonl."""
    import time


    def run_stage(cfg, run, res, shard, progress, fingerprint):
        lines = run.file("pairs.jsonl").read_text().count("\\n")
        run.file("fake.txt").write_text(f"{lines} pairs, lora.r={cfg.lora.r}\\n")
        stats = {"fake/pairs_seen": lines, "time/fake": time.perf_counter() * 0}
        run.write_stats("fake", {**stats, "fingerprint": {}})
        return stats
''')


@pytest.fixture
def fake_stage(tmp_path: Path, monkeypatch) -> stages.Stage:
    (tmp_path / "wim_fake_stage.py").write_text(FAKE_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    fake = stages.Stage("fake", "wim_fake_stage", "count the pairs into fake.txt (a test stage)",
                        sections=("lora",), inputs=("pairs.jsonl",), outputs=("fake.txt",))
    # Before the report, as a new stage would go.
    monkeypatch.setattr(stages, "STAGES", (*stages.STAGES[:-1], fake, stages.STAGES[-1]))
    return fake


def test_a_stage_added_to_the_table_is_a_command_with_its_help(fake_stage):
    helped = " ".join(run_wim(["--help"]).stdout.split())
    assert "count the pairs into fake.txt (a test stage)" in helped
    assert "run every stage: generate, judge, score, pairs, train, eval, fake, report" in helped


def test_a_stage_added_to_the_table_runs_is_fingerprinted_and_reported(fake_stage,
                                                                       tmp_path: Path):
    run_path = tmp_path / "run"
    cfg = load_config(QUICKSTART, ["prompts.holdout=0"])
    run = RunDir(run_path)
    run.ensure_folder()
    run.save_config(cfg)
    write_records_atomic(run.scores, _scores())
    run_wim(["pairs", str(run_path), "--no-progress"])

    done = run_wim(["fake", str(run_path), "--no-progress"])  # through the real CLI
    assert (run_path / "fake.txt").read_text() == "4 pairs, lora.r=8\n", done.stderr
    assert "skipped" in run_wim(["fake", str(run_path), "--no-progress"]).stderr
    # Its fingerprint covers the section and the input file the table names, nothing else.
    fake = stages.stage_named("fake")  # found in the table, as the pipeline finds it
    before = input_fingerprint(cfg, run, fake, None, None)
    other = load_config(QUICKSTART, ["prompts.holdout=0", "lora.r=4"])
    assert input_fingerprint(other, run, fake, None, None) != before
    unrelated = load_config(QUICKSTART, ["prompts.holdout=0", "dpo.beta=0.3"])  # train's
    assert input_fingerprint(unrelated, run, fake, None, None) == before
    with (run_path / "pairs.jsonl").open("a") as f:
        f.write("\n")
    assert input_fingerprint(cfg, run, fake, None, None) != before

    run_wim(["report", str(run_path), "--no-progress"])
    report = json.loads((run_path / "report.json").read_text())
    assert report["fake/pairs_seen"] == 4
    assert "stats/fake.json" in stages.stage_inputs(stages.stage_named("report"))
