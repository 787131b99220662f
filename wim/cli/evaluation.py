"""`wim eval`, `wim compare` and `wim validity`: blind win rates and scorer validity."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from wim.config import load_config
from wim.rundir import EVAL, RunDir


def eval_command(args) -> int:
    from training.evaluate import evaluate_run

    run = RunDir(Path(args.run))
    cfg = run.load_config(args.overrides)
    against = [RunDir(Path(d)) for d in args.against]
    with run.lock():
        report = evaluate_run(cfg, run, against, limit=args.limit, progress=not args.no_progress)
    return _print_eval(report, run.file(EVAL))


def _print_eval(report: dict, path: Path) -> int:
    print(f"wrote {path} and {path.with_suffix('.md')}")
    for key, label in (("mechanical_warning", "note"), ("power_statement", "power")):
        if report.get(key):
            print(f"{label}: {report[key]}")
    if (report.get("evaluator") or {}).get("verdict_note"):
        print(f"note: {report['evaluator']['verdict_note']}")
    if report.get("hard_fallback"):
        print(f"note: {report['hard_fallback']} prompt(s) fell back to hard verdicts (the "
              "evaluator's backend gave no token probabilities)")
    keep = ("name", "primary", "n", "wins", "losses", "ties", "failures", "decisive_rate",
            "decisive_95", "p_value", "p_holm", "win_rate", "bootstrap_95", "order_agreement",
            "length_adjusted_win_rate")
    weighted = ("preference", "ci95", "p_value", "p_holm", "lc_win_rate", "sources")
    print(json.dumps([{**({"weighted": {k: c["weighted"].get(k) for k in weighted}}
                          if c.get("weighted") else {}), **{k: c[k] for k in keep}}
                      for c in report["comparisons"]], indent=2))
    if report.get("backend_failures"):
        print(f"wim: incomplete: {report['backend_failures']} verdicts were lost to backend "
              "failures (counted as failures, never as wins); run the same command again.",
              file=sys.stderr)
        return 3
    if report.get("budget_exhausted"):
        print(f"wim: incomplete: {report['budget_exhausted']} verdicts ran out of tokens before "
              f"any verdict (counted as failures, never as wins; the last: "
              f"{report['budget_note']}). Raise blind.max_new_tokens (a reasoning evaluator "
              "thinks first: thousands) and run the same command again.", file=sys.stderr)
        return 3
    return 0


def compare_command(args) -> int:
    from training.compare import compare_arms

    cfg = load_config(args.config, args.overrides)
    out = Path(args.out)
    with RunDir(out).lock():
        report = compare_arms(cfg, out, progress=not args.no_progress)
    return _print_eval(report, out / "compare.json")


def validity_command(args) -> int:
    from data_gen.validity import scorer_validity

    cfg = load_config(args.config, args.overrides)
    report = scorer_validity(cfg, args.gold, limit=args.limit, out=Path(args.out) if args.out
                             else None, progress=not args.no_progress)
    print(json.dumps(report, indent=2))
    return 0
