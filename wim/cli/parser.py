"""The `wim` command line: every command and its arguments (`build_parser`). Parsing imports
nothing heavy, so `wim --help` stays fast."""

from __future__ import annotations

import argparse

from wim import stages


def stage_commands() -> dict[str, str]:
    """{stage: its help} for each stage with a command of its own (wim/stages.py)."""
    return {s.name: s.help for s in stages.STAGES if s.help is not None}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="wim", description="Build 'What Is Missing' preference "
                                     "datasets and train models on them with DPO.")
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

    run = sub.add_parser("run", help="run every stage: " + ", ".join(s.name for s in stages.STAGES))
    add_common(run, "experiment YAML (e.g. configs/quickstart.yaml)")
    run.add_argument("--skip-train", action="store_true", help="stop after building pairs")
    for name, text in stage_commands().items():
        stage = sub.add_parser(name, help=text)
        add_common(stage, "experiment YAML or an existing run directory")
        if name == "judge":
            stage.add_argument("--batch-results", nargs="+", metavar="OUT",
                               help="take in Batch API output files (`vllm run_batch -o OUT`, "
                               "or OpenAI's) for the requests judge.batch wrote")
            stage.add_argument("--batch-submit", action="store_true",
                               help="send the batch request files to the Files and Batches API "
                               "at judge.http (once); `wim judge DIR` then collects the answers")
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
    """`wim eval`, `wim compare`, `wim validity`."""
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
        p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config field, e.g. blind.mode=pointwise")
        p.add_argument("--no-progress", action="store_true", help="hide progress bars")
        # Also after the command (`wim run CONFIG -v`); SUPPRESS keeps a `wim -v run` intact.
        p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                       help="log debug messages, one line per HTTP request among them")


def add_refine_parsers(sub) -> None:
    """`wim refine`, `wim refine-2x2` and `wim vrr simulate|calibrate`."""
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
