"""`wim refine`: one hard-cap master trajectory per question, then every policy from it.

Each attempt, for all questions at once (batched), is one candidate from the retained answer
and E_L's feedback on it, evaluated, voted on (when the VRR policies are on) and accepted or
not by the controller. Every attempt, score, decision with its reason, and token count goes to
DIR/refine/trajectories.jsonl; the policies, the blind outcome and the statistics follow in
wim/refine/summary.py. The run is not resumable: a killed run starts again from attempt 0.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from wim.backends import Backend, SamplingParams, open_backend
from wim.config import Config
from wim.judges import configured_judge
from wim.records import write_records_atomic
from wim.refine.controller import CRITERIA, ControllerParams, aggregate, decide, penalized
from wim.refine.evaluator import LoopEvaluation, LoopEvaluator

logger = logging.getLogger(__name__)

FEEDBACK = ("Feedback on your answer:\n- What is missing: {critique}\n- Weakest points: "
            "{weak}\nRewrite your answer to the question so that it fixes these points. Reply "
            "with the improved answer only.")


def open_models(cfg: Config) -> tuple[Backend, LoopEvaluator, str]:
    """The generator's backend, E_L (same model as G, or another one) and E_L's name."""
    policy = open_backend(cfg.policy.backend, cfg.policy.model, cfg.http,
                          batch_size=cfg.generation.batch_size, adapter=cfg.policy.adapter,
                          dtype=cfg.policy.dtype)
    r, j = cfg.refine, cfg.judge
    name = cfg.policy.model if r.evaluator == "same" else r.evaluator
    backend = policy if r.evaluator == "same" else open_backend(
        r.evaluator_backend, r.evaluator, cfg.http, batch_size=j.batch_size, dtype=j.dtype)
    judge = configured_judge(j, backend, role="external", model_name=name, mode="wim")
    evaluator = LoopEvaluator(backend, judge, strict=r.strict, ensemble_n=r.ensemble_n,
                              max_retries=r.max_retries, retry_temperature=j.retry_temperature)
    return policy, evaluator, name


def feedback_message(ev: LoopEvaluation) -> str:
    scores = ev.evaluation.scores
    weak = (", ".join(sorted(CRITERIA, key=lambda c: scores[c])[:2]).replace("_", " ")
            if scores else "not known")
    return FEEDBACK.format(critique=(ev.critique or "nothing noted").strip(), weak=weak)


def run_master(cfg: Config, prompts, policy: Backend, evaluator: LoopEvaluator,
               progress: bool = True) -> list[list[dict[str, Any]]]:
    """The master trajectory of every prompt: records of attempts 0..max_attempts."""
    from tqdm.auto import tqdm

    r, g = cfg.refine, cfg.generation
    params = ControllerParams(gamma=r.gamma, tau_c=r.tau_c, critical_guard=r.critical_guard,
                              penalties={k: dict(v) for k, v in r.penalties.items()})
    questions = [p.text for p in prompts]
    convs = [list(p.messages) for p in prompts]
    gen = SamplingParams(g.max_new_tokens, g.temperature, g.top_p)
    records: list[list[dict[str, Any]]] = [[] for _ in prompts]
    retained: list[int] = [0] * len(prompts)
    for t in tqdm(range(r.max_attempts + 1), desc="refine attempts", disable=not progress):
        held = [recs[k] for recs, k in zip(records, retained, strict=True)] if t else []
        asks = convs if t == 0 else [
            c + [{"role": "assistant", "content": h["answer"]},
                 {"role": "user", "content": feedback_message(h["_eval"])}]
            for c, h in zip(convs, held, strict=True)]
        seed = cfg.seed * 1000 + t
        outs = [o[0] for o in policy.generate(asks, gen, seed=seed)]
        answers = [o.text.strip() if o.ok else "" for o in outs]
        evals = evaluator.evaluate(questions, answers, seed=seed)
        votes = (evaluator.votes(questions, answers, r.vrr.m, r.vrr.vote_temperature, seed=seed)
                 if r.vrr.enabled else [(None, 0, 0)] * len(answers))
        for i, (o, ev, vote) in enumerate(zip(outs, evals, votes, strict=True)):
            rec = _record(prompts[i].id, t, answers[i], o, ev, vote, params)
            if t > 0:
                d = decide(held[i]["_eval"].evaluation, ev.evaluation, params)
                if d.accept:
                    retained[i] = t
                rec["decision"] = dataclasses.asdict(d)
            rec["retained_attempt"] = retained[i]
            records[i].append(rec)
        logger.info("attempt %d of %d done: %d of %d candidates retained so far", t,
                    r.max_attempts, sum(k > 0 for k in retained), len(prompts))
    return records


def _record(prompt_id: str, t: int, answer: str, out, ev: LoopEvaluation, vote,
            params: ControllerParams) -> dict[str, Any]:
    e = ev.evaluation
    accepts, vote_tokens, redone = vote
    return {
        "prompt_id": prompt_id, "attempt": t, "answer": answer,
        "generation_error": None if out.ok else out.error,
        "scores": e.scores, "verdict": e.verdict, "flags": list(e.flags),
        "penalized": penalized(e, params.penalties) if e.scores else None,
        "aggregate": aggregate(penalized(e, params.penalties)) if e.scores else None,
        "critique": ev.critique, "wim_rating": ev.wim_rating,
        "evaluation_failure": ev.failure, "evaluation_attempts": ev.attempts,
        "evaluator_raw": ev.raw, "accepts": accepts, "votes_reasked": redone,
        "decision": None,
        "tokens": {"generate": out.prompt_tokens + out.completion_tokens,
                   "evaluate": ev.tokens, "votes": vote_tokens},
        "_eval": ev,
    }


def write_trajectories(path: Path, records: list[list[dict[str, Any]]]) -> None:
    rows = [{k: v for k, v in rec.items() if k != "_eval"} for recs in records for rec in recs]
    write_records_atomic(path, rows)
