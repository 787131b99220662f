"""`wim compare CONFIG --out DIR`: numeric, WIM, mixed and random-preference arms, side by side.

All arms share one generation and one judging pass (DIR/shared, a run directory); only scoring,
pairing and training differ, with the same seed and step budget:
- `numeric`: zeta 0 (the rating alone);
- `wim`: zeta 1 (the critique similarity alone);
- `mixed-<z>`: each zeta of `eval.compare_zetas` (0.4 by default);
- `random`: the control: the WIM arm's pairs with chosen and rejected swapped by a seeded coin,
  so the same texts carry no preference signal.
Each arm is a run directory DIR/arms/<name> (score, pairs, train). Then every arm's policy and
the base answer the held-out prompts, and the blind evaluator compares each arm with the base
and with every other arm; Holm's correction runs over all of those comparisons at once. The
primary comparison, WIM arm against numeric arm, is fixed in advance and reported first with
its own unadjusted test.
Written: DIR/compare.json, DIR/compare.md, DIR/eval/answers.jsonl, DIR/eval/verdicts.jsonl.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import random
import shutil
from pathlib import Path

from data_gen.pipeline import run_stages
from data_gen.score import store_similarities
from training.evaluate import (
    System,
    compare_systems,
    held_out_prompts,
    write_audit,
)
from wim.config import Config
from wim.errors import InputError
from wim.markdown import fmt_value, markdown_table
from wim.metrics import pair_statistics
from wim.records import iter_records, read_keyed, read_records, write_records_atomic
from wim.report.evaluation import (
    LEGEND,
    WEIGHTED_LEGEND,
    comparison_table,
    header_lines,
    power_lines,
    primary_lines,
    pval,
    weighted_lines,
    weighted_table,
)
from wim.rundir import (
    JUDGEMENTS,
    LOG_HISTORY,
    PAIRS_FOLDER,
    SAMPLES,
    SIMILARITIES,
    SPLIT,
    TRAIN_METRICS,
    RunDir,
    stats_name,
)

logger = logging.getLogger(__name__)

RANDOM_ARM = "random"
PRIMARY = "wim vs numeric"
_SHARED_FILES = (SAMPLES, JUDGEMENTS, SPLIT, stats_name("generate"), stats_name("judge"),
                 SIMILARITIES)


def arms_of(cfg: Config) -> list[tuple[str, float]]:
    """(name, zeta) of every arm; the random arm scores with zeta 1 before its coin flips."""
    arms = [("numeric", 0.0), ("wim", 1.0)]
    arms += [(f"mixed-{z:g}", z) for z in cfg.eval.compare_zetas if z not in (0.0, 1.0)]
    return [*arms, (RANDOM_ARM, 1.0)]


def prepare_config(cfg: Config) -> Config:
    """The config the arms share; held-out prompts are needed for the evaluation."""
    if cfg.judge.mode != "wim":
        raise InputError("wim compare needs judge.mode 'wim': the WIM and mixed arms score the "
                         "critique, and a numeric judge writes none.")
    if cfg.prompts.holdout == 0:
        logger.info("prompts.holdout is 0; compare holds out eval.compare_holdout = %d prompts",
                    cfg.eval.compare_holdout)
        prompts = dataclasses.replace(cfg.prompts, holdout=cfg.eval.compare_holdout)
        cfg = dataclasses.replace(cfg, prompts=prompts)
    return cfg


def compare_arms(cfg: Config, out: Path, progress: bool = True) -> dict:
    cfg = prepare_config(cfg)
    shared = RunDir(out / "shared")
    with shared.lock("wim compare (shared generation and judging)"):
        shared.claim(cfg)
        run_stages(cfg, shared, ("generate", "judge"), progress=progress)
        store_similarities(cfg, shared)  # once for all arms: each scores from a copy
        shared.save_config(cfg)
    arm_runs, every_arm = {}, {}  # the trained arms; all of them
    for name, zeta in arms_of(cfg):
        logger.info("arm %s (zeta %g)", name, zeta)
        arm_cfg = dataclasses.replace(cfg, scoring=dataclasses.replace(cfg.scoring, zeta=zeta))
        run = RunDir(out / "arms" / name)
        with run.lock(f"wim compare (arm {name})"):
            if _train_arm(arm_cfg, run, shared, name, progress):
                arm_runs[name] = (zeta, run)
        every_arm[name] = (zeta, run)
    if not arm_runs:
        raise InputError("no arm had a single preference pair to train on; use more prompts or "
                         "samples per prompt (prompts.limit, generation.k).")
    report = _evaluate_arms(cfg, shared, arm_runs, progress)
    report["arms"] = [arm_summary(cfg, name, zeta, run, shared, trained=name in arm_runs)
                      for name, (zeta, run) in every_arm.items()]
    _attach_wins(report)
    (out / "compare.json").write_text(json.dumps(report, indent=2))
    (out / "compare.md").write_text(compare_markdown(report))
    return report


def _train_arm(arm_cfg: Config, run: RunDir, shared: RunDir, name: str, progress: bool) -> bool:
    """Score, pair and train one arm on the shared records; False when it has no pairs."""
    run.claim(arm_cfg)
    _copy_shared(shared, run)
    run_stages(arm_cfg, run, ("score", "pairs"), progress=progress)
    if name == RANDOM_ARM:
        randomize_pairs(run.pairs, arm_cfg.seed)
        shutil.rmtree(run.file(PAIRS_FOLDER), ignore_errors=True)  # the dataset would be stale
    trained = next(iter_records(run.pairs), None) is not None
    if trained:
        run_stages(arm_cfg, run, ("train",), progress=progress)
    else:  # reported as such; an arm without pairs has nothing to train or evaluate
        logger.warning("arm %s: no pairs (every prompt tied or failed); not trained", name)
    run.save_config(arm_cfg)
    return trained


def _copy_shared(shared: RunDir, run: RunDir) -> None:
    for name in _SHARED_FILES:
        source = shared.file(name)
        if source.is_file():
            run.file(name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, run.file(name))


def randomize_pairs(path: Path, seed: int) -> None:
    """Swap chosen and rejected of each pair with probability 1/2 (seeded); counted per row."""
    rng = random.Random(seed * 7_919 + 13)
    rows = []
    for row in read_records(path):
        flip = rng.random() < 0.5
        if flip:
            row = {**row, "chosen": row["rejected"], "rejected": row["chosen"],
                   **{f"chosen_{k}": row.get(f"rejected_{k}") for k in _AUDIT},
                   **{f"rejected_{k}": row.get(f"chosen_{k}") for k in _AUDIT}}
        rows.append({**row, "random_control": True, "flipped": flip})
    write_records_atomic(path, rows)


_AUDIT = ("sample_idx", "critique", "rating", "similarity", "score")


def _evaluate_arms(cfg: Config, shared: RunDir, arm_runs: dict, progress: bool) -> dict:
    prompts = held_out_prompts(cfg, shared, cfg.eval.limit)
    names = list(arm_runs)
    systems = [System(n, cfg.policy.model, str(run.final_adapter()))
               for n, (_, run) in arm_runs.items()]
    systems.append(System("base", cfg.policy.model, None))
    pairs = [(f"{n} vs base", n, "base") for n in names]
    pairs += [(f"{a} vs {b}", a, b) for a, b in itertools.combinations(names, 2)
              if {a, b} != {"wim", "numeric"}]
    # The primary comparison, fixed before any verdict (the module docstring).
    primary = None
    if {"wim", "numeric"} <= set(names):
        pairs.insert(0, (PRIMARY, "wim", "numeric"))
        primary = PRIMARY
    report, answers, records = compare_systems(cfg, systems, prompts, pairs, progress, primary)
    write_audit(shared.path.parent, answers, records)
    return report


def arm_summary(cfg: Config, name: str, zeta: float, run: RunDir, shared: RunDir,
                trained: bool = True) -> dict:
    """Tie rate, delta, pairs kept, training loss and margins, and cost of one arm."""
    scores = read_keyed(run.scores)
    stats = pair_statistics(scores, zeta, [zeta], cfg.pairs.tie_tolerance)
    pairs = json.loads(run.stats_file("pairs").read_text())
    train = json.loads((run.train_folder / TRAIN_METRICS).read_text()) if trained else {}
    history = json.loads((run.train_folder / LOG_HISTORY).read_text()) if trained else []
    margins = [h["rewards/margins"] for h in history if "rewards/margins" in h]
    judgements = read_keyed(shared.judgements)
    tokens = sum(j.get("prompt_tokens", 0) + j.get("completion_tokens", 0) for j in judgements)
    kept = pairs.get("pairs/count", 0)
    control = name == RANDOM_ARM
    return {
        "name": name, "zeta": None if control else zeta,
        "tie_rate": None if control else stats.get(f"zeta/{zeta:g}/tie_rate"),
        "delta": None if control else stats.get(f"zeta/{zeta:g}/delta"),
        "pairs_kept": kept, "prompts": pairs.get("pairs/prompts"),
        "ties_dropped": pairs.get("pairs/ties_dropped"),
        "loss_first": train.get("train/loss_first"), "loss_last": train.get("train/loss_last"),
        "reward_margin_first": margins[0] if margins else None,
        "reward_margin_last": margins[-1] if margins else None,
        "trained": trained, "train_steps": train.get("train/steps"), "judge_tokens": tokens,
        "usable_pairs_per_1k_judge_tokens": kept / tokens * 1000 if tokens else None,
        "note": "control: the WIM arm's pairs with chosen/rejected swapped by a seeded coin"
                if control else None,
    }


def _attach_wins(report: dict) -> None:
    """Each arm's comparison with the base, copied into its row for the side-by-side table."""
    by_name = {c["name"]: c for c in report["comparisons"]}
    for arm in report["arms"]:
        c = by_name.get(f"{arm['name']} vs base", {})
        arm["vs_base"] = {k: c.get(k) for k in (
            "win_rate", "bootstrap_95", "decisive_rate", "decisive_95", "p_value", "p_holm",
            "order_agreement", "length_adjusted_win_rate")}
        w = c.get("weighted") or {}
        arm["vs_base"].update(weighted=w.get("preference"), weighted_95=w.get("ci95"),
                              weighted_p=w.get("p_value"), weighted_p_holm=w.get("p_holm"),
                              lc_win_rate=w.get("lc_win_rate"))


def compare_markdown(report: dict) -> str:
    lines = ["# WIM vs numeric: side-by-side arms", "", *header_lines(report),
             *weighted_lines(report), *power_lines(report), *primary_lines(report)]
    lines += ["All arms share one generation and one judging pass (`shared/`); only scoring, "
              "pairing and training differ (same seed, same steps). Tie rate and mean absolute "
              "delta are over pairs of samples of one prompt on the 1-10 scale. Usable pairs "
              "per 1,000 judge tokens is the cost of each arm's training data. Against the "
              "base: the weighted win rate (the evaluator's probability that the arm is "
              "better, both orders averaged) with the t-test's own 95% interval and p; the "
              "hard win rate counts ties as half (paired bootstrap 95%); the sign test leaves "
              "ties out (decisive rate, exact Clopper-Pearson 95%, its unadjusted p and the "
              "p Holm-adjusted over every comparison).", ""]
    rows = []
    for a in report["arms"]:
        v = a["vs_base"]
        f = fmt_value
        rows.append([a["name"], f(a["zeta"], digits=2), f(a["tie_rate"]), f(a["delta"]),
                     a["pairs_kept"], f(a["usable_pairs_per_1k_judge_tokens"], digits=2),
                     f"{f(a['loss_first'])} -> {f(a['loss_last'])}",
                     f(a["reward_margin_last"]), f(v.get("weighted")),
                     f(v.get("weighted_95")), pval(v.get("weighted_p_holm")), f(v["win_rate"]),
                     f(v["bootstrap_95"]), f(v["decisive_rate"]), f(v["decisive_95"]),
                     pval(v["p_value"]), pval(v["p_holm"])])
    lines += markdown_table(
        ["arm", "zeta", "tie rate", "delta", "pairs kept", "pairs / 1k judge tokens",
         "loss first -> last", "reward margin last", "weighted win rate vs base", "t 95%",
         "weighted p (Holm)", "win rate vs base (ties half)", "paired bootstrap 95%",
         "decisive rate (ties out)", "Clopper-Pearson 95%", "sign-test p", "p (Holm)"], rows)
    lines += ["", "The random arm is the control: the WIM arm's pairs with chosen and rejected "
              "swapped by a seeded coin.", "", "**Every comparison (Holm family)** (blind "
              f"evaluator: `{report['evaluator']['model']}`, {report['evaluator']['mode']}; "
              f"{report['held_out_prompts']} held-out prompts)", "", WEIGHTED_LEGEND, "",
              *weighted_table(report["comparisons"]), "", LEGEND, "",
              *comparison_table(report["comparisons"]), ""]
    return "\n".join(lines)
