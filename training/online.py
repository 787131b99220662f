"""Online DPO (`training.mode: online`): TRL's OnlineDPOTrainer with the WIM score as reward.

Each step the live policy samples two completions per prompt; the judge (`judge.role: fixed`:
the same weights with the adapter off; `changing`: the live model, adapter on) judges both, and
their WIM score (`scoring.zeta`, the same formula and embedder as offline) is the reward. The
higher score is chosen.

What TRL does not do, done here (the trainer, training/online_trainer.py, takes each pair's
verdict from `WimReward.take_choice()`):
- Ties. Two scores within `pairs.tie_tolerance` on the 1-10 scale tie (TRL compares exactly).
  `training.online_tie_policy: first` trains the tie with the first completion as chosen (the
  authors' code); `drop` takes the pair out of the loss. Either way the ties are counted
  (`wim/ties` per step; `online/ties` in total).
- Failed judgements. TRL turns a None reward into NaN and then into 0, a silent neutral score.
  Here the reward function never returns None: with `judge.on_parse_failure: exclude` a pair
  with a failed judgement is taken out of the loss; with `authors` it is scored by the authors'
  fallback. Both are counted (`wim/failed`, `wim/fallback`).
- The paper's statistics per step, from the same judgements: tie rate and winner-loser delta
  for numeric (the rating) and WIM (the similarity), on the 1-10 scale (wim/metrics.py).
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from pathlib import Path
from typing import Any

from wim.config import Config
from wim.metrics import SystemSummary
from wim.pairs import choose
from wim.rundir import LOG_HISTORY, ONLINE_JUDGEMENTS, ONLINE_STEPS, TRAIN_METRICS, RunDir

# The systems online DPO reports per step: the mixed score is the reward itself.
SYSTEMS = ("numeric", "wim")


def choose_pair(a: float | None, b: float | None, tolerance: float, tie_policy: str
                ) -> tuple[bool, bool, bool]:
    """(first_chosen, keep, tie) for completions scored a and b by `wim.pairs.choose`; a pair
    with a failed judgement (None) has no verdict and is dropped."""
    if a is None or b is None:
        return True, False, False
    a_chosen, tie = choose(a, b, tolerance, tie_policy)
    return a_chosen is not False, a_chosen is not None, tie


class WimReward:
    """The reward function: judge and score each completion, decide each pair (i, i + B) for
    `take_choice`, and append every judgement to `judgements_path`."""

    __name__ = "wim_reward"

    def __init__(self, cfg: Config, tokenizer, embedder, judgements_path: Path) -> None:
        self.cfg, self.tokenizer, self.embedder = cfg, tokenizer, embedder
        self.path = judgements_path
        self.choice = None  # the PairChoice of the last call, until the trainer takes it
        self.trainer = None  # set once the trainer exists
        self.pairs_so_far = SystemSummary(list(SYSTEMS), cfg.pairs.tie_tolerance)
        self.steps: list[dict[str, Any]] = []

    def _judge(self):
        from wim.backends import open_backend
        from wim.judges import configured_judge

        # The live trainer model, its adapter switched off for a fixed judge.
        j, live = self.cfg.judge, (self.trainer.model, self.tokenizer)
        backend = open_backend("transformers", self.cfg.policy.model, batch_size=j.batch_size,
                               shared=live, without_adapter=j.role == "fixed")
        name = self.cfg.policy.model + (" (live adapter)" if j.role == "changing" else "")
        return configured_judge(j, backend, role=j.role, model_name=name)

    def take_choice(self):
        """The PairChoice of the last call, once (the trainer raises when there is none)."""
        choice, self.choice = self.choice, None
        return choice

    def __call__(self, prompts, completions, **kwargs) -> list[float]:
        from training.online_trainer import PairChoice
        from wim.metrics import system_values
        from wim.scoring import score_judgements

        step = self.trainer.state.global_step + 1 if self.trainer else 0
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        asked = [_user_text(p) for p in prompts]
        results = self._judge().judge(list(zip(asked, texts, strict=True)),
                                      seed=self.cfg.seed * 1000 + step)
        records = [{"prompt_id": f"{step}-{i}", "sample_idx": 0, "prompt": asked[i],
                    "response": texts[i], "critique": r.critique, "rating": r.rating,
                    "parse_ok": r.parse_ok and not r.backend_failed, "raw_judge_text": r.raw}
                   for i, r in enumerate(results)]
        scored = score_judgements(records, self.embedder, self.cfg.scoring.zeta,
                                  self.cfg.judge.on_parse_failure)
        half, tol = len(scored) // 2, self.cfg.pairs.tie_tolerance
        first, keep = [], []
        counts = {"pairs": half, "ties": 0, "failed": sum(not r["parse_ok"] for r in scored),
                  "fallback": sum(bool(r.get("fallback")) for r in scored)}
        this_step = SystemSummary(list(SYSTEMS), tol)
        for a, b in zip(scored[:half], scored[half:], strict=True):
            first_chosen, kept, tie = choose_pair(a["score"], b["score"], tol,
                                                  self.cfg.training.online_tie_policy)
            first.append(first_chosen)
            keep.append(kept)
            counts["ties"] += tie
            if a["score"] is None or b["score"] is None:
                continue  # a failed judgement: no verdict, no statistic
            values = [system_values(a, 0.0, []), system_values(b, 0.0, [])]
            this_step.add(values)
            self.pairs_so_far.add(values)
        counts["dropped"] = half - sum(keep)
        self.choice = PairChoice(first_chosen=first, keep=keep)
        row = {"step": step, **counts, **tie_rate_and_delta(this_step)}
        self.steps.append(row)
        self._append(step, scored)
        if self.trainer is not None:
            for key, value in row.items():
                if key != "step":  # every key every step (TRL averages each list per log)
                    self.trainer.stats.setdefault(f"wim/{key}", []).append(
                        math.nan if value is None else float(value))
        # Never None (TRL would make it 0); a dropped pair's value is logged nowhere.
        return [r["score"] if r["score"] is not None else 0.0 for r in scored]

    def _append(self, step: int, scored: list[dict]) -> None:
        with self.path.open("a") as f:
            for r in scored:
                f.write(json.dumps({"step": step, **{k: r.get(k) for k in (
                    "prompt", "response", "critique", "rating", "parse_ok", "rating_norm",
                    "similarity", "score", "fallback", "raw_judge_text")}}) + "\n")

    def summary(self) -> dict[str, Any]:
        out = {f"online/{k}": sum(row[k] for row in self.steps)
               for k in ("pairs", "ties", "failed", "fallback", "dropped")}
        out.update({f"online/{k}": v for k, v in tie_rate_and_delta(self.pairs_so_far).items()})
        return out


def tie_rate_and_delta(summary: SystemSummary) -> dict[str, float | None]:
    """`tie_rate/<system>` and `delta/<system>` of wim/metrics.py's summary; None, not NaN,
    where no pair had both values (the step rows are JSON)."""
    return {k: None if math.isnan(v) else v for k, v in summary.result(list(SYSTEMS)).items()
            if k.startswith(("tie_rate/", "delta/"))}


def _user_text(prompt) -> str:
    if isinstance(prompt, str):
        return prompt
    return next((m["content"] for m in reversed(prompt) if m["role"] == "user"), "")


def online_run(cfg: Config, run: RunDir, progress: bool = True, resources=None) -> dict[str, Any]:
    """Train online on the run's prompts; writes train/ (adapter, log_history.json,
    online_steps.jsonl, online_judgements.jsonl, metrics.json) and report.json."""
    from dataclasses import replace

    import datasets

    from data_gen.pipeline import Resources
    from training.online_trainer import WimOnlineDPOTrainer
    from training.placement import keep_lora_float32
    from training.train import _reset_peak_memory, lora_config, peak_memory
    from training.trl_config import online_dpo_config
    from wim.embedders import open_embedder
    from wim.report.online import write_online_report

    # Decided where training runs, as offline (RunDir.training_dtype).
    cfg = replace(cfg, policy=replace(cfg.policy, dtype=run.training_dtype(cfg)))
    res = resources or Resources(cfg)
    out = run.train_folder
    out.mkdir(parents=True, exist_ok=True)
    judgements = out / ONLINE_JUDGEMENTS
    judgements.unlink(missing_ok=True)  # online training restarts from step 0
    prompts = res.prompts()
    dataset = datasets.Dataset.from_list([{"prompt": list(p.messages)} for p in prompts])
    model, tokenizer = res.lm(cfg.policy.dtype)
    embedder = open_embedder(cfg)  # scoring.backend, scoring.dtype, as the score stage
    reward = WimReward(cfg, tokenizer, embedder, judgements)
    _reset_peak_memory()
    trainer = WimOnlineDPOTrainer(model=model, reward_funcs=[reward],
                               args=online_dpo_config(cfg, out / "trainer", progress),
                               train_dataset=dataset, processing_class=tokenizer,
                               peft_config=lora_config(cfg))
    keep_lora_float32(trainer.model)
    reward.trainer = trainer
    start = time.perf_counter()
    with contextlib.closing(embedder):
        trainer.train()
    seconds = time.perf_counter() - start
    trainer.model.eval()
    trainer.model.save_pretrained(run.adapter)
    tokenizer.save_pretrained(run.adapter)
    history = trainer.state.log_history
    (out / LOG_HISTORY).write_text(json.dumps(history, indent=2))
    (out / ONLINE_STEPS).write_text("".join(json.dumps(s) + "\n" for s in reward.steps))
    losses = [h["loss"] for h in history if "loss" in h]
    metrics: dict[str, Any] = {
        "train/mode": "online", "train/steps": trainer.state.global_step,
        "train/loss_first": losses[0] if losses else None,
        "train/loss_last": losses[-1] if losses else None, "time/train": round(seconds, 3),
        **reward.summary(), **peak_memory("train")}
    (out / TRAIN_METRICS).write_text(json.dumps(metrics, indent=2))
    report = {**metrics, "judge/role": cfg.judge.role, "policy/model": cfg.policy.model,
              "score/zeta": cfg.scoring.zeta, "online/tie_policy": cfg.training.online_tie_policy,
              "score/on_parse_failure": cfg.judge.on_parse_failure}
    return write_online_report(cfg, run, report, reward.steps)
