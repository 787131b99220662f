"""The pairs stage (`wim pairs`): chosen/rejected pairs from scores.jsonl into pairs.jsonl, the
saved dataset folder DIR/pairs/ with its card, the Hub-layout folder DIR/dataset/ (the pairs and
every judgement: data_gen/completions.py) and its push to the Hub when configured."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from data_gen.completions import write_dataset_folder
from data_gen.stages import Shard
from wim.config import Config
from wim.records import RecordIndex, write_records_atomic
from wim.rundir import AGREEMENT, DATASET_FOLDER, PAIRS, PAIRS_CARD, PAIRS_FOLDER, SCORES, RunDir


def run_stage(cfg: Config, run: RunDir, res: Any, shard: Shard | None, progress: bool,
              fingerprint: str) -> dict[str, Any]:
    # `res`: the run's Resources (data_gen/pipeline.py, which imports this module).
    return export_pairs(cfg, run)


def export_pairs(cfg: Config, run: RunDir) -> dict[str, Any]:
    """pairs.jsonl, DIR/pairs/, DIR/dataset/ and DIR/agreement.json, from scores.jsonl read
    prompt by prompt in four streaming passes (pairs, card, completions, agreement)."""
    from data_gen.agreement import source_agreement
    from wim.card import summarize_scores
    from wim.pairs import PairCounts, pair_rows

    start = time.perf_counter()
    scores = RecordIndex(run.scores)
    if not len(scores):
        run.require(SCORES, "wim score")  # the clear error: nothing to pair
    counts = PairCounts()
    write_records_atomic(run.pairs, pair_rows(scores.groups(), cfg.pairs, counts, seed=cfg.seed))
    stats = counts.as_metrics()
    folder, hub_folder = run.file(PAIRS_FOLDER), run.file(DATASET_FOLDER)
    if counts.pairs:
        _save_dataset(run.pairs, folder)
    hub_card = _write_cards(cfg, run, summarize_scores(scores.groups(), cfg), stats)
    if counts.pairs:
        write_dataset_folder(hub_folder, folder, scores.groups(), run.config_file,
                             lambda completions, *files: hub_card(asdict(completions), *files))
        if cfg.export.push_to_hub:
            _push(cfg.export.push_to_hub, hub_folder)
    else:  # no pairs: no folder that would still show an earlier run's
        shutil.rmtree(hub_folder, ignore_errors=True)
    if cfg.generation.source is None:
        run.file(AGREEMENT).unlink(missing_ok=True)
    elif (agreement := source_agreement(cfg, run, scores.groups())) is not None:
        stats["agreement/pairs"] = agreement["pairs"]
        stats["agreement/label_ties"] = agreement["label_ties"]
    stats["time/pairs"] = time.perf_counter() - start
    run.write_stats("pairs", stats)
    return stats


def _write_cards(cfg: Config, run: RunDir, summary, counts: dict[str, Any]
                 ) -> Callable[[dict[str, Any]], str]:
    """DIR/pairs/README.md and DIR/pairs.README.md; returns the card of DIR/dataset/ (the
    Hub's layout, both configs) as a function of the completions config's counts and the
    paths of the two configs' files."""
    from wim.card import render_card
    from wim.sources import source_license

    source, license_ = None, None  # the generate stage's stats name the source's shape, sha256
    if cfg.generation.source is not None:
        if run.stats_file("generate").is_file():
            source = json.loads(run.stats_file("generate").read_text())
        if cfg.card.license is None:
            license_ = source_license(cfg.generation.source, cfg.generation.source_split)
    folder = run.file(PAIRS_FOLDER)
    folder.mkdir(exist_ok=True)  # the card is written even when there is no pair

    def card(files: str, completions: dict[str, Any] | None = None,
             completions_files: str | None = None) -> str:
        return render_card(cfg, summary, counts, files, source, license_, completions,
                           completions_files)

    (folder / "README.md").write_text(card("data-*.arrow"))
    run.file(PAIRS_CARD).write_text(card(PAIRS))
    return lambda completions, pairs_file, completions_file: card(
        pairs_file, completions, completions_file)


def _save_dataset(jsonl: Path, folder: Path) -> None:
    """DIR/pairs/ as `Dataset.save_to_disk` writes it, in memory that does not grow with the
    run: `save_to_disk` copies through a memory map whose pages stay resident
    (docs/benchmarks.md, "The HTTP driver"), so it writes the first row alone (state.json,
    dataset_info.json of the whole split) and the JSON builder's Arrow file takes its place."""
    from datasets import load_dataset

    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=".pairs-build-") as cache:
        dataset = load_dataset("json", data_files=str(jsonl), split="train", cache_dir=cache)
        files = [Path(f["filename"]) for f in dataset.cache_files]
        if len(files) != 1 or not len(dataset):
            dataset.save_to_disk(str(folder))
            return
        dataset.select([0]).save_to_disk(str(folder))
        del dataset
        (data,) = folder.glob("data-00000-of-00001.arrow")
        os.replace(files[0], data)  # the same file system: a rename


def _push(repo: str, folder: Path) -> None:
    """DIR/dataset/ as it is, in one commit: both configs, the card, resolved_config.yaml.
    Data files a previous push left that this one does not write go (another shard count)."""
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo(repo, repo_type="dataset", exist_ok=True)
    api.upload_folder(repo_id=repo, repo_type="dataset", folder_path=str(folder),
                      commit_message="wim pairs: the pairs and every judgement",
                      delete_patterns=["data/*", "completions/*"])
