"""How often our rankings agree with a source's own preferences (`generation.source`).

A source that carries preferences gives one labelled pair per prompt:
- the preference shape: its chosen response against its rejected one;
- UltraFeedback's ratings (`source_rating`): the highest-rated response against the lowest
  (a prompt whose responses all have the same rating gives none, counted as a label tie).
One pair per prompt keeps the pairs independent, so the interval is that of the test.
Each pair is ranked by every scoring system with the same code as `wim validity`
(data_gen/validity_table.py): accuracy (ties half), tie share, strict accuracy,
interval, failures. The result goes to DIR/agreement.json, which the report shows.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from data_gen.validity_table import GoldPair, systems_table_lines, validity_table
from wim.config import Config
from wim.pairs import group_by_prompt
from wim.rundir import RunDir

AGREEMENT_FILE = "agreement.json"


def label_pairs(scored: list[dict[str, Any]]) -> tuple[list[tuple[dict, dict]], int, str]:
    """[(chosen record, rejected record)] by the source's labels, the number of prompts whose
    ratings all tie, and the kind of label (`chosen/rejected`, `ratings` or "")."""
    pairs, label_ties, kinds = [], 0, set()
    for records in group_by_prompt(scored).values():
        pair, kind = label_pair(records)
        kinds.add(kind)
        label_ties += kind == "ratings" and pair is None
        if pair is not None:
            pairs.append(pair)
    return pairs, label_ties, " and ".join(sorted(kinds - {""}))


def label_pair(records: list[dict[str, Any]]) -> tuple[tuple[dict, dict] | None, str]:
    """One prompt's labelled (chosen, rejected) records, or None, and the kind of label
    (`chosen/rejected`, `ratings`: None means all ratings tie, or "": no labels)."""
    labelled = {r["source_label"]: r for r in records if r.get("source_label")}
    if "chosen" in labelled and "rejected" in labelled:
        return (labelled["chosen"], labelled["rejected"]), "chosen/rejected"
    rated = [r for r in records if r.get("source_rating") is not None]
    if len(rated) < 2:
        return None, ""
    # max/min keep the first of equal ratings: sample order decides, never our scores.
    best = max(rated, key=lambda r: r["source_rating"])
    worst = min(rated, key=lambda r: r["source_rating"])
    if best["source_rating"] == worst["source_rating"]:
        return None, "ratings"
    return (best, worst), "ratings"


_KEEP = ("rating_norm", "similarity", "score", "parse_ok", "zeta")


def _of_length(n: int, cache: dict[int, str]) -> str:
    if n not in cache:
        cache[n] = " " * n
    return cache[n]


def source_agreement(cfg: Config, run: RunDir,
                     scored: list[dict[str, Any]] | Iterable[list[dict[str, Any]]]
                     ) -> dict | None:
    """Write DIR/agreement.json when the source carries preferences; None (and no file) when
    it does not. `scored`: scores.jsonl's records, or each prompt's records as a stream (one
    labelled pair per prompt is kept, its records cut to what the table reads)."""
    path = run.file(AGREEMENT_FILE)
    groups = group_by_prompt(scored).values() if isinstance(scored, list) else scored
    gold, remapped, label_ties, kinds = [], [], 0, set()
    lengths: dict[int, str] = {}
    for records in groups:
        pair, kind = label_pair(records)
        kinds.add(kind)
        label_ties += kind == "ratings" and pair is None
        if pair is None:
            continue
        chosen, rejected = pair
        # validity_table reads (id, 0) as the better answer and (id, 1) as the worse.
        gid = f"{chosen['prompt_id']}#{chosen['sample_idx']}>{rejected['sample_idx']}"
        # The table reads no text but the answers' lengths (its longer-answer reference), so
        # the pair holds one shared string per length, not 100,000 pairs of answers.
        gold.append(GoldPair(id=gid, domain=chosen.get("domain", ""), prompt="",
                             chosen=_of_length(len(chosen["response"]), lengths),
                             rejected=_of_length(len(rejected["response"]), lengths)))
        for idx, r in enumerate((chosen, rejected)):
            remapped.append({"prompt_id": gid, "sample_idx": idx,
                             **{k: r[k] for k in _KEEP if k in r}})
    if not gold and not label_ties:
        path.unlink(missing_ok=True)
        return None
    systems = validity_table(cfg, gold, remapped) if gold else {}
    result = {"labels": " and ".join(sorted(kinds - {""})), "source": cfg.generation.source,
              "pairs": len(gold), "label_ties": label_ties, "systems": systems,
              "table_markdown": "\n".join(systems_table_lines(systems)) if systems else ""}
    path.write_text(json.dumps(result, indent=2))
    return result
