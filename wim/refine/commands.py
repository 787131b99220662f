"""`wim vrr simulate`, `wim vrr calibrate` and `wim refine`: what the CLI calls (lazily)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from wim.errors import InputError


def vrr_simulate(args: argparse.Namespace) -> int:
    from wim.refine.simulate import SimSpec, format_table, simulate

    spec = SimSpec(pi=args.pi, rho0=args.rho0, rho1=args.rho1, alpha=args.alpha, beta=args.beta,
                   m=args.m, k=args.k, delta=args.delta, tau=args.tau, trials=args.trials,
                   seed=args.seed, calib_transitions=args.transitions)
    try:
        result = simulate(spec)
    except ValueError as err:
        raise InputError(f"wim vrr simulate: {err}") from None
    if args.json:
        print(json.dumps(result["policies"]))
    else:
        print(format_table(result, spec))
    return 0


def vrr_calibrate(args: argparse.Namespace) -> int:
    from wim.refine.vrr import calibrate_repairs, calibrate_votes, choose_policy, youden_j

    out: dict = {}
    if args.votes:
        accepts, m = read_votes(Path(args.votes), args.m)
        cal = calibrate_votes(accepts, m)
        out.update(rho0=cal.rho0, rho1=cal.rho1, prior_valid=cal.prior_valid, m=m,
                   plans=len(accepts), em_iterations=cal.iterations, em_converged=cal.converged)
        out["J"] = youden_j(cal.rho0, cal.rho1)
        out["policy"] = choose_policy(out["J"], args.j_min)
        out["j_min"] = args.j_min
    if args.repairs:
        before, after = read_repairs(Path(args.repairs))
        try:
            rep = calibrate_repairs(before, after)
        except ValueError as err:
            raise InputError(f"{args.repairs}: {err}") from None
        out.update(alpha=rep.alpha, beta=rep.beta, repairs_invalid_before=rep.n_invalid_before,
                   repairs_valid_before=rep.n_valid_before)
    if not out:
        raise InputError("wim vrr calibrate: give --votes FILE and/or --repairs FILE (jsonl).")
    print(json.dumps(out, indent=None if args.json else 2))
    return 0


def _jsonl(path: Path):
    if not path.is_file():
        raise InputError(f"{path}: no such file.")
    with path.open() as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise InputError(f"{path}:{n}: not valid JSON ({err.msg}).") from None
            if not isinstance(row, dict):
                raise InputError(f"{path}:{n}: expected a JSON object per line.")
            yield n, row


def read_votes(path: Path, m: int | None) -> tuple[list[int], int]:
    """Each line: {"votes": [1, 0, ...]} (1 = accept) or {"accepts": S, "m": M}; one M for all."""
    accepts, ms = [], set()
    for n, row in _jsonl(path):
        if isinstance(row.get("votes"), list) and all(v in (0, 1, True, False)
                                                      for v in row["votes"]):
            accepts.append(int(sum(row["votes"])))
            ms.add(len(row["votes"]))
        elif isinstance(row.get("accepts"), int) and isinstance(row.get("m", m), int):
            mm = row.get("m", m)
            if not 0 <= row["accepts"] <= mm:
                raise InputError(f"{path}:{n}: 'accepts' must lie in 0..{mm}, got "
                                 f"{row['accepts']}.")
            accepts.append(row["accepts"])
            ms.add(mm)
        else:
            raise InputError(f"{path}:{n}: expected 'votes' (a list of 0/1) or 'accepts' (an "
                             "integer, with 'm' on the line or --m), got keys "
                             f"{sorted(row)}.")
    if not accepts:
        raise InputError(f"{path}: holds no votes.")
    if len(ms) != 1:
        raise InputError(f"{path}: every plan needs the same number of votes, got {sorted(ms)}.")
    return accepts, ms.pop()


def read_repairs(path: Path) -> tuple[list[bool], list[bool]]:
    """Each line: {"valid_before": true|false, "valid_after": true|false}."""
    before, after = [], []
    for n, row in _jsonl(path):
        a, b = row.get("valid_before"), row.get("valid_after")
        if not isinstance(a, bool) or not isinstance(b, bool):
            raise InputError(f"{path}:{n}: expected booleans 'valid_before' and 'valid_after', "
                             f"got {a!r} and {b!r}.")
        before.append(a)
        after.append(b)
    if not before:
        raise InputError(f"{path}: holds no labelled repairs.")
    return before, after
