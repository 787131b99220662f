"""Policies from the master trajectories, their blind outcome and token cost, and the outputs.

Writes DIR/refine/summary.json and summary.md (per policy: attempts, tokens, blind quality,
paired tests against the baseline with Holm correction), DIR/refine/pairs.jsonl (refinement as
data: (final, initial) preference rows) and DIR/plots/refine_quality_vs_tokens.png.
Token cost of a policy on a question: the initial answer (and its evaluation, except for
`none`), plus generation and evaluation of each attempt it used, plus the votes on those
answers for the VRR policies.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

from wim.config import Config
from wim.markdown import fmt_value, markdown_table
from wim.records import write_atomic
from wim.refine.analysis import compare_policies
from wim.refine.stopping import Outcome, Step, dynamic, hard_cap, vrr_guard, vrr_stop
from wim.refine.vrr import VRRParams, calibrate_votes, choose_policy, youden_j
from wim.report.plots import pyplot, save_figure

logger = logging.getLogger(__name__)

CAVEAT = ("The bundled 135M model cannot really generate, evaluate or judge: these numbers show "
          "that the loop, the controller, the stopping policies and the statistics run end to "
          "end; they are mechanical, not evidence for or against refinement.")


def derive_policies(cfg: Config, trajectories: list[list[dict[str, Any]]]
                    ) -> tuple[dict[str, list[Outcome]], dict[str, Any]]:
    """Outcome of each policy on each question, and the VRR calibration found on the votes."""
    r, v = cfg.refine, cfg.refine.vrr
    vp = VRRParams(v.rho0, v.rho1, v.alpha, v.beta, v.m, v.k, v.tau, v.delta)
    info: dict[str, Any] = {}
    failed = sum(rec["accepts"] is None for t in trajectories for rec in t)
    if v.enabled and failed:
        info["vrr_skipped"] = (f"the votes on {failed} answers failed to parse after retries "
                               "(the VRR policies need every answer's M votes)")
    rules = {"none": lambda steps, recs: Outcome("none", 0, 0, "the initial answer"),
             "hard_cap": lambda steps, recs: hard_cap(steps, r.max_attempts),
             "dynamic": lambda steps, recs: dynamic(steps, recs[0]["aggregate"],
                                                    r.max_attempts, r.dynamic)}
    if v.enabled and not failed:
        rules["vrr_stop"] = lambda steps, recs: vrr_stop(steps, recs[0]["accepts"], v.prior, vp)
        rules["vrr_guard"] = lambda steps, recs: vrr_guard(steps, recs[0]["accepts"], vp)
        if v.calibrate:
            cal = calibrate_votes([rec["accepts"] for t in trajectories for rec in t], v.m)
            j = youden_j(cal.rho0, cal.rho1)
            info["calibration"] = {"rho0": cal.rho0, "rho1": cal.rho1,
                                   "prior_valid": cal.prior_valid, "J": j,
                                   "recommended": choose_policy(j, v.j_min), "j_min": v.j_min,
                                   "em_converged": cal.converged}
            calibrated = dataclasses.replace(vp, rho0=cal.rho0, rho1=cal.rho1)
            rules["vrr_stop_calibrated"] = lambda steps, recs: vrr_stop(
                steps, recs[0]["accepts"], cal.prior_valid, calibrated)
    # Attempts 1.. of each question's master trajectory.
    steps = [[Step(rec["decision"]["accept"], recs[rec["retained_attempt"]]["aggregate"],
                   rec["aggregate"], rec["retained_attempt"], rec["accepts"]) for rec in recs[1:]]
             for recs in trajectories]
    return {name: [rule(st, recs) for st, recs in zip(steps, trajectories, strict=True)]
            for name, rule in rules.items()}, info


def policy_tokens(name: str, recs: list[dict[str, Any]], attempts: int) -> int:
    if name == "none":
        return recs[0]["tokens"]["generate"]
    kinds = ["generate", "evaluate"] + (["votes"] if name.startswith("vrr") else [])
    return sum(rec["tokens"][kind] for rec in recs[: attempts + 1] for kind in kinds)


def blind_scores(blind, prompts, trajectories, outcomes) -> tuple[dict, int]:
    """E_B's score of every distinct final answer, keyed (question index, attempt)."""
    wanted = sorted({(i, o.final_index) for outs in outcomes.values()
                     for i, o in enumerate(outs)})
    verdicts = blind.pointwise([prompts[i].text for i, _ in wanted],
                               [trajectories[i][t]["answer"] for i, t in wanted])
    scores = {key: v.score for key, v in zip(wanted, verdicts, strict=True)}
    return scores, sum(v.score is None for v in verdicts)


def summarize(cfg: Config, prompts, trajectories, outcomes, scores, info) -> dict[str, Any]:
    r = cfg.refine
    table = {}
    per_question: dict[str, list[float | None]] = {}
    for name, outs in outcomes.items():
        tokens = [policy_tokens(name, trajectories[i], o.attempts) for i, o in enumerate(outs)]
        per_question[name] = blind = [scores[(i, o.final_index)] for i, o in enumerate(outs)]
        got = [b for b in blind if b is not None]
        table[name] = {"attempts_mean": sum(o.attempts for o in outs) / len(outs),
                       "tokens_mean": sum(tokens) / len(tokens), "tokens_total": sum(tokens),
                       "blind_mean": sum(got) / len(got) if got else None,
                       "blind_scored": len(got), "blind_failed": len(blind) - len(got),
                       "changed_answer": sum(o.final_index != 0 for o in outs)}
    cap_tokens = table.get("hard_cap", {}).get("tokens_total")
    for row in table.values():
        row["tokens_saved_vs_hard_cap"] = (1 - row["tokens_total"] / cap_tokens
                                           if cap_tokens else None)
    tests = (compare_policies(per_question, r.baseline, r.test)
             if r.baseline in per_question else {})
    recs = [rec for t in trajectories for rec in t]
    decisions = [rec["decision"] for rec in recs if rec["decision"]]
    return {
        "caveat": CAVEAT, "prompts": len(prompts), "max_attempts": r.max_attempts,
        "evaluator": r.evaluator, "strict": r.strict, "critical_guard": r.critical_guard,
        "ensemble_n": r.ensemble_n, "policies": table, "tests": tests, "baseline": r.baseline,
        "per_question": {"prompt_ids": [p.id for p in prompts], "blind": per_question,
                         "attempts": {n: [o.attempts for o in outs]
                                      for n, outs in outcomes.items()},
                         "reasons": {n: [o.reason for o in outs] for n, outs in outcomes.items()}},
        "counts": {"attempts": len(recs), "accepted": sum(d["accept"] for d in decisions),
                   "rejections_by_rule": dict(sorted(Counter(
                       d["rule"] for d in decisions if not d["accept"]).items())),
                   "evaluation_failed": sum(rec["scores"] is None for rec in recs),
                   "votes_failed": sum(rec["accepts"] is None for rec in recs)
                   if cfg.refine.vrr.enabled else None,
                   "votes_reasked": sum(rec["votes_reasked"] for rec in recs)},
        **info,
    }


def refinement_pairs(cfg: Config, prompts, trajectories, outcomes, scores) -> list[dict]:
    """(final, initial) rows in the TRL conversational preference format of pairs.jsonl."""
    r = cfg.refine
    if r.pairs_rule == "none" or r.pairs_policy not in outcomes:
        return []
    rows = []
    for i, o in enumerate(outcomes[r.pairs_policy]):
        final, first = scores.get((i, o.final_index)), scores.get((i, 0))
        no_gain = final is None or first is None or final <= first
        if o.final_index == 0 or r.pairs_rule == "blind" and no_gain:
            continue
        chosen, rejected = trajectories[i][o.final_index], trajectories[i][0]
        rows.append({"prompt": list(prompts[i].messages),
                     "chosen": [{"role": "assistant", "content": chosen["answer"]}],
                     "rejected": [{"role": "assistant", "content": rejected["answer"]}],
                     "prompt_id": prompts[i].id, "domain": prompts[i].domain,
                     "policy": r.pairs_policy, "rule": r.pairs_rule,
                     "chosen_attempt": o.final_index, "chosen_blind": final,
                     "rejected_blind": first, "chosen_aggregate": chosen["aggregate"],
                     "rejected_aggregate": rejected["aggregate"]})
    return rows


def write_markdown(path: Path, summary: dict[str, Any]) -> None:
    lines = ["# Refinement: policies from shared master trajectories", "",
             f"> {summary['caveat']}", "",
             f"{summary['prompts']} prompts, hard cap {summary['max_attempts']} attempts, E_L: "
             f"{summary['evaluator']}, strict {summary['strict']}, critical guard "
             f"{summary['critical_guard']}, ensemble n {summary['ensemble_n']}.", ""]
    base = summary["baseline"]
    lines += markdown_table(
        ["policy", "attempts", "tokens / question", "saved vs hard cap", "blind quality",
         "scored", "failed", "vs baseline (p, Holm)"],
        [[name, f"{row['attempts_mean']:.2f}", f"{row['tokens_mean']:.0f}",
          fmt_value(row["tokens_saved_vs_hard_cap"], pct=True), fmt_value(row["blind_mean"]),
          row["blind_scored"],
          row["blind_failed"],
          "baseline" if name == base else _test_cell(summary["tests"].get(f"{name} vs {base}"))]
         for name, row in summary["policies"].items()])
    c = summary["counts"]
    lines += ["", f"Attempts {c['attempts']}, accepted {c['accepted']}, rejected by rule "
              f"{c['rejections_by_rule']}, E_L evaluations failed {c['evaluation_failed']}, "
              f"vote sets failed {c['votes_failed']} (votes re-asked {c['votes_reasked']})."]
    if "vrr_skipped" in summary:
        lines.append(f"VRR policies left out: {summary['vrr_skipped']}.")
    if "calibration" in summary:
        cal = summary["calibration"]
        lines.append(f"Votes calibrated by EM: rho0 {cal['rho0']:.3f}, rho1 {cal['rho1']:.3f}, "
                     f"J {cal['J']:.3f} -> {cal['recommended']} (J_min {cal['j_min']}).")
    path.write_text("\n".join(lines) + "\n")


def _test_cell(test: dict | None) -> str:
    if not test:
        return "-"
    if test["p"] is None:
        return f"n={test['n']}, no test ({test['note']})"
    return f"diff {test['mean_diff']:+.3f}, p {test['p']:.3f}, Holm {test['p_holm']:.3f}"


def plot(path: Path, summary: dict[str, Any]) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, row in summary["policies"].items():
        if row["blind_mean"] is not None:
            ax.scatter(row["tokens_mean"], row["blind_mean"])
            ax.annotate(name, (row["tokens_mean"], row["blind_mean"]), textcoords="offset points",
                        xytext=(4, 4), fontsize=8)
    ax.set_xlabel("tokens per question (generation + evaluation + votes)")
    ax.set_ylabel("blind outcome score (E_B, 0-1)")
    ax.set_title("Refinement policies: quality vs tokens (shared trajectories)")
    fig.text(0.01, 0.01, "bundled 135M model: mechanical numbers", fontsize=7)
    save_figure(fig, path, dpi=120)


def write_json(path: Path, data: Any) -> None:
    write_atomic(path, [json.dumps(data, indent=2)])
