"""Every `wim` command, one function each, listed in `COMMANDS`.

wim/cli.py parses the arguments and calls `run_command(args)`; this package is the one place
that runs a command, at the top of the layers (wim <- data_gen <- training), so it may call
every package:
- stages.py: `wim run` and the single stages (generate, judge, score, pairs, train, report),
  `wim merge`, `wim export`;
- evaluation.py: `wim eval`, `wim compare`, `wim validity`;
- refinement.py: `wim refine`, `wim refine-2x2`, `wim vrr simulate|calibrate`.

What every command shares is written once: the lock on the folder it writes (`RunDir.lock()`,
named after the command line), and here exit code 3 for work that lost records to a backend
(`StageIncomplete`: the same command finishes it). Heavy imports happen inside the commands.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from training.commands import evaluation, refinement, stages
from wim.errors import StageIncomplete

COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": stages.stage_command,
    "generate": stages.stage_command,
    "judge": stages.stage_command,
    "score": stages.stage_command,
    "pairs": stages.stage_command,
    "train": stages.stage_command,
    "report": stages.stage_command,
    "merge": stages.merge_command,
    "export": stages.export_command,
    "eval": evaluation.eval_command,
    "compare": evaluation.compare_command,
    "validity": evaluation.validity_command,
    "refine": refinement.refine_command,
    "refine-2x2": refinement.refine_2x2_command,
    "vrr simulate": refinement.vrr_simulate_command,
    "vrr calibrate": refinement.vrr_calibrate_command,
}


def run_command(args: argparse.Namespace) -> int:
    """Run the parsed command; its exit code (3: incomplete, run the same command again)."""
    name = f"vrr {args.vrr_command}" if args.command == "vrr" else args.command
    try:
        return COMMANDS[name](args)
    except StageIncomplete as err:
        # Exit 3, not 2: nothing is wrong with the input; the same command will finish it.
        print(f"wim: incomplete: {err}", file=sys.stderr)
        return 3

