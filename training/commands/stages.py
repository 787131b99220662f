"""`wim run`, the single stages (generate, judge, score, pairs, train, report), `wim merge` and
`wim export`: a run directory's commands."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from wim.config import ConfigError, apply_overrides, config_from_dict, read_yaml
from wim.errors import StageIncomplete
from wim.rundir import RunDir


def stage_command(args: argparse.Namespace) -> int:
    """`wim run` or one stage (`wim judge CONFIG|DIR`, ...): the data stages are data_gen's,
    `run` and `train` training's."""
    from data_gen.pipeline import DATA_STAGES, Resources, run_stages
    from data_gen.stages import Shard

    cfg, out = resolve(args)
    _check_rounds_command(cfg, args, out)
    if _distributed() and args.command == "train":
        return _train_distributed(cfg, out, args)
    if args.shard is None and Path(args.source).is_dir():
        args.shard = RunDir(out).shard() if out == Path(args.source) else None
    shard = Shard.parse(args.shard)
    if args.command == "run":
        from training.rounds import run_rounds
        from training.run import STAGES

        runner = run_rounds
        # --skip-train stops after the pairs: nothing trained, so nothing to evaluate either.
        stages = tuple(s for s in STAGES if not (args.skip_train and s in ("train", "eval")))
    elif args.command in DATA_STAGES:
        runner, stages = run_stages, (args.command,)
    else:
        from training.run import run_stages_with_training

        runner, stages = run_stages_with_training, (args.command,)
    resources = Resources(cfg)
    if {"generate", "judge"} & set(stages):
        resources.check_inputs()  # a bad prompts file fails before the run directory is touched
    run = RunDir(out)
    with run.lock():
        run.claim(cfg, str(shard) if shard else None)
        try:
            result = runner(cfg, run, stages, shard=shard, progress=not args.no_progress,
                            resources=resources)
        except StageIncomplete as err:  # the stats so far, then exit 3 (training.commands)
            run.save_config(cfg, str(shard) if shard else None)
            print(json.dumps({k: v for k, v in err.stats.items() if not isinstance(v, dict)},
                             indent=2))
            raise
        run.save_config(cfg, str(shard) if shard else None)
    _print_result(result, stages, out)
    return 0


def merge_command(args: argparse.Namespace) -> int:
    """`wim merge SHARD... --out DIR`: join shard run directories into one."""
    from data_gen.merge import merge_runs

    with RunDir(Path(args.out)).lock():
        summary = merge_runs([Path(d) for d in args.dirs], Path(args.out),
                             allow_partial=args.allow_partial)
    print(json.dumps(summary, indent=2))
    return 0


def export_command(args: argparse.Namespace) -> int:
    """`wim export DIR --merged OUT`: the policy with the trained adapter merged in."""
    from training.export import export_merged

    print(json.dumps(export_merged(Path(args.dir), Path(args.merged)), indent=2))
    return 0


def resolve(args: argparse.Namespace):
    """(config, run directory path) from a YAML file or an existing run directory."""
    from wim.rundir import RunDir

    source = Path(args.source)
    if source.is_dir():
        meta = RunDir(source).read_meta()
        if meta is None:
            raise ConfigError(f"{source} is a folder but holds no run (no resolved_config.yaml).")
        data, origin = meta["config"], f"{source / 'resolved_config.yaml'}"
        out = Path(args.out) if args.out else source
    else:
        data, origin = read_yaml(source), str(source)
        if not args.out:
            raise ConfigError(f"give the run directory with --out (for example --out runs/"
                              f"{source.stem}).")
        out = Path(args.out)
    cfg = config_from_dict(apply_overrides(data, args.overrides), source=origin)
    return cfg, out


def _check_rounds_command(cfg, args, out: Path) -> None:
    """Runs with several rounds (or online training) are driven by `wim run`; a single stage
    works on one round's folder, DIR/rounds/<r>. Under `accelerate launch` only `wim train`, and
    only offline: online DPO samples, judges and writes the run's files as it trains, in one
    process (training/online.py), so under a launcher every rank would write every file."""
    if _distributed() and cfg.training.mode == "online":
        raise ConfigError("online DPO (training.mode: online) runs in one process, not under "
                          "accelerate launch: it samples, judges and writes the run's files as "
                          "it trains, and data-parallel ranks would each write them all. Run "
                          f"`wim run CONFIG --out {out}` without the launcher (it trains on one "
                          "GPU), or set training.mode: offline to train data-parallel on pairs.")
    if _distributed() and args.command != "train":
        raise ConfigError(f"under accelerate launch only `wim train` runs (got `wim "
                          f"{args.command}`); build the pairs first with `wim run CONFIG --out "
                          "DIR --skip-train` in one process, then `accelerate launch -m wim train "
                          "DIR`.")
    several = cfg.training.rounds > 1 and not (out / "round.json").is_file()
    if args.command != "run" and (several or cfg.training.mode == "online"):
        raise ConfigError(f"`wim {args.command}` runs one stage of one round; this run has "
                          f"training.rounds={cfg.training.rounds}, mode {cfg.training.mode}. Use "
                          f"`wim run` for the whole run, or point at a round's folder "
                          f"({out / 'rounds' / '1'}).")


def _distributed() -> bool:
    import os

    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def _train_distributed(cfg, out: Path, args) -> int:
    """`accelerate launch -m wim train DIR`: every process trains its share (data-parallel);
    the main process alone holds the run's lock and writes the stats and the adapter."""
    import contextlib

    from data_gen.fingerprints import input_fingerprint, record_finished
    from training.placement import process_state
    from training.run import train_run
    from wim.rundir import RunDir

    run = RunDir(out)
    state = process_state()
    lock = (run.lock() if state.is_main_process
            else contextlib.nullcontext())
    with lock:
        key = input_fingerprint(cfg, run, "train", None, None)
        metrics = train_run(cfg, run, progress=not args.no_progress and state.is_main_process,
                            resume_key=key)
        state.wait_for_everyone()
        if state.is_main_process:
            record_finished(run, "train", key)
            print(json.dumps({k: v for k, v in metrics.items() if not isinstance(v, dict)},
                             indent=2))
    return 0


def _print_result(result: dict, stages: tuple[str, ...], out: Path) -> None:
    if result.get("run/skipped_stages"):
        print(f"wim: skipped (config and inputs unchanged since they finished): "
              f"{', '.join(result['run/skipped_stages'])}", file=sys.stderr)
    if "report" in stages:
        verb = "unchanged:" if "report" in result.get("run/skipped_stages", []) else "wrote"
        print(f"{verb} {out / 'report.md'} and {out / 'report.json'}")
        keys = ("pairs/count", "pairs/tie_rate/numeric", "pairs/tie_rate/wim",
                "judge/parse_fail_rate", "judge/echoed_rubric", "judge/backend_failed",
                "train/loss_first",
                "train/loss_last")
        print(json.dumps({k: result.get(k) for k in keys}, indent=2))
    else:
        print(json.dumps({k: v for k, v in result.items() if not isinstance(v, dict)}, indent=2))
