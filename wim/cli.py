"""The `wim` command. Heavy imports happen inside the commands, so `wim --help` stays fast."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from wim.config import ConfigError, apply_overrides, config_from_dict, read_yaml
from wim.errors import WimError

STAGE_COMMANDS = {
    "generate": "sample k responses per prompt from the policy (samples.jsonl)",
    "judge": "judge each sample: what is missing + a 1-10 rating (judgements.jsonl)",
    "score": "(re-)score judgements with scoring.zeta and the embedder; no judge calls",
    "pairs": "build chosen/rejected pairs (pairs.jsonl, pairs/ dataset)",
    "train": "DPO-train a LoRA adapter on the pairs with TRL (train/)",
    "report": "write report.json, report.md, report.html and plots/",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="wim",
        description="Build 'What Is Missing' preference datasets and train models on them "
        "with DPO.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", required=True)

    def add_common(p: argparse.ArgumentParser, source_help: str) -> None:
        p.add_argument("source", help=source_help)
        p.add_argument("--out", help="run directory (default: SOURCE when it is a run directory)")
        p.add_argument("--set", dest="overrides", action="append", default=[],
                       metavar="KEY=VALUE", help="override a config field, e.g. scoring.zeta=1")
        p.add_argument("--shard", help="run only shard i of n (i/n), e.g. 0/2")
        p.add_argument("--no-progress", action="store_true", help="hide progress bars")
        # Also after the command (`wim run CONFIG -v`); SUPPRESS keeps a `wim -v run` intact.
        p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                       help="log debug messages, one line per HTTP request among them")

    run = sub.add_parser("run", help="run every stage: generate, judge, score, pairs, train, "
                         "report")
    add_common(run, "experiment YAML (e.g. configs/quickstart.yaml)")
    run.add_argument("--skip-train", action="store_true", help="stop after building pairs")
    for name, text in STAGE_COMMANDS.items():
        add_common(sub.add_parser(name, help=text), "experiment YAML or an existing run directory")
    export = sub.add_parser("export", help="write the policy with the trained adapter merged "
                            "in: an ordinary transformers model folder")
    export.add_argument("dir", help="a finished run directory (its last round's adapter)")
    export.add_argument("--merged", required=True, metavar="OUT", help="output folder")
    merge = sub.add_parser("merge", help="join shard run directories into one")
    merge.add_argument("dirs", nargs="+", help="shard run directories")
    merge.add_argument("--out", required=True, help="merged run directory")
    merge.add_argument("--allow-partial", action="store_true",
                       help="merge even when some shards of the split are missing")
    _add_eval_parsers(sub)
    add_refine_parsers(sub)
    return parser


def _add_eval_parsers(sub) -> None:
    """`wim eval`, `wim compare`, `wim validity` (training/commands.py)."""
    sets = dict(dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                help="override a config field, e.g. blind.mode=pointwise")
    ev = sub.add_parser("eval", help="blind evaluation of a run's trained policy against its "
                        "base on held-out prompts (eval.json)")
    ev.add_argument("run", help="run directory with a trained adapter (train/adapter)")
    ev.add_argument("--against", action="append", default=[], metavar="DIR",
                    help="also compare with the trained policy of this run (repeatable)")
    ev.add_argument("--limit", type=int, help="evaluate at most this many held-out prompts")
    compare = sub.add_parser("compare", help="train numeric, WIM, mixed and random-preference "
                             "arms from one judging pass and compare them blind")
    compare.add_argument("config", help="experiment YAML (e.g. configs/quickstart.yaml)")
    compare.add_argument("--out", required=True, help="output folder (arms/, compare.json)")
    validity = sub.add_parser("validity", help="scorer validity: how often each scoring system "
                              "ranks the better answer of gold pairs first")
    validity.add_argument("config", help="experiment YAML (its judge and scoring sections)")
    validity.add_argument("--gold", help="jsonl/csv with prompt, chosen, rejected (default: "
                          "the bundled gold set)")
    validity.add_argument("--limit", type=int, help="use only the first N gold pairs")
    validity.add_argument("--out", help="folder for validity.json and validity.md")
    for p in (ev, compare, validity):
        p.add_argument("--set", **sets)
        p.add_argument("--no-progress", action="store_true", help="hide progress bars")
        # Also after the command (`wim run CONFIG -v`); SUPPRESS keeps a `wim -v run` intact.
        p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                       help="log debug messages, one line per HTTP request among them")


def add_refine_parsers(sub) -> None:
    """`wim refine` and `wim vrr simulate|calibrate` (code in wim/refine/, imported lazily)."""
    refine = sub.add_parser("refine", help="controlled iterative refinement: one hard-cap master "
                            "trajectory per prompt, every stopping policy derived from it")
    refine.add_argument("source", help="experiment YAML with a refine: section "
                        "(e.g. configs/refine.yaml)")
    refine.add_argument("--out", required=True, help="output folder (writes OUT/refine/, "
                        "OUT/plots/refine_quality_vs_tokens.png)")
    refine.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override a config field, e.g. refine.gamma=0.05")
    refine.add_argument("--no-progress", action="store_true", help="hide progress bars")
    two = sub.add_parser("refine-2x2", help="the 2x2 analysis (E_L same vs cross model x "
                         "dynamic vs hard cap) of two `wim refine` output folders")
    two.add_argument("same", help="output folder of the run with refine.evaluator: same")
    two.add_argument("cross", help="output folder of the run with another E_L model")
    two.add_argument("--test", choices=("ttest", "wilcoxon"), default="ttest",
                     help="one-sample test of each per-question contrast (default ttest)")
    vrr = sub.add_parser("vrr", help="VRR-Stop / VRR-Guard: simulate a verify-repair loop, or "
                         "calibrate the verifier and repair noise from logs")
    vsub = vrr.add_subparsers(dest="vrr_command", required=True)
    sim = vsub.add_parser("simulate", help="synthetic verify-repair loop with known noise")
    for name, kind, default, text in (
        ("--pi", float, 0.5, "probability that the first plan is valid"),
        ("--rho0", float, 0.2, "P(a vote accepts | plan invalid)"),
        ("--rho1", float, 0.1, "P(a vote rejects | plan valid)"),
        ("--alpha", float, 0.4, "P(a repair fixes an invalid plan)"),
        ("--beta", float, 0.1, "P(a repair breaks a valid plan)"),
        ("--m", int, 8, "verifier votes per round"),
        ("--k", int, 5, "most repairs (rounds of fixed and guard)"),
        ("--delta", int, 5, "guard: the repair replaces the incumbent iff S(new) >= S(inc) + "
         "delta"),
        ("--tau", float, 0.0, "stop: repair while the gain G > tau"),
        ("--trials", int, 10000, "simulated questions"),
        ("--seed", int, 0, "random seed"),
        ("--transitions", int, 300, "labelled repairs simulated to calibrate alpha and beta"),
    ):
        sim.add_argument(name, type=kind, default=default, help=f"{text} (default {default})")
    sim.add_argument("--json", action="store_true", help="print one JSON object: policy -> "
                     "{validity, acceptance, repairs} means")
    cal = vsub.add_parser("calibrate", help="estimate rho0, rho1 (EM over unlabelled votes), "
                          "alpha, beta (labelled repairs), J, and choose stop or guard")
    cal.add_argument("--votes", help='jsonl: {"votes": [1, 0, ...]} or {"accepts": S, "m": M}')
    cal.add_argument("--repairs", help='jsonl: {"valid_before": bool, "valid_after": bool}')
    cal.add_argument("--m", type=int, default=None, help="votes per plan when lines give only "
                     "'accepts'")
    cal.add_argument("--j-min", type=float, default=0.2, help="choose stop when J >= this, "
                     "else guard (default 0.2)")
    cal.add_argument("--json", action="store_true", help="print compact JSON")


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


# Our packages, and the HTTP libraries (httpx logs one INFO line per request).
_VERBOSE_LOGGERS = ("wim", "data_gen", "training", "httpx", "aiohttp")


def _set_up_logging(verbose: bool) -> None:
    """Warnings and our INFO lines; with --verbose our DEBUG lines too, one per HTTP request
    among them. Other libraries' DEBUG lines stay off either way."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for name in _VERBOSE_LOGGERS:
        quiet = logging.WARNING if name == "httpx" else logging.NOTSET
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else quiet)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _set_up_logging(args.verbose)
    try:
        return _dispatch(args)
    except KeyboardInterrupt:
        print("wim: interrupted; finished records are kept, run the same command to resume.",
              file=sys.stderr)
        return 130
    except WimError as err:  # the user's to fix: one paragraph; anything else keeps its traceback
        print(f"wim: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a write the file system refused (disk full, permissions, ...)
        if not _is_storage_error(err):
            raise
        from wim.records import storage_error

        print(f"wim: error: {storage_error(err, err.filename or getattr(args, 'out', None))}",
              file=sys.stderr)
        return 2


def _is_storage_error(err: OSError) -> bool:
    """A write refused by the file system (disk full, permissions, ...), wherever it came from
    (our writers wrap theirs; this catches the libraries': datasets, the trainer, plots)."""
    from wim.records import STORAGE_ERRNOS

    return err.errno in STORAGE_ERRNOS


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "export":
        from training.export import export_merged

        print(json.dumps(export_merged(Path(args.dir), Path(args.merged)), indent=2))
        return 0
    if args.command in ("refine", "refine-2x2", "vrr"):
        from wim.refine import commands

        if args.command == "refine":
            return commands.refine(args)
        if args.command == "refine-2x2":
            return commands.refine_2x2(args)
        return (commands.vrr_simulate if args.vrr_command == "simulate"
                else commands.vrr_calibrate)(args)
    if args.command == "merge":
        from data_gen.merge import merge_runs
        from wim.rundir import RunDir

        with RunDir(Path(args.out)).lock("wim " + " ".join(sys.argv[1:])):
            summary = merge_runs([Path(d) for d in args.dirs], Path(args.out),
                                 allow_partial=args.allow_partial)
        print(json.dumps(summary, indent=2))
        return 0

    if args.command in ("eval", "compare"):
        from training import commands

        return getattr(commands, f"{args.command}_command")(args)
    if args.command == "validity":
        from data_gen.commands import validity_command

        return validity_command(args)

    from data_gen.pipeline import DATA_STAGES, Resources, StageIncomplete
    from data_gen.pipeline import run_stages as run_data_stages
    from data_gen.stages import Shard
    from wim.rundir import RunDir

    cfg, out = resolve(args)
    _check_rounds_command(cfg, args, out)
    if _distributed() and args.command == "train":
        return _train_distributed(cfg, out, args)
    if args.shard is None and Path(args.source).is_dir():
        args.shard = RunDir(out).shard() if out == Path(args.source) else None
    shard = Shard.parse(args.shard)
    # `wim run` and `wim train` are training's (training/); the data stages alone are data_gen's.
    if args.command == "run":
        from training.rounds import run_rounds
        from training.run import STAGES

        runner = run_rounds
        # --skip-train stops after the pairs: nothing trained, so nothing to evaluate either.
        stages = tuple(s for s in STAGES if not (args.skip_train and s in ("train", "eval")))
    elif args.command in DATA_STAGES:
        runner, stages = run_data_stages, (args.command,)
    else:
        from training.run import run_stages

        runner, stages = run_stages, (args.command,)
    resources = Resources(cfg)
    if {"generate", "judge"} & set(stages):
        resources.check_inputs()  # a bad prompts file fails before the run directory is touched
    run = RunDir(out)
    with run.lock("wim " + " ".join(sys.argv[1:])):
        run.claim(cfg, str(shard) if shard else None)
        try:
            result = runner(cfg, run, stages, shard=shard, progress=not args.no_progress,
                            resources=resources)
        except StageIncomplete as err:
            # Exit 3, not 2: nothing is wrong with the input; the same command will finish it.
            run.save_config(cfg, str(shard) if shard else None)
            print(json.dumps({k: v for k, v in err.stats.items() if not isinstance(v, dict)},
                             indent=2))
            print(f"wim: incomplete: {err}", file=sys.stderr)
            return 3
        run.save_config(cfg, str(shard) if shard else None)
    _print_result(result, stages, out)
    return 0


def _check_rounds_command(cfg, args, out: Path) -> None:
    """Runs with several rounds (or online training) are driven by `wim run`; a single stage
    works on one round's folder, DIR/rounds/<r>. Under `accelerate launch` only `wim train`."""
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
    from training.dpo import process_state
    from training.run import train_run
    from wim.rundir import RunDir

    run = RunDir(out)
    state = process_state()
    lock = (run.lock("wim " + " ".join(sys.argv[1:])) if state.is_main_process
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


if __name__ == "__main__":
    sys.exit(main())
