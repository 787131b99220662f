"""`wim eval DIR`: the trained policy against its base (and other runs) on held-out prompts.

Each system answers the held-out prompts of DIR (`prompts.holdout`, DIR/split.json) once; the
blind evaluator (wim/blind.py) compares two systems' answers prompt by prompt, and
wim/statistics.py gives the win rates. Written: DIR/eval.json, DIR/eval.md, and for audit
DIR/eval/answers.jsonl and DIR/eval/verdicts.jsonl. As the eval stage of `wim run` it runs
after train when the config holds prompts out and `eval.in_run` is on.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from data_gen.pipeline import Resources
from data_gen.stages import Shard
from wim.backends import SamplingParams, TransformersBackend, open_backend
from wim.blind import BlindEvaluator, copied_placeholder, open_blind_evaluator
from wim.blind_verdicts import PairVerdict
from wim.config import Config
from wim.context import fit_messages, token_budget
from wim.errors import InputError
from wim.holdout import load_split, read_split, write_split
from wim.prompts import Prompt
from wim.records import read_keyed
from wim.report.evaluation import evaluation_body, figure_lines
from wim.rundir import EVAL, EVAL_AUDIT_FOLDER, EVAL_MD, PLOTS_FOLDER, SPLIT, RunDir
from wim.statistics import (
    MECHANICAL_WARNING,
    Outcomes,
    is_bundled,
    outcome_of,
    power_of,
    summarize_comparison,
    weighted_power,
    with_holm,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class System:
    """A model that answers the held-out prompts: base weights plus an optional adapter."""

    name: str
    model: str
    adapter: str | None = None


def held_out_prompts(cfg: Config, run: RunDir, limit: int | None = None) -> list[Prompt]:
    """The prompts DIR held out of training, checked against its samples; at most `limit`."""
    p = cfg.prompts
    train, held = load_split(p.source, p.split, p.limit, p.holdout)
    split = read_split(run.path)
    if split is None:
        # No split.json here (rounds and online runs generate elsewhere): the same rule.
        write_split(run.path, train, held)
    else:
        by_id = {q.id: q for q in (*train, *held)}
        missing = [i for i in split["holdout"] if i not in by_id]
        if missing:
            raise InputError(f"{run.file(SPLIT)} names held-out prompt(s) {missing[:3]} "
                             f"that prompts.source '{p.source}' does not hold.")
        held = [by_id[i] for i in split["holdout"]]
    if not held:
        raise InputError(
            f"{run.path} has no held-out prompts (prompts.holdout is 0), so there is nothing "
            "that training never saw. Start a run with held-out prompts, e.g. `wim run CONFIG "
            "--out DIR --set prompts.holdout=16`."
        )
    check_unseen(held, run)
    return held[:limit] if limit else held


def check_unseen(held: list[Prompt], run: RunDir) -> None:
    """Refuse held-out prompts that the run (any of its rounds) generated samples for."""
    for r in run.round_runs():
        seen = {rec["prompt"] for rec in read_keyed(r.samples)}
        leaked = [q.id for q in held if q.text in seen]
        if leaked:
            raise InputError(
                f"held-out prompt(s) {leaked[:3]} have samples in {r.samples}, so training saw "
                "them; evaluate on prompts that run never used."
            )


def generate_answers(cfg: Config, systems: list[System], prompts: list[Prompt],
                     progress: bool = True) -> dict[str, list[dict]]:
    """{system name: one answer record per prompt}. One model in memory at a time; a system
    without an adapter reuses the model loaded just before it when the weights are the same
    (its adapter switched off: `reference_view`), so list the base after a trained system."""
    g, e = cfg.generation, cfg.eval
    params = SamplingParams(e.max_new_tokens or g.max_new_tokens, e.temperature, g.top_p)
    current: tuple[str, TransformersBackend] | None = None
    out = {}
    for system in tqdm(systems, desc="eval answers", unit="system", disable=not progress):
        if cfg.policy.backend == "http" and cfg.http.adapter_serving == "vllm":
            # Each system answers on the policy's server, by its adapter's served name.
            backend = open_backend("http", cfg.policy.model, cfg.http, adapter=system.adapter)
            served = backend.model if system.adapter else cfg.http.model  # the base: as set
            with contextlib.closing(backend):
                out[system.name] = _answer(backend, cfg, prompts, params, system, served)
            continue
        if system.adapter is None and current is not None and current[0] == system.model:
            backend = current[1].reference_view()
        else:
            current = None  # free the previous model before loading the next
            backend = open_backend("transformers", system.model, batch_size=g.batch_size,
                                   adapter=system.adapter, dtype=cfg.policy.dtype)
            current = (system.model, backend)
        out[system.name] = _answer(backend, cfg, prompts, params, system)
    return out


def _answer(backend, cfg: Config, prompts: list[Prompt], params, system: System,
            served: str | None = None) -> list[dict]:
    g = cfg.generation
    budget = token_budget(backend.context_tokens, params.max_new_tokens, g.max_prompt_tokens)
    convs = [fit_messages(list(p.messages), budget, "truncate", backend.count_tokens)[0]
             or list(p.messages) for p in prompts]
    outs = backend.generate(convs, params, n=1, seed=cfg.seed)
    extra = {"served_model": served} if served else {}
    return [{"system": system.name, "model": system.model, "adapter": system.adapter,
             "prompt_id": p.id, "response": o[0].text, "completion_tokens":
             o[0].completion_tokens, **extra} for p, o in zip(prompts, outs, strict=True)]


def blind_comparisons(evaluator: BlindEvaluator, mode: str, prompts: list[Prompt],
                      answers: dict[str, list[dict]],
                      pairs: list[tuple[str, str, str]]) -> tuple[dict[str, Outcomes], list]:
    """({comparison name: Outcomes}, verdict records) for (name, a, b) triples. A record keeps
    both orders' verdicts (`order_ab`: a shown first; `order_ba`: b shown first)."""
    questions = [p.text for p in prompts]
    texts = {name: [r["response"] for r in records] for name, records in answers.items()}
    names = sorted({s for _, a, b in pairs for s in (a, b)}) if mode == "pointwise" else []
    points = {name: evaluator.pointwise(questions, texts[name]) for name in names}
    results, records = {}, []
    for name, a, b in pairs:
        if mode == "pointwise":
            verdicts = [_from_points(pa, pb, ta.strip() == tb.strip()) for pa, pb, ta, tb in
                        zip(points[a], points[b], texts[a], texts[b], strict=True)]
        else:
            verdicts = evaluator.pairwise(questions, texts[a], texts[b])
        rows, by_orders = [], []  # this comparison's records; each one's (P_ab, P_ba)
        for p, v in zip(prompts, verdicts, strict=True):
            both = mode == "pairwise" and None not in v.orders
            pref, by_order, source = _preference(v, mode)
            by_orders.append(by_order)
            rows.append({"comparison": name, "a": a, "b": b, "prompt_id": p.id,
                         "domain": p.domain, "winner": v.winner, "failure": v.failure,
                         "order_ab": v.orders[0], "order_ba": v.orders[1],
                         "orders_agree": v.orders[0] == v.orders[1] if both else None,
                         "tie_kind": v.tie_kind, "preference": pref,
                         "p_ab": by_order[0] if by_order else None,
                         "p_ba": by_order[1] if by_order else None,
                         # each order's probabilities of its own A / B / tie
                         "probs_ab": v.probs[0], "probs_ba": v.probs[1],
                         "preference_source": source, "raw": v.raw, "tokens": v.tokens})
        records += rows
        done = [i for i, r in enumerate(rows) if r["winner"] is not None]
        results[name] = Outcomes(
            [outcome_of(rows[i]["winner"]) for i in done],
            [float(len(texts[a][i]) - len(texts[b][i])) for i in done],
            failures=len(rows) - len(done),
            tie_kinds=[rows[i]["tie_kind"] for i in done if rows[i]["tie_kind"]],
            order_agreement=[r["orders_agree"] for r in rows if r["orders_agree"] is not None],
            preferences=[rows[i]["preference"] for i in done],
            order_preferences=[by_orders[i] for i in done],
            sources=[rows[i]["preference_source"] for i in done],
            prompt_ids=[rows[i]["prompt_id"] for i in done])
    return results, records


def _preference(v: PairVerdict, mode: str):
    """(weighted preference for a, (P_ab, P_ba) or None, source) of one verdict; all None
    for a failed one. Pointwise verdicts have no orders: the outcome is the preference."""
    if v.winner is None:
        return None, None, None
    if mode == "pointwise":
        return outcome_of(v.winner), None, "pointwise"
    source = v.sources[0] if v.sources[0] == v.sources[1] else "hard"
    return v.preference, v.order_preferences, source


def _from_points(pa, pb, identical: bool) -> PairVerdict:
    """A pair verdict from two pointwise scores (no orders: each answer is scored alone)."""
    raw, tokens = pa.raw + pb.raw, pa.tokens + pb.tokens
    if pa.score is None or pb.score is None:
        failure = "; ".join(f for f in (pa.failure, pb.failure) if f)
        return PairVerdict(None, failure, raw, tokens)
    winner = "a" if pa.score > pb.score else "b" if pb.score > pa.score else "tie"
    # Equal scores are a real tie: the evaluator gave both the same score.
    return PairVerdict(winner, None, raw, tokens, orders=("tie", "tie") if winner == "tie"
                       else (None, None), identical=identical and winner == "tie")


def eval_report(cfg: Config, evaluator: BlindEvaluator, outcomes: dict[str, Outcomes],
                pairs: list[tuple[str, str, str]], systems: list[System],
                records: list[dict], n_prompts: int, primary: str | None = None) -> dict:
    """The eval.json document: every comparison, Holm over all; `primary` (default: the first)
    first. `min_attainable_p_holm` says whether any result of this size could be significant."""
    comparisons = with_holm([
        summarize_comparison(name, a, b, outcomes[name], seed=cfg.seed,
                             resamples=cfg.eval.bootstrap_resamples) for name, a, b in pairs])
    primary = primary or pairs[0][0]
    comparisons.sort(key=lambda c: c["name"] != primary)  # stable: the primary first
    for c in comparisons:
        c["primary"] = c["name"] == primary
    weighted = comparisons[0].get("weighted") or {}
    power = weighted_power(weighted.get("n", 0), weighted.get("sd"), len(comparisons))
    bundled = is_bundled(evaluator.model_name) or any(is_bundled(s.model) for s in systems)
    mode = cfg.blind.mode
    return {
        "evaluator": {"model": evaluator.model_name, "mode": mode,
                      "verdict": evaluator.verdict if mode == "pairwise" else "pointwise",
                      "backend": cfg.blind.backend, "max_retries": cfg.blind.max_retries,
                      "dtype": getattr(evaluator.backend, "dtype", None),
                      # Only when weighted verdicts were asked for and turned hard (blind.py).
                      **({"verdict_note": evaluator.verdict_note}
                         if getattr(evaluator, "verdict_note", None) else {})},
        "mechanical_warning": MECHANICAL_WARNING if bundled else None,
        "held_out_prompts": n_prompts,
        "primary": primary,
        **power_of(n_prompts, len(comparisons)),
        **power,
        # Prompts whose preference fell back to a hard verdict in at least one order (the
        # evaluator's backend gave no token probabilities there), over every comparison.
        "hard_fallback": sum(r.get("preference_source") == "hard" for r in records)
        if evaluator.verdict == "weighted" and mode == "pairwise" else 0,
        "systems": {s.name: {"model": s.model, "adapter": s.adapter} for s in systems},
        "evaluator_tokens": sum(r["tokens"] for r in records),
        "backend_failures": sum("backend failed" in (r["failure"] or "") for r in records),
        **_budget_exhausted(records),
        # Attempts whose text copied a template placeholder (each was asked again).
        "placeholder_copies": sum(copied_placeholder(t, mode) is not None
                                  for r in records for t in r["raw"]),
        "comparisons": comparisons,
    }


def _budget_exhausted(records: list[dict]) -> dict:
    """Verdicts whose reply spent blind.max_new_tokens before any verdict (a reasoning
    evaluator): their count and the last one's message; {} when none."""
    cut = [r["failure"] for r in records if "budget exhausted" in (r["failure"] or "")]
    return {"budget_exhausted": len(cut), "budget_note": cut[-1]} if cut else {}


def write_eval(folder: Path, report: dict, answers: dict[str, list[dict]],
               records: list[dict]) -> None:
    from wim.report.plots import plot_preferences

    write_audit(folder, answers, records)
    (folder / EVAL).write_text(json.dumps(report, indent=2))
    # The primary comparison's preferences, drawn (when there are any) for eval.md to lead with.
    primary = next((c for c in report["comparisons"] if c.get("primary")), {})
    (folder / PLOTS_FOLDER).mkdir(exist_ok=True)
    picture = f"{PLOTS_FOLDER}/eval_preferences.png"
    drawn = plot_preferences(primary, folder / picture)
    (folder / EVAL_MD).write_text(eval_markdown(report, picture if drawn else None))


def write_audit(folder: Path, answers: dict[str, list[dict]], records: list[dict]) -> None:
    """Every answer and every verdict record: FOLDER/eval/answers.jsonl and verdicts.jsonl."""
    (folder / EVAL_AUDIT_FOLDER).mkdir(parents=True, exist_ok=True)
    for name, rows in (("answers", [r for rs in answers.values() for r in rs]),
                       ("verdicts", records)):
        rows_text = "".join(json.dumps(r) + "\n" for r in rows)
        (folder / EVAL_AUDIT_FOLDER / f"{name}.jsonl").write_text(rows_text)


def eval_markdown(report: dict, picture: str | None = None) -> str:
    ev = report["evaluator"]
    about = [f"Evaluator: `{ev['model']}` ({ev['mode']}, {ev.get('verdict', 'hard')} verdicts; "
             f"it saw only each question and the answers). Held-out prompts: "
             f"{report['held_out_prompts']}. Attempts that copied the template's placeholder "
             f"(asked again): {report.get('placeholder_copies', 0)}.", ""]
    # The weighted lead first, then its picture (the report's section leads with the picture).
    return "\n".join(["# Blind evaluation", "",
                      *evaluation_body(report, [*figure_lines(picture), *about])])


def compare_systems(cfg: Config, systems: list, prompts: list, pairs: list, progress: bool,
                    primary: str | None = None):
    """Answers from every system, blind verdicts on every pair, the report (Holm over all):
    (report, answers, verdict records). `primary`: the pre-specified comparison."""
    answers = generate_answers(cfg, systems, prompts, progress)
    with contextlib.closing(open_blind_evaluator(cfg)) as evaluator:
        outcomes, records = blind_comparisons(evaluator, cfg.blind.mode, prompts, answers, pairs)
    report = eval_report(cfg, evaluator, outcomes, pairs, systems, records, len(prompts), primary)
    return report, answers, records


def evaluate_run(cfg: Config, run: RunDir, against: list[RunDir] = (), limit: int | None = None,
                 progress: bool = True) -> dict:
    """Evaluate DIR's policy against its base and against each `against` run's policy."""
    prompts = held_out_prompts(cfg, run, limit or cfg.eval.limit)
    systems = [System("policy", cfg.policy.model, str(run.final_adapter())),
               System("base", cfg.policy.model, None)]
    pairs = [("policy vs base", "policy", "base")]
    for other in against:
        check_unseen(prompts, other)
        name = f"policy of {other.path.name}"
        systems.append(System(name, other.load_config().policy.model, str(other.final_adapter())))
        pairs.append((f"policy vs {name}", "policy", name))
    report, answers, records = compare_systems(cfg, systems, prompts, pairs, progress)
    write_eval(run.path, report, answers, records)
    return report


def run_stage(cfg: Config, run: RunDir, res: Resources, shard: Shard | None, progress: bool,
              fingerprint: str) -> dict[str, Any]:
    """The trained policy against its base on the held-out prompts (eval.json)."""
    if not (cfg.eval.in_run and cfg.prompts.holdout > 0):
        logger.info("stage eval: %s; not run", "eval.in_run is false" if not cfg.eval.in_run
                    else "nothing held out (prompts.holdout is 0)")
        return {}
    start = time.perf_counter()
    report = evaluate_run(cfg, run, progress=progress)
    primary = report["comparisons"][0]
    stats = {"eval/win_rate": primary["win_rate"], "eval/p_value": primary["p_value"],
             "eval/order_agreement": primary["order_agreement"],
             "eval/min_attainable_p_holm": report["min_attainable_p_holm"],
             "time/eval": time.perf_counter() - start}
    run.write_stats("eval", stats)
    return stats
