"""DIR/dataset/: the Hub-layout folder of the pairs stage, with the pairs (`default`) and every
judgement (`completions`), on scores.jsonl written by hand (no model, no training).

The push (`export.push_to_hub`: create_repo, then `HfApi.upload_folder` of this folder) needs
the Hub and is not tested here; what it uploads is the folder these tests load."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import QUICKSTART

from data_gen.completions import ranks, write_completions
from data_gen.pairs import export_pairs
from wim.config import load_config
from wim.records import RecordIndex, write_records_atomic
from wim.rundir import RunDir

ZETA = 0.4


def _record(pid: str, idx: int, rating: int | None, sim: float | None) -> dict:
    parsed = rating is not None
    rn = (rating - 5) / 5 if parsed else None
    return {"prompt_id": pid, "sample_idx": idx, "domain": "d",
            "messages": [{"role": "user", "content": f"q {pid}"}], "prompt": f"q {pid}",
            "response": f"answer {pid}/{idx}", "origin": "", "judge_role": "fixed",
            "judge_model": "some-judge", "critique": f"misses {idx}" if parsed else None,
            "rating": rating, "raw_judge_text": f"raw {pid}/{idx}", "parse_ok": parsed,
            "parse_error": None if parsed else "no rating", "attempts": 1,
            "echoed_attempts": 0, "rating_norm": rn, "similarity": sim if parsed else None,
            "score": (1 - ZETA) * rn + ZETA * sim if parsed else None, "zeta": ZETA,
            "embedder": "bundled:all-minilm-l6-v2"}


def _scores() -> list[dict]:
    """5 prompts: tied ratings, a failed judgement, a prompt with one parsed judgement (no
    pair, still published), and a prompt whose records are not next to each other (a resumed
    run appends the rest later)."""
    return [
        _record("p0", 0, 8, 0.30), _record("p0", 1, 8, 0.10), _record("p0", 2, 3, 0.30),
        _record("p1", 0, 6, 0.20), _record("p1", 1, None, None), _record("p1", 2, 9, 0.50),
        _record("p2", 0, 7, 0.25), _record("p2", 1, None, None),
        _record("p3", 1, 4, 0.05), _record("p4", 0, 2, 0.60), _record("p4", 1, 10, 0.40),
        _record("p3", 0, 5, 0.15),
    ]


def _export(out: Path, scores: list[dict]) -> Path:
    cfg = load_config(QUICKSTART, ["prompts.holdout=0", f"scoring.zeta={ZETA}"])
    run = RunDir(out)
    run.ensure_folder()
    run.save_config(cfg)
    write_records_atomic(run.scores, scores)
    export_pairs(cfg, run)
    return out


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    return _export(tmp_path_factory.mktemp("dataset") / "run", _scores())


@pytest.fixture
def offline(monkeypatch):
    import datasets
    import huggingface_hub

    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(name, "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def test_the_folder_holds_both_configs_the_card_and_the_resolved_config(exported: Path):
    folder = exported / "dataset"
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    assert files[0] == "README.md" and files[3] == "resolved_config.yaml"
    for file, config in ((files[1], "completions"), (files[2], "data")):
        # named by the first 16 hex digits of its content's sha256
        digest = hashlib.sha256((folder / file).read_bytes()).hexdigest()[:16]
        assert file == f"{config}/train-00000-of-00001-{digest}.parquet"
    assert (folder / "resolved_config.yaml").read_bytes() == \
        (exported / "resolved_config.yaml").read_bytes()
    assert not list(exported.glob(".dataset-build*"))


def test_the_default_config_loads_as_the_rows_of_pairs_jsonl(exported: Path, offline):
    import datasets

    pairs = datasets.load_dataset(str(exported / "dataset"), "default", split="train")
    rows = [json.loads(line) for line in (exported / "pairs.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and pairs.to_list() == rows  # p0, p1, p3, p4; p2 has one parsed
    assert pairs.features == datasets.load_from_disk(str(exported / "pairs")).features


def test_two_exported_runs_loaded_one_after_the_other_each_give_their_own_rows(
        exported: Path, tmp_path: Path, offline):
    """`datasets` caches a folder whose card declares `configs:` under the folder's name, the
    config name and a hash of the card's `path:` patterns; two runs' `dataset/` folders with
    the same patterns shared one cache entry, and the second load returned the first's rows."""
    import datasets

    other = _export(tmp_path / "run", _scores()[:3])  # p0 alone: 1 pair, not 4
    for run, prompts in ((exported, ["p0", "p1", "p2", "p3", "p4"]), (other, ["p0"])):
        for config, key in (("default", "prompt"), ("completions", "prompt_id")):
            rows = datasets.load_dataset(str(run / "dataset"), config, split="train")
            if config == "default":
                jsonl = (run / "pairs.jsonl").read_text().splitlines()
                assert rows.to_list() == [json.loads(line) for line in jsonl], run
            else:
                assert rows[key] == prompts, run


def test_completions_hold_every_response_with_the_values_of_scores_jsonl(exported: Path,
                                                                         offline):
    import datasets

    table = datasets.load_dataset(str(exported / "dataset"), "completions", split="train")
    assert table["prompt_id"] == ["p0", "p1", "p2", "p3", "p4"]
    scored = {(r["prompt_id"], r["sample_idx"]): r for r in RecordIndex(
        exported / "scores.jsonl").read(["p0", "p1", "p2", "p3", "p4"])}
    seen = []
    for row in table:
        assert row["prompt"] == [{"role": "user", "content": f"q {row['prompt_id']}"}]
        assert (row["zeta"], row["judge_model"]) == (ZETA, "some-judge")
        assert [c["sample_idx"] for c in row["completions"]] == \
            sorted(c["sample_idx"] for c in row["completions"])
        for c in row["completions"]:
            r = scored[(row["prompt_id"], c["sample_idx"])]
            seen.append((row["prompt_id"], c["sample_idx"]))
            for key in ("response", "critique", "rating", "parse_ok", "parse_error",
                        "raw_judge_text", "rating_norm", "similarity", "score"):
                assert c[key] == r[key], (key, c, r)  # equal, not close: copied
    assert sorted(seen) == sorted(scored)


def test_ranks_follow_the_scores_with_ties_at_the_best_rank_and_failures_unranked(
        exported: Path):
    (file,) = (exported / "dataset" / "completions").glob("train-00000-of-00001-*.parquet")
    table = pq.read_table(file)
    rows = {r["prompt_id"]: r["completions"] for r in table.to_pylist()}
    p0 = rows["p0"]  # ratings 8, 8, 3; similarities 0.3, 0.1, 0.3
    assert [c["rank_numeric"] for c in p0] == [1, 1, 3]
    assert [c["rank_wim"] for c in p0] == [1, 3, 1]
    assert [c["rank_mixed"] for c in p0] == [1, 2, 3]
    p1 = rows["p1"]  # the failed judgement is kept, with nulls and no rank
    assert p1[1]["parse_ok"] is False and p1[1]["critique"] is None
    assert [(c["rank_numeric"], c["rank_wim"], c["rank_mixed"]) for c in p1] == \
        [(2, 2, 2), (None, None, None), (1, 1, 1)]
    for completions in rows.values():  # a better score never ranks below a worse one
        for system, key in (("numeric", "rating_norm"), ("wim", "similarity"),
                            ("mixed", "score")):
            ranked = [(c[key], c[f"rank_{system}"]) for c in completions if c[key] is not None]
            for a, rank_a in ranked:
                assert rank_a == 1 + sum(b > a for b, _ in ranked)


def test_the_card_names_both_configs_and_counts_the_failures(exported: Path):
    from huggingface_hub import DatasetCard

    card = DatasetCard.load(exported / "dataset" / "README.md")
    configs = {c["config_name"]: c["data_files"][0]["path"] for c in card.data.configs}
    assert {name: path.split("-")[0] for name, path in configs.items()} == \
        {"default": "data/train", "completions": "completions/train"}
    for path in configs.values():  # each names its one file: no pattern another run shares
        assert (exported / "dataset" / path).is_file()
    facts = card.data.to_dict()["wim"]["completions"]
    assert facts == {"prompts": 5, "responses": 12, "parse_failed": 2,
                     "unranked": {"numeric": 2, "wim": 2, "mixed": 2}}
    assert "## The `completions` config" in card.text and "`rank_mixed`" in card.text
    # The saved folder's card and pairs.README.md stay the pairs' card alone.
    for other in (exported / "pairs" / "README.md", exported / "pairs.README.md"):
        assert [c["config_name"] for c in DatasetCard.load(other).data.configs] == ["default"]
        assert "completions" not in other.read_text()


def test_completions_are_written_in_row_groups_of_the_batch_size(tmp_path: Path):
    scores = tmp_path / "scores.jsonl"
    write_records_atomic(scores, _scores())
    whole, batched = tmp_path / "whole.parquet", tmp_path / "batched.parquet"
    write_completions(RecordIndex(scores).groups(), whole)
    counts = write_completions(RecordIndex(scores).groups(), batched, rows_per_batch=2)
    assert pq.ParquetFile(batched).metadata.num_row_groups == 3 and counts.prompts == 5
    assert pq.read_table(batched).to_pylist() == pq.read_table(whole).to_pylist()


def test_ranks_are_pandas_min_ranks_descending():
    import pandas as pd

    values = [0.5, None, 0.5, 0.9, -0.1, 0.9]
    expected = pd.Series(values, dtype=float).rank(method="min", ascending=False)
    assert ranks(values) == [None if pd.isna(v) else int(v) for v in expected]


def test_a_run_without_pairs_leaves_no_dataset_folder(exported: Path, tmp_path: Path):
    cfg = load_config(QUICKSTART, ["prompts.holdout=0", f"scoring.zeta={ZETA}"])
    run = RunDir(tmp_path / "run")
    run.ensure_folder()
    run.save_config(cfg)
    (run.path / "dataset").mkdir()  # an earlier run's
    write_records_atomic(run.scores, [_record("p0", 0, 5, 0.1), _record("p0", 1, None, None)])
    assert export_pairs(cfg, run)["pairs/count"] == 0
    assert not (run.path / "dataset").exists()


def test_a_finished_pairs_stage_without_the_folder_runs_again_and_writes_it(exported: Path,
                                                                            tmp_path: Path):
    """A run directory from before DIR/dataset/ existed (or one whose folder was deleted) gets
    it from `wim pairs`; with the folder in place the stage is skipped."""
    import shutil

    from conftest import run_wim

    run = tmp_path / "run"
    shutil.copytree(exported, run)
    run_wim(["pairs", str(run)])  # records the fingerprint of this directory's files
    assert "skipped" in run_wim(["pairs", str(run)]).stderr
    shutil.rmtree(run / "dataset")
    assert "skipped" not in run_wim(["pairs", str(run)]).stderr
    assert len(list((run / "dataset" / "completions").glob("train-00000-of-00001-*.parquet")))
