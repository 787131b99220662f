"""One run directory -> report.json (flat metric keys), report.md, report.html, plots/*.png.

What a caller relies on:
- the report is rebuilt from the run directory alone, every time (`write_report`): each stage's
  stats file (from wim/stages.py's table, its `fingerprint` dropped), then one streaming pass
  over judgements.jsonl and scores.jsonl for the judge and pair statistics (counters, never the
  records in a list); a run without scores.jsonl is a clear error naming `wim score`;
- costs are priced at the config's prices now, not those stored by each stage;
- report.json has one writer, `write_report_json`;
- with the bundled 135M judge, report.md and report.html say that its numbers show the stages
  run, not that WIM beats numeric ratings (`SMALL_JUDGE_NOTE`).
"""

from __future__ import annotations

import json
import math
from typing import Any

from wim import stages
from wim.config import Config
from wim.markdown import fmt_value, markdown_table, md_cell
from wim.metrics import JudgeStatistics, PairStatistics, domain_name
from wim.pricing import run_costs
from wim.records import RecordIndex, iter_keyed
from wim.report.sections import (
    agreement_lines,
    collect_rounds,
    evaluation_lines,
    read_agreement,
    read_run_json,
    rounds_lines,
    source_lines,
    tie_delta_table,
)
from wim.rundir import EVAL, REPORT, REPORT_HTML, REPORT_MD, SCORES, RunDir

SMALL_JUDGES = ("bundled:smollm2-135m-instruct",)
SMALL_JUDGE_NOTE = (
    "The judge here is SmolLM2-135M, a 135M-parameter model. It writes fluent text but cannot "
    "really judge: its ratings and critiques are close to noise, so these numbers show that "
    "every stage runs for real (parsing, scoring, tie and delta statistics, training), not that "
    "WIM beats numeric ratings. For quality claims, set `judge.role: external` with a strong "
    "model (for example over HTTP: `judge.backend: http`, `http.base_urls`)."
)


def collect_metrics(cfg: Config, run: RunDir) -> dict[str, Any]:
    report: dict[str, Any] = {}
    for stage in stages.STAGES:
        if stage.reads_stats:  # the report itself
            continue
        path = run.stats_file(stage.name)
        if path.exists():
            stats = json.loads(path.read_text())
            stats.pop("fingerprint", None)  # for skipping finished stages, not a metric
            report.update(stats)
    # Priced at the config's prices now (a stage's stats hold the cost at its own run's).
    report = {k: v for k, v in report.items() if not k.startswith("cost/")}
    report.update(run_costs(cfg, report))
    # One streaming pass over each file: counters, never the records.
    judge, judge_model, served = JudgeStatistics(), None, set()
    for number, (_, j) in enumerate(iter_keyed(run.judgements)):
        judge.add(j)
        judge_model = j["judge_model"] if number == 0 else judge_model
        if j.get("judge_served_model"):
            served.add(j["judge_served_model"])
    scores = RecordIndex(run.scores)
    if not len(scores):
        run.require(SCORES, "wim score")  # the clear error: nothing to report on
    pairs = PairStatistics(cfg.scoring.zeta, cfg.scoring.report_zetas, cfg.pairs.tie_tolerance)
    for group in scores.groups():
        pairs.add(group)
    report.update(judge.result())
    report.update(pairs.result())
    report.update({"tokens/generated": report.get("tokens/policy/out", 0),
                   "judge/role": cfg.judge.role, "judge/model": judge_model,
                   "judge/mode": cfg.judge.mode, "policy/model": cfg.policy.model,
                   "score/embedder": cfg.scoring.embedder, "judge/prompt": cfg.judge.prompt,
                   "score/on_parse_failure": cfg.judge.on_parse_failure,
                   "score/zeta": cfg.scoring.zeta})
    if served:
        report["judge/served_model"] = ", ".join(sorted(served))
    agreement = read_agreement(run)
    for system, row in (agreement or {}).get("systems", {}).items():
        for key in ("accuracy", "tie_share", "n", "failures"):
            report[f"agreement/{system}/{key}"] = row.get(key)
    rounds = collect_rounds(cfg, run, report.get("rounds"))
    if rounds:
        report["rounds"] = rounds
    return report


def write_report_json(run: RunDir, report: dict[str, Any]) -> dict[str, Any]:
    """report.json, the one writer (the run's, the rounds' and online DPO's): sorted keys,
    NaN as null so that any JSON reader takes it. Returns what was written."""
    clean = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in report.items()}
    run.file(REPORT).write_text(json.dumps(clean, indent=2, sort_keys=True))
    return clean


def write_report(cfg: Config, run: RunDir) -> dict[str, Any]:
    """Rebuild report.json, plots/*.png, report.md and report.html from the run directory."""
    from wim.report.browser import browser_entries
    from wim.report.page import render_html
    from wim.report.plots import make_plots

    clean = write_report_json(run, collect_metrics(cfg, run))
    evaluation = read_evaluation(run)
    plots = make_plots(cfg, run, clean, evaluation)
    markdown = render_markdown(clean, cfg, plots, evaluation, read_agreement(run))
    run.file(REPORT_MD).write_text(markdown)
    entries, prompts = browser_entries(run, cfg.scoring.zeta, cfg.pairs.tie_tolerance,
                                       cfg.report.browser_prompts, cfg.seed)
    run.file(REPORT_HTML).write_text(render_html(
        markdown, run.path, entries, small_judge=clean.get("judge/model") in SMALL_JUDGES,
        total_prompts=prompts))
    return clean


def read_evaluation(run: RunDir) -> dict[str, Any] | None:
    """DIR/eval.json (written by `wim eval`), checked for the keys the report reads."""
    return read_run_json(run, EVAL, "wim eval",
                         lambda d: (isinstance(d, dict) and isinstance(d.get("comparisons"), list)
                                    and all(isinstance(c, dict) for c in d["comparisons"])),
                         "an object with a 'comparisons' list of objects")


def _summary_lines(r: dict[str, Any]) -> list[str]:
    """Who judged what, and what happened to the judgements."""
    lines = [
        "# WIM run report",
        "",
        f"Policy {md_cell(r['policy/model'])}; judge {md_cell(r['judge/model'])} "
        f"(role {r['judge/role']}, mode {r['judge/mode']}, prompt {r['judge/prompt']}); "
        f"embedder `{r['score/embedder']}`.",
        "",
    ]
    if r.get("judge/model") in SMALL_JUDGES:
        lines += [f"> **Read this first.** {SMALL_JUDGE_NOTE}", ""]
    return lines + source_lines(r) + [
        f"Judged {r.get('judge/count', 0)} samples; {r.get('judge/parse_failed', 0)} failed to "
        f"parse after retries ({fmt_value(r.get('judge/parse_fail_rate'), True)}), of which "
        f"{r.get('judge/echoed_rubric', 0)} echoed the rubric instead of a critique "
        f"({fmt_value(r.get('judge/echoed_rubric_rate'), True)} of all judgements); "
        f"{r.get('judge/echoed_rubric_any_attempt', 0)} "
        f"({fmt_value(r.get('judge/echoed_rubric_any_attempt_rate'), True)}) echoed it on at "
        "least one attempt and were asked again. "
        + _failure_sentence(r) +
        f"{r.get('judge/backend_failed', 0)} lost to backend failures (judged again on the "
        "next run). "
        f"{r.get('pairs/count', 0)} preference pairs; ties dropped/kept: "
        f"{r.get('pairs/ties_dropped', 0)}/"
        f"{r.get('pairs/ties_kept_first', 0) + r.get('pairs/ties_kept_random', 0)}.",
        "",
        f"Overlong inputs (cut from the middle / skipped): prompts "
        f"{r.get('generate/truncated', 0)}/{r.get('generate/skipped_overlong', 0)}, judge inputs "
        f"{r.get('judge/truncated', 0)}/{r.get('judge/skipped_overlong', 0)}; empty responses "
        f"{r.get('generate/empty', 0)}.",
        "",
    ]


def render_markdown(r: dict[str, Any], cfg: Config, plots: list[tuple[str, str]],
                    evaluation: dict[str, Any] | None = None,
                    agreement: dict[str, Any] | None = None) -> str:
    """The report as markdown; `plots` are (file, caption) pairs; `evaluation` is eval.json;
    `agreement` is agreement.json."""
    systems = [("numeric", "numeric (rating)"), ("wim", "WIM (similarity)"),
               ("mixed", f"mixed (zeta={cfg.scoring.zeta:g})")]
    systems = [(s, label) for s, label in systems if f"pairs/tie_rate/{s}" in r]
    # The answer to "did training help?" (with its power and warnings) comes first.
    lines = _summary_lines(r) + evaluation_lines(evaluation) + [
        "## Numeric vs WIM vs mixed (one judging pass, 1-10 scale)", ""]
    rows = [("tie rate (within-prompt sample pairs)", "tie_rate", True),
            ("mean abs delta", "delta", False),
            ("mean best-worst delta", "delta_best_worst", False),
            ("prompts with no usable pair", "no_pair_share", True),
            ("agreement with numeric (non-tied pairs)", "agreement", True)]
    lines += markdown_table(["metric", *(label for _, label in systems)], [
        [label, *("-" if key == "agreement" and s == "numeric"
                  else fmt_value(r.get(f"pairs/{key}/{s}"), pct) for s, _ in systems)]
        for label, key, pct in rows])
    zetas = [z for z in cfg.scoring.report_zetas if f"zeta/{z:g}/tie_rate" in r]
    if zetas:
        lines += ["", "## zeta sweep", "", *markdown_table(
            ["zeta", "tie rate", "mean abs delta", "agreement"],
            [[f"{z:g}", fmt_value(r[f"zeta/{z:g}/tie_rate"], True),
              fmt_value(r[f"zeta/{z:g}/delta"]),
              fmt_value(r.get(f"zeta/{z:g}/agreement"), True)] for z in zetas])]
    # Keys are domain/<name>/<metric>/<system>, the name percent-encoded (wim.metrics).
    domains = sorted({k.split("/")[1] for k in r if k.startswith("domain/")})
    if domains:
        rows = [([md_cell(domain_name(d) or "(none)")], r, f"domain/{d}/") for d in domains]
        lines += ["", "## Per domain", "",
                  *tie_delta_table(["domain"], [s for s, _ in systems], rows)]
    lines += agreement_lines(agreement)
    units = {"cost/": "currency of http.price", "tokens/": "tokens",
             "time/": "seconds (wall clock)", "http/": "count"}
    costs = sorted(k for k in r if k.startswith(tuple(units)))
    lines += ["", "## Cost and time", "", *_cost_lines(r), *markdown_table(
        ["what", "value", "unit"],
        [[key, f"{r[key]:.6g}" if key.startswith("cost/") else fmt_value(r[key]),
          units[key.split("/")[0] + "/"]] for key in costs])]
    if "train/steps" in r:
        lines += ["", "## Training (TRL DPO, LoRA)", "",
                  f"{r['train/steps']} steps on {r.get('train/pairs')} pairs; loss "
                  f"{fmt_value(r.get('train/loss_first'))} -> "
                  f"{fmt_value(r.get('train/loss_last'))}; "
                  f"LoRA weight change (L2) {fmt_value(r.get('train/lora_delta_norm'))}."]
    lines += rounds_lines(r.get("rounds"))
    if plots:
        lines += ["", "## Plots"]
    for path, caption in plots:
        lines += ["", f"![{md_cell(caption)}]({path})"]
    return "\n".join(lines) + "\n"


def _cost_lines(r: dict[str, Any]) -> list[str]:
    """What the run cost where prices are set (wim/pricing.py), or why none is shown."""
    if "cost/total" not in r:  # said only where a server answered (its http/ counts)
        return ["No cost shown: no `http.price` is set for the roles served over HTTP (tokens "
                "are as the servers' `usage` reported them).", ""] if any(
                    k.startswith("http/") for k in r) else []
    parts = ", ".join(f"{key.split('/')[1]} {r[key]:.6g}" for key in sorted(r)
                      if key.startswith("cost/") and key != "cost/total")
    return [f"Cost {r['cost/total']:.6g} ({parts}), at the prices in the config; cached prompt "
            "tokens at `cached_input`, reasoning tokens as output, batch-answered judgements "
            "with `batch_discount` off.", ""]


def _failure_sentence(r: dict[str, Any]) -> str:
    if r.get("score/on_parse_failure") != "authors":
        return "Failed judgements are left out of ranking. "
    return (f"As in the authors' code, failed judgements are still scored: "
            f"{r.get('score/fallback_rating', 0)} with an unparseable rating counted as "
            f"rating_norm 0, {r.get('score/fallback_critique', 0)} without a critique scored by "
            "the rating alone. ")

