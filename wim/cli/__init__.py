"""The `wim` command: the entry point and the command layer, at the top of the layers
(wim <- data_gen <- training), so it alone may call every package (docs/design.md, "Layout").

Each command is one function of `COMMANDS` (the stages are wim/stages.py's). What every command
shares is written once: the lock on the folder it writes (`RunDir.lock()`, named after the
command line) and the exit codes (`main`). Heavy imports happen inside the commands, so
`wim --help` stays fast.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from wim.cli import evaluation, refinement
from wim.cli.parser import build_parser, stage_commands
from wim.config import ConfigError, load_config
from wim.errors import StageIncomplete, WimError
from wim.rundir import REPORT, REPORT_MD, ROUND_MARKER, ROUNDS_FOLDER, RunDir


def _set_up_logging(verbose: bool) -> None:
    """Warnings and our INFO lines; with --verbose our DEBUG lines too, one per HTTP request
    among them. Other libraries' DEBUG lines stay off either way."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for name in ("wim", "data_gen", "training", "aiohttp"):  # ours and the HTTP library
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else logging.NOTSET)
    for name in ("httpx", "httpx2"):  # the openai SDK's transport: a line per call at INFO
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    """Run a command; its exit code: 2 for the user's to fix (one paragraph), 3 for work that
    lost records to a backend, 130 for Ctrl-C. Anything else keeps its traceback."""
    args = build_parser().parse_args(argv)
    _set_up_logging(args.verbose)
    name = f"vrr {args.vrr_command}" if args.command == "vrr" else args.command
    try:
        return command(name)(args)
    except KeyboardInterrupt:
        print("wim: interrupted; finished records are kept, run the same command to resume.",
              file=sys.stderr)
        return 130
    except StageIncomplete as err:
        # Exit 3, not 2: nothing is wrong with the input; the same command will finish it.
        print(f"wim: incomplete: {err}", file=sys.stderr)
        return 3
    except WimError as err:
        print(f"wim: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        from wim.records import STORAGE_ERRNOS, storage_error

        # A write the file system refused (disk full, permissions, ...), wherever it came from
        # (our writers wrap theirs; this catches the libraries': datasets, the trainer, plots).
        if err.errno not in STORAGE_ERRNOS:
            raise
        print(f"wim: error: {storage_error(err, err.filename or getattr(args, 'out', None))}",
              file=sys.stderr)
        return 2


def stage_command(args: argparse.Namespace) -> int:
    """`wim run` (training/rounds.py: one round, several, or online DPO) or one stage (`wim
    judge CONFIG|DIR`, ...: data_gen/pipeline.py's `run_stages`, the stages of wim/stages.py)."""
    from data_gen.pipeline import Resources, run_stages
    from data_gen.stages import Shard
    from wim.stages import STAGES

    cfg, out = config_and_run_dir(args)
    _check_rounds_command(cfg, args, out)
    if _distributed() and args.command == "train":
        return _train_distributed(cfg, out, args)
    if args.shard is None and Path(args.source).is_dir():
        args.shard = RunDir(out).shard() if out == Path(args.source) else None
    shard = Shard.parse(args.shard)
    if args.command == "run":
        from training.rounds import run_rounds

        runner = run_rounds
        # --skip-train stops after the pairs: nothing trained, so nothing to evaluate either.
        stages = tuple(s.name for s in STAGES if not (args.skip_train and s.trains))
    else:
        runner, stages = run_stages, (args.command,)
    resources = Resources(cfg)
    # Read by the judge stage (data_gen/judge_batch.py).
    resources.batch_results = getattr(args, "batch_results", None)
    resources.batch_submit = getattr(args, "batch_submit", False)
    if any(s.reads_prompts for s in STAGES if s.name in stages):
        resources.check_inputs()  # a bad prompts file fails before the run directory is touched
    run = RunDir(out)
    with run.lock():
        run.claim(cfg, str(shard) if shard else None)
        try:
            result = runner(cfg, run, stages, shard=shard, progress=not args.no_progress,
                            resources=resources)
        except StageIncomplete as err:  # the stats so far, then exit 3 (main)
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


def config_and_run_dir(args: argparse.Namespace):
    """(config, run directory path) from a YAML file or an existing run directory."""
    source = Path(args.source)
    if source.is_dir():
        return RunDir(source).load_config(args.overrides), Path(args.out) if args.out else source
    if not args.out:
        raise ConfigError(f"give the run directory with --out (for example --out runs/"
                          f"{source.stem}).")
    return load_config(source, args.overrides), Path(args.out)


def _check_rounds_command(cfg, args, out: Path) -> None:
    """Several rounds and online DPO run under `wim run` (a single stage: one round's folder,
    DIR/rounds/<r>); under `accelerate launch` only an offline `wim train` runs."""
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
    several = cfg.training.rounds > 1 and not RunDir(out).file(ROUND_MARKER).is_file()
    if args.command != "run" and (several or cfg.training.mode == "online"):
        raise ConfigError(f"`wim {args.command}` runs one stage of one round; this run has "
                          f"training.rounds={cfg.training.rounds}, mode {cfg.training.mode}. Use "
                          f"`wim run` for the whole run, or point at a round's folder "
                          f"({out / ROUNDS_FOLDER / '1'}).")


def _distributed() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def _train_distributed(cfg, out: Path, args) -> int:
    """`accelerate launch -m wim train DIR`: every process trains its share (data-parallel);
    the main process alone holds the run's lock and writes the stats and the adapter."""
    import contextlib

    from data_gen.fingerprints import input_fingerprint, record_finished
    from training.placement import process_state
    from training.train import train_run
    from wim.stages import stage_named

    run, train = RunDir(out), stage_named("train")
    state = process_state()
    with run.lock() if state.is_main_process else contextlib.nullcontext():
        key = input_fingerprint(cfg, run, train, None, None)
        metrics = train_run(cfg, run, progress=not args.no_progress and state.is_main_process,
                            resume_key=key)
        state.wait_for_everyone()
        if state.is_main_process:
            record_finished(run, train, key)
            print(json.dumps({k: v for k, v in metrics.items() if not isinstance(v, dict)},
                             indent=2))
    return 0


def _print_result(result: dict, stages: tuple[str, ...], out: Path) -> None:
    if result.get("run/skipped_stages"):
        print(f"wim: skipped (config and inputs unchanged since they finished): "
              f"{', '.join(result['run/skipped_stages'])}", file=sys.stderr)
    if "report" in stages:
        verb = "unchanged:" if "report" in result.get("run/skipped_stages", []) else "wrote"
        print(f"{verb} {out / REPORT_MD} and {out / REPORT}")
        keys = ("pairs/count", "pairs/tie_rate/numeric", "pairs/tie_rate/wim",
                "judge/parse_fail_rate", "judge/echoed_rubric", "judge/backend_failed",
                "train/loss_first", "train/loss_last")
        print(json.dumps({k: result.get(k) for k in keys}, indent=2))
    else:
        print(json.dumps({k: v for k, v in result.items() if not isinstance(v, dict)}, indent=2))


def command(name: str) -> Callable[[argparse.Namespace], int]:
    """The function of a parsed command: `wim run` and each stage's command (wim/stages.py)
    run `stage_command`, the others their entry of `COMMANDS`."""
    return stage_command if name == "run" or name in stage_commands() else COMMANDS[name]


# The commands that are not stages.
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "merge": merge_command,
    "export": export_command,
    "eval": evaluation.eval_command,
    "compare": evaluation.compare_command,
    "validity": evaluation.validity_command,
    "refine": refinement.refine_command,
    "refine-2x2": refinement.refine_2x2_command,
    "vrr simulate": refinement.vrr_simulate_command,
    "vrr calibrate": refinement.vrr_calibrate_command,
}
