"""The dataset card of a run's pairs, in the Hub's format; a pure function (the pairs stage
writes it). More: docs/design.md, "Responses from a source, and the dataset card".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import yaml

from wim.config import Config
from wim.config.endpoints import drop_prices
from wim.judge_prompts import build_judge_instructions
from wim.markdown import fmt_value, markdown_table
from wim.metrics import JudgeStatistics, PairStatistics
from wim.pairs import group_by_prompt
from wim.report.build import SMALL_JUDGE_NOTE, SMALL_JUDGES
from wim.rundir import identity
from wim.statistics import MECHANICAL_WARNING, is_bundled

_SIZES = ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"),
          (1_000_000, "100K<n<1M"), (10_000_000, "1M<n<10M"))
_SYSTEMS = (("numeric", "numeric (rating)"), ("wim", "WIM (similarity)"), ("mixed", "mixed"))


def size_category(n: int) -> str:
    """The Hub's size category of a dataset of `n` rows."""
    return next((name for cap, name in _SIZES if n < cap), "n>10M")


def card_config(cfg: Config) -> dict[str, Any]:
    """The config sections that decide the pairs: the run identity, judge, scoring, pairs."""
    data = drop_prices(cfg.to_dict())  # what the pairs are made of, not what they cost
    return {**identity(cfg), "judge": data["judge"], "scoring": data["scoring"],
            "pairs": data["pairs"]}


@dataclass
class ScoreSummary:
    """What the card reads of scores.jsonl, gathered in one streaming pass."""

    judge: dict[str, Any]
    pairs: dict[str, Any]
    judge_model: str | None
    origins: dict[str, int]


def summarize_scores(groups: Iterable[list[dict[str, Any]]], cfg: Config) -> ScoreSummary:
    """One pass over each prompt's scored records (no record is kept)."""
    judge, pairs = JudgeStatistics(), PairStatistics(cfg.scoring.zeta, [], cfg.pairs.tie_tolerance)
    judge_model, origins = None, Counter()
    for records in groups:
        pairs.add(records)
        for r in records:
            judge.add(r)
            judge_model = judge_model or r.get("judge_model")
            origins[r.get("origin") or "(not given)"] += 1
    return ScoreSummary(judge.result(), pairs.result(), judge_model, dict(origins))


def render_card(cfg: Config, scored: list[dict[str, Any]] | ScoreSummary,
                counts: dict[str, int], data_files: str, source: dict[str, Any] | None = None,
                source_license: str | None = None,
                completions: dict[str, Any] | None = None,
                completions_files: str | None = None) -> str:
    """The card's text. `scored`: scores.jsonl's records, or their `summarize_scores`;
    `counts`: the pairs stage's `pairs/...` counts; `data_files`: the path or glob of the data
    files next to the card; `source`: the generate stage's stats (generation.source's shape and
    sha256); `source_license`: the license the source names, if any; `completions`: the counts
    of the `completions` config next to the card (DIR/dataset/), which the card then describes,
    and `completions_files` the path of its file."""
    if not isinstance(scored, ScoreSummary):
        scored = summarize_scores(group_by_prompt(scored).values(), cfg)
    judge, stats, judge_model = scored.judge, scored.pairs, scored.judge_model
    license_, license_from, license_line = _license(cfg, source_license)
    n = counts.get("pairs/count", 0)
    facts = {"judge_role": cfg.judge.role, "judge_model": judge_model,
             "judge_mode": cfg.judge.mode, "judge_prompt": cfg.judge.prompt,
             "embedder": cfg.scoring.embedder, "zeta": cfg.scoring.zeta,
             "tie_policy": cfg.pairs.tie_policy, "tie_tolerance": cfg.pairs.tie_tolerance,
             "strategy": cfg.pairs.strategy, "pairs": n,
             "ties_dropped": counts.get("pairs/ties_dropped", 0),
             "judgements": judge["judge/count"],
             "judge_parse_failed": judge["judge/parse_failed"],
             "echoed_rubrics": judge["judge/echoed_rubric"],
             "responses_from": cfg.generation.source or "sampled by the policy",
             "mechanical_numbers": is_bundled(judge_model), "license_from": license_from}
    meta = {"pretty_name": "WIM preference pairs", "license": license_,
            "task_categories": ["text-generation"],
            "tags": ["dpo", "preference", "rlhf", "wim", "synthetic"],
            "size_categories": [size_category(n)],
            "configs": [{"config_name": "default",
                         "data_files": [{"split": "train", "path": data_files}]}],
            "wim": facts}
    if completions is not None:
        meta["configs"].append({"config_name": "completions", "data_files": [
            {"split": "train", "path": completions_files}]})
        facts["completions"] = completions
    lines = ["---", yaml.safe_dump(meta, sort_keys=False).rstrip(), "---", "",
             "# WIM preference pairs", ""]
    if is_bundled(judge_model):
        note = SMALL_JUDGE_NOTE if str(judge_model).split(" + ")[0] in SMALL_JUDGES \
            else MECHANICAL_WARNING
        lines += [f"> **Mechanical numbers.** {note}", ""]
    lines += [f"{n} chosen/rejected pairs in TRL's conversational preference format, ranked by "
              "What Is Missing (WIM) scores: a judge writes what is missing from each response "
              "and a 1-10 rating; score = (1 - zeta) * rating_norm + zeta * cos(E(response), "
              "E(critique)), with rating_norm = (N - 5) / 5.", ""]
    lines += [license_line, ""]
    lines += _source_lines(cfg, scored.origins, source or {})
    lines += _judge_lines(cfg, judge_model)
    lines += _count_lines(cfg, counts, judge)
    lines += _table_lines(cfg, stats)
    lines += ["## Columns", "",
              "`prompt`, `chosen`, `rejected` (chat messages); audit columns: `prompt_id`, "
              "`domain`, `chosen_sample_idx`/`rejected_sample_idx`, `*_critique`, `*_rating`, "
              "`*_similarity`, `*_score`, `zeta`, and `chosen_origin`/`rejected_origin` (who "
              "wrote each response: the policy, or the source's model name).", "",
              *_completions_lines(completions),
              "## The config that made it", "", "```yaml",
              yaml.safe_dump(card_config(cfg), sort_keys=False).rstrip(), "```", ""]
    return "\n".join(lines)


def _completions_lines(completions: dict[str, Any] | None) -> list[str]:
    if completions is None:
        return []
    unranked = completions["unranked"]
    return ["## The `completions` config", "",
            f"Every judgement: one row per prompt ({completions['prompts']} prompts, "
            f"{completions['responses']} responses), in UltraFeedback's shape, so the responses "
            "can be re-ranked or re-scored. Row: `prompt_id`, `domain`, `prompt` (chat "
            "messages), `judge_model`, `zeta`, `embedder`, and `completions`, every response of "
            "the prompt by `sample_idx`, each with `response`, `origin`, the judge's "
            "`critique`, `rating` (1-10), `parse_ok`, `parse_error`, `fallback` and "
            "`raw_judge_text`, then `rating_norm`, `similarity` and `score` (at this zeta), "
            "all as scores.jsonl holds them, `source_label`/`source_rating` where the source "
            "gave them, and `rank_numeric`, `rank_wim`, `rank_mixed`: the response's rank among "
            "the prompt's responses by rating_norm, similarity and score (1 = best; equal "
            "values share the best rank of their group, pandas' `method='min'`, exactly equal, "
            "not within the tie tolerance). A null value has no rank: "
            f"{completions['parse_failed']} judgements failed to parse and are kept with their "
            "nulls; responses without a rank: "
            f"{unranked['numeric']} numeric, {unranked['wim']} WIM, {unranked['mixed']} mixed.",
            ""]


def _license(cfg: Config, source_license: str | None) -> tuple[str, str, str]:
    """(license id, where it came from: `card.license`, `source` or `unknown`, the card's line)."""
    if cfg.card.license:
        return (cfg.card.license, "card.license",
                f"License: `{cfg.card.license}` (set by `card.license`).")
    if source_license:
        return (source_license, "source",
                f"License: `{source_license}`, as the source's own card gives it. The responses "
                "keep their source's terms; set `card.license` to state another.")
    return ("unknown", "unknown",
            "License: **unknown**. Nothing set it: `card.license` is null and the responses' "
            "source names none. Set `card.license` to the license these pairs may be shared "
            "under (the prompts', responses' and judge's terms all apply) before publishing.")


def _source_lines(cfg: Config, origins: dict[str, int], source: dict[str, Any]
                  ) -> list[str]:
    g = cfg.generation
    if g.source is None:
        return ["## Responses", "",
                f"Sampled by the policy `{cfg.policy.model}`: k={g.k} per prompt, temperature "
                f"{g.temperature:g}, top_p {g.top_p:g}, at most {g.max_new_tokens} new tokens.", ""]
    listed = ", ".join(f"`{k}` ({v})" for k, v in sorted(origins.items()))
    return ["## Responses", "",
            f"Not sampled: read from `{g.source}` (shape "
            f"{source.get('generate/source_shape', g.source_shape)}, sha256 "
            f"`{source.get('generate/source_sha256', 'unknown')}`). Origins: {listed}. "
            f"{source.get('generate/source_too_few_responses', 0)} prompts of the source had "
            "fewer than two responses and were left out.", ""]


def _judge_lines(cfg: Config, judge_model: str | None) -> list[str]:
    j = cfg.judge
    return ["## Judge", "",
            f"Role `{j.role}`, model `{judge_model}`, mode `{j.mode}`, prompt `{j.prompt}` "
            f"(instructions in the {j.instructions_in} message; greedy, then up to "
            f"{j.max_retries} sampled retries at temperature {j.retry_temperature:g}). "
            f"Embedder `{cfg.scoring.embedder}`, zeta {cfg.scoring.zeta:g}.", "",
            "The judge's instructions:", "", "```text",
            build_judge_instructions(j.criteria, j.mode, j.prompt), "```", ""]


def _count_lines(cfg: Config, counts: dict[str, int], judge: dict[str, Any]) -> list[str]:
    p = cfg.pairs
    rows = [("pairs", counts.get("pairs/count", 0)),
            ("prompts", counts.get("pairs/prompts", 0)),
            ("ties", counts.get("pairs/ties", 0)),
            ("ties dropped", counts.get("pairs/ties_dropped", 0)),
            ("ties kept (first / random)", f"{counts.get('pairs/ties_kept_first', 0)} / "
                                           f"{counts.get('pairs/ties_kept_random', 0)}"),
            ("prompts with fewer than two parsed judgements",
             counts.get("pairs/prompts_too_few_parsed", 0)),
            ("judgements", judge["judge/count"]),
            ("failed judgements (no parse after retries)", judge["judge/parse_failed"]),
            ("echoed rubrics (among the failed)", judge["judge/echoed_rubric"])]
    return ["## Ties and counts", "",
            f"Strategy `{p.strategy}`; tie policy `{p.tie_policy}`: two scores within "
            f"{p.tie_tolerance:g} on the 1-10 scale tie. Failed judgements "
            f"({cfg.judge.on_parse_failure}) "
            + ("are left out of ranking." if cfg.judge.on_parse_failure == "exclude" else
               "are scored as in the authors' code (rating_norm 0 / rating alone)."), "",
            *markdown_table(["what", "count"], rows), ""]


def _table_lines(cfg: Config, stats: dict[str, Any]) -> list[str]:
    systems = [(s, label) for s, label in _SYSTEMS if f"pairs/tie_rate/{s}" in stats]
    if not systems:
        return []
    rows = (("tie rate", "tie_rate", True), ("mean abs delta", "delta", False),
            ("mean best-worst delta", "delta_best_worst", False))
    return ["## Tie rate and delta (within-prompt sample pairs, 1-10 scale)", "",
            *markdown_table(["metric", *(label for _, label in systems)], [
                [label, *(fmt_value(stats.get(f"pairs/{key}/{s}"), pct) for s, _ in systems)]
                for label, key, pct in rows]),
            "", f"mixed: zeta={cfg.scoring.zeta:g}.", ""]
