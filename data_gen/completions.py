"""DIR/dataset/: the pairs and every judgement, in the Hub's layout, for `export.push_to_hub`
(docs/design.md, "Responses from a source, and the dataset card").

It exists so that a user can re-rank or re-score every response; the ranks are the only values
added to scores.jsonl's.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from wim.rundir import CONFIG_FILE

# Each file is renamed to carry its content's hash (`content_named`): `datasets` caches a folder
# whose card declares `configs:` by the folder's name, the config name and the card's `path:`
# patterns, so two runs' `dataset/` folders with the same file names loaded as one.
PAIRS_FILE = "data/train-00000-of-00001.parquet"
COMPLETIONS_FILE = "completions/train-00000-of-00001.parquet"
# (system, the scores.jsonl field it ranks by): the three systems of the report and the card.
RANKED_BY = (("numeric", "rating_norm"), ("wim", "similarity"), ("mixed", "score"))

_MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])
COMPLETION = pa.struct([
    ("sample_idx", pa.int64()), ("response", pa.string()), ("origin", pa.string()),
    ("critique", pa.string()), ("rating", pa.int64()), ("parse_ok", pa.bool_()),
    ("parse_error", pa.string()), ("fallback", pa.string()), ("raw_judge_text", pa.string()),
    ("rating_norm", pa.float64()), ("similarity", pa.float64()), ("score", pa.float64()),
    *((f"rank_{system}", pa.int64()) for system, _ in RANKED_BY),
    ("source_label", pa.string()), ("source_rating", pa.float64()),
])
COMPLETIONS_SCHEMA = pa.schema([
    ("prompt_id", pa.string()), ("domain", pa.string()), ("prompt", pa.list_(_MESSAGE)),
    ("judge_model", pa.string()), ("zeta", pa.float64()), ("embedder", pa.string()),
    ("completions", pa.list_(COMPLETION)),
])


@dataclass
class CompletionCounts:
    """What the completions config holds, for the card (`unranked`: a null value, per system)."""

    prompts: int = 0
    responses: int = 0
    parse_failed: int = 0
    unranked: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        (s for s, _ in RANKED_BY), 0))


def ranks(values: list[float | None]) -> list[int | None]:
    """1 = the highest value; equal values share the best rank of their group and the next
    value skips past them (pandas' `rank(method="min", ascending=False)`); None has no rank."""
    present = [v for v in values if v is not None]
    return [None if v is None else 1 + sum(other > v for other in present) for v in values]


def completions_row(records: list[dict[str, Any]], counts: CompletionCounts) -> dict[str, Any]:
    """One prompt's row: its scored records (by sample_idx) as the `completions` list."""
    first = records[0]
    ranked = {system: ranks([r.get(key) for r in records]) for system, key in RANKED_BY}
    completions = []
    for i, r in enumerate(records):
        completions.append({
            **{f.name: r.get(f.name) for f in COMPLETION},  # copied; the required ones below
            "sample_idx": r["sample_idx"], "response": r["response"], "parse_ok": r["parse_ok"],
            "origin": r.get("origin") or r.get("policy") or "",
            **{f"rank_{system}": ranked[system][i] for system, _ in RANKED_BY},
        })
        counts.responses += 1
        counts.parse_failed += not r["parse_ok"]
        for system, _ in RANKED_BY:
            counts.unranked[system] += ranked[system][i] is None
    counts.prompts += 1
    return {"prompt_id": str(first["prompt_id"]), "domain": first.get("domain", ""),
            "prompt": first.get("messages"), "judge_model": first.get("judge_model"),
            "zeta": first.get("zeta"), "embedder": first.get("embedder"),
            "completions": completions}


def write_completions(groups: Iterable[list[dict[str, Any]]], path: Path,
                      rows_per_batch: int = 1_000) -> CompletionCounts:
    """The completions parquet file, `rows_per_batch` prompts per row group."""
    counts = CompletionCounts()
    path.parent.mkdir(parents=True, exist_ok=True)
    with pq.ParquetWriter(path, COMPLETIONS_SCHEMA) as writer:
        rows: list[dict[str, Any]] = []
        for records in groups:
            rows.append(completions_row(records, counts))
            if len(rows) == rows_per_batch:
                writer.write_table(pa.Table.from_pylist(rows, schema=COMPLETIONS_SCHEMA))
                rows = []
        if rows or not counts.prompts:
            writer.write_table(pa.Table.from_pylist(rows, schema=COMPLETIONS_SCHEMA))
    return counts


def write_pairs_parquet(saved: Path, path: Path) -> None:
    """The pairs parquet file from DIR/pairs/'s Arrow files, one record batch at a time, read
    from the file rather than a memory map so that the pages read do not stay resident."""
    files = sorted(saved.glob("data-*.arrow"))
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = None
    try:
        for file in files:
            with pa.OSFile(str(file)) as source:
                reader = pa.ipc.open_stream(source)
                writer = writer or pq.ParquetWriter(path, reader.schema)
                for batch in reader:
                    writer.write_batch(batch)
    finally:
        if writer is not None:
            writer.close()


def content_named(path: Path) -> Path:
    """`path` renamed to end in the first 16 hex digits of its sha256, before the suffix (the
    Hub's own `train-00000-of-00001-<hash>.parquet` naming): two files share a name only when
    they share their bytes, so no other run's export can stand in for this one in a cache."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return path.rename(path.with_stem(f"{path.stem}-{digest.hexdigest()[:16]}"))


def write_dataset_folder(folder: Path, saved_pairs: Path, groups: Iterable[list[dict[str, Any]]],
                         config_file: Path, card: Callable[[CompletionCounts, str, str], str]
                         ) -> CompletionCounts:
    """DIR/dataset/: both parquet files (`content_named`), README.md (`card` of the counts and
    the two files' paths in the folder) and resolved_config.yaml, built beside it, then
    renamed: a stopped stage leaves the old one."""
    build = folder.with_name(f".{folder.name}-build")
    shutil.rmtree(build, ignore_errors=True)
    write_pairs_parquet(saved_pairs, build / PAIRS_FILE)
    counts = write_completions(groups, build / COMPLETIONS_FILE)
    pairs, completions = (content_named(build / f).relative_to(build).as_posix()
                          for f in (PAIRS_FILE, COMPLETIONS_FILE))
    shutil.copyfile(config_file, build / CONFIG_FILE)
    (build / "README.md").write_text(card(counts, pairs, completions))
    shutil.rmtree(folder, ignore_errors=True)
    build.rename(folder)
    return counts
