"""`wim merge`: join shard run directories (one config, distinct indices, no key twice) into
one, samples.jsonl and judgements.jsonl written in key order as the shards' files are read.

Every shard of the split must be given unless `--allow-partial`; `wim run CONFIG --out MERGED`
goes on from the merged folder (docs/design.md, "The run directory").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from wim.records import RecordIndex, record_key, write_records_atomic
from wim.rundir import JUDGEMENTS, SAMPLES, RunDir, RunDirError, identity


def merge_runs(dirs: list[Path], out: Path, allow_partial: bool = False) -> dict[str, Any]:
    runs = [RunDir(d) for d in dirs]
    configs = [run.load_config() for run in runs]
    shards = [run.shard() for run in runs]
    first = configs[0]
    for run, cfg in zip(runs[1:], configs[1:], strict=True):
        if identity(cfg) != identity(first):
            raise RunDirError(
                f"{run.path} was built with a different config than {runs[0].path} "
                "(the seed, prompts, policy, generation and judge sections, and the http model "
                "and URLs when used, must agree)."
            )
    missing = _check_shards(dirs, shards)
    if missing and not allow_partial:
        raise RunDirError(
            f"shard(s) {', '.join(missing)} missing: the merge would lack their prompts. Merge "
            "them too, or pass --allow-partial to merge only these. Nothing was written."
        )
    target = RunDir(out)
    if target.read_meta() is not None or target.samples.exists():
        raise RunDirError(f"{out} already exists and holds a run; merge into a new folder.")
    summary: dict[str, Any] = {"shards": [str(s) for s in shards], "missing_shards": missing}
    indexes: dict[str, list[RecordIndex]] = {}
    for name in (SAMPLES, JUDGEMENTS):
        # Offsets only: each shard's file is indexed, then read prompt by prompt while writing.
        indexes[name] = [RecordIndex(run.file(name)) for run in runs]
        owner: dict[str, int] = {}
        for number, (run, index) in enumerate(zip(runs, indexes[name], strict=True)):
            for pid in index.prompt_ids():
                # A prompt's samples may span shards (both are read below), its keys may not.
                holder = owner.setdefault(pid, number)
                both = holder != number and (set(indexes[name][holder].sample_indices(pid))
                                             & set(index.sample_indices(pid)))
                if both:
                    raise RunDirError(
                        f"key {(pid, min(both))} appears in {runs[holder].path / name} "
                        f"and in {run.path / name}; shards must not overlap. Nothing was "
                        "written."
                    )
        summary[name] = sum(len(index) for index in indexes[name])
    target.claim(first, shard=None)
    for name, shard_indexes in indexes.items():
        write_records_atomic(target.file(name), _in_key_order(shard_indexes))
    summary["next"] = f"wim run <config> --out {out}  (or: wim score {out}; wim pairs {out}; ...)"
    return summary


def _in_key_order(indexes: list[RecordIndex]):
    """Every record of the shards' files, in (prompt_id, sample_idx) order, read by offset."""
    for pid in sorted({pid for index in indexes for pid in index.prompt_ids()}):
        records = [r for index in indexes if pid in index for r in index.read([pid])]
        yield from sorted(records, key=record_key)


def _check_shards(dirs: list[Path], shards: list[str | None]) -> list[str]:
    """Check the shards belong to one split; return the shards of that split not given."""
    if any(s is None for s in shards):
        raise RunDirError("every folder to merge must be a shard run (made with --shard i/n).")
    parsed = [tuple(int(x) for x in s.split("/")) for s in shards]  # type: ignore[union-attr]
    counts = {n for _, n in parsed}
    if len(counts) != 1:
        raise RunDirError(f"shards come from different splits: {', '.join(shards)}.")
    indices = [i for i, _ in parsed]
    if len(set(indices)) != len(indices):
        raise RunDirError(f"the same shard appears twice among {', '.join(map(str, dirs))}.")
    n = counts.pop()
    return [f"{i}/{n}" for i in range(n) if i not in indices]
