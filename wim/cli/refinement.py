"""`wim refine`, `wim refine-2x2` and `wim vrr simulate|calibrate`: controlled iterative
refinement (wim/refine/)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from wim.errors import InputError


def refine_command(args: argparse.Namespace) -> int:
    """`wim refine CONFIG --out DIR`."""

    from wim.config import load_config
    from wim.prompts import load_prompts
    from wim.records import write_records_atomic
    from wim.refine import runner, summary
    from wim.rundir import PLOTS_FOLDER, REFINE_FOLDER, RunDir

    cfg = load_config(args.source, args.overrides)
    prompts = load_prompts(cfg.prompts.source, split=cfg.prompts.split, limit=cfg.prompts.limit)
    out = Path(args.out)
    with RunDir(out).lock():
        folder = out / REFINE_FOLDER
        RunDir(folder).ensure_folder()
        RunDir(folder).save_config(cfg)  # resolved_config.yaml, as every run directory's
        policy, evaluator, el_name = runner.open_models(cfg)
        try:
            trajectories = runner.run_master(cfg, prompts, policy, evaluator,
                                             progress=not args.no_progress)
            runner.write_trajectories(folder / "trajectories.jsonl", trajectories)
            outcomes, info = summary.derive_policies(cfg, trajectories)
            blind = _blind(cfg, policy)
            scores, failed = summary.blind_scores(blind, prompts, trajectories, outcomes)
        finally:
            policy.close()
        result = summary.summarize(cfg, prompts, trajectories, outcomes, scores, info)
        result["blind"] = {"model": blind.model_name, "mode": "pointwise", "failed": failed}
        result["loop_evaluator"] = el_name
        result["policy"], result["seed"] = cfg.policy.model, cfg.seed  # for refine-2x2 checks
        pairs = summary.refinement_pairs(cfg, prompts, trajectories, outcomes, scores)
        write_records_atomic(RunDir(folder).pairs, pairs)
        result["pairs"] = {"count": len(pairs), "rule": cfg.refine.pairs_rule,
                           "policy": cfg.refine.pairs_policy}
        summary.write_json(folder / "summary.json", result)
        summary.write_markdown(folder / "summary.md", result)
        summary.plot(out / PLOTS_FOLDER / "refine_quality_vs_tokens.png", result)
    print(f"wrote {folder / 'trajectories.jsonl'}, {folder / 'summary.md'}, "
          f"{folder / 'summary.json'}, {RunDir(folder).pairs} and "
          f"{out / PLOTS_FOLDER / 'refine_quality_vs_tokens.png'}")
    print(json.dumps({name: {k: row[k] for k in ("attempts_mean", "tokens_mean", "blind_mean")}
                      for name, row in result["policies"].items()}, indent=2))
    return 0


def refine_2x2_command(args: argparse.Namespace) -> int:
    """`wim refine-2x2 SAME CROSS`: main effects and interaction, Holm-adjusted."""
    from wim.refine.analysis import interaction_from_summaries
    from wim.rundir import REFINE_FOLDER

    summaries = []
    for folder in (args.same, args.cross):
        path = Path(folder) / REFINE_FOLDER / "summary.json"
        if not path.is_file():
            raise InputError(f"{path}: not found; run `wim refine CONFIG --out {folder}` first.")
        summaries.append(json.loads(path.read_text()))
    try:
        result = interaction_from_summaries(*summaries, test=args.test)
    except ValueError as err:
        raise InputError(f"wim refine-2x2: {err}") from None
    print(json.dumps(result, indent=2))
    return 0


def _blind(cfg, policy):
    """E_B of `blind:`; it shares the policy's weights when it is the same local model (no
    adapter), so that the model is not loaded twice."""
    from wim.blind import open_blind_evaluator

    b = cfg.blind
    same = (b.backend == cfg.policy.backend == "transformers" and b.model == cfg.policy.model
            and not cfg.policy.adapter)
    return open_blind_evaluator(cfg, backend=policy if same else None)


def vrr_simulate_command(args: argparse.Namespace) -> int:
    from wim.refine.simulate import SimSpec, format_table, simulate
    from wim.refine.vrr import VRRParams

    vrr = VRRParams(rho0=args.rho0, rho1=args.rho1, alpha=args.alpha, beta=args.beta, m=args.m,
                    k=args.k, tau=args.tau, delta=args.delta)
    spec = SimSpec(pi=args.pi, vrr=vrr, trials=args.trials, seed=args.seed,
                   calib_transitions=args.transitions)
    try:
        result = simulate(spec)
    except ValueError as err:
        raise InputError(f"wim vrr simulate: {err}") from None
    print(json.dumps(result["policies"]) if args.json else format_table(result, spec))
    return 0


def vrr_calibrate_command(args: argparse.Namespace) -> int:
    from wim.refine.logs import read_repairs, read_votes
    from wim.refine.vrr import calibrate_repairs, calibrate_votes, choose_policy, youden_j

    out: dict = {}
    if args.votes:
        accepts, m = read_votes(Path(args.votes), args.m)
        cal = calibrate_votes(accepts, m)
        j = youden_j(cal.rho0, cal.rho1)
        out.update(rho0=cal.rho0, rho1=cal.rho1, prior_valid=cal.prior_valid, m=m,
                   plans=len(accepts), em_iterations=cal.iterations, em_converged=cal.converged,
                   J=j, policy=choose_policy(j, args.j_min), j_min=args.j_min)
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
