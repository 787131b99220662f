"""The `wim validity` command (argument handling and output); wim/cli.py calls it lazily."""

from __future__ import annotations

import json
from pathlib import Path

from wim.config import load_config


def validity_command(args) -> int:
    from data_gen.validity import scorer_validity

    cfg = load_config(args.config, args.overrides)
    report = scorer_validity(cfg, args.gold, limit=args.limit, out=Path(args.out) if args.out
                             else None, progress=not args.no_progress)
    print(json.dumps(report, indent=2))
    return 0
