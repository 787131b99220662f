"""How often our rankings agree with a source's own preferences (`generation.source`), one
labelled pair per prompt, into DIR/agreement.json (docs/design.md, "Responses from a source").
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from data_gen.validity_table import RankingOutcomes, outcomes_table, systems_table_lines
from wim.config import Config
from wim.pairs import group_by_prompt
from wim.rundir import AGREEMENT, RunDir


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


def source_agreement(cfg: Config, run: RunDir,
                     scored: list[dict[str, Any]] | Iterable[list[dict[str, Any]]]
                     ) -> dict | None:
    """Write DIR/agreement.json when the source carries preferences, else None and no file.
    `scored`: scores.jsonl's records, or each prompt's records as a stream."""
    path = run.file(AGREEMENT)
    groups = group_by_prompt(scored).values() if isinstance(scored, list) else scored
    outcomes, label_ties, kinds = RankingOutcomes(cfg), 0, set()
    for records in groups:
        pair, kind = label_pair(records)
        kinds.add(kind)
        label_ties += kind == "ratings" and pair is None
        if pair is not None:
            chosen, rejected = pair
            outcomes.add(chosen.get("domain", ""), chosen, rejected,
                         len(chosen["response"]), len(rejected["response"]))
    pairs = len(outcomes.domains)
    if not pairs and not label_ties:
        path.unlink(missing_ok=True)
        return None
    systems = outcomes_table(cfg, outcomes) if pairs else {}
    result = {"labels": " and ".join(sorted(kinds - {""})), "source": cfg.generation.source,
              "pairs": pairs, "label_ties": label_ties, "systems": systems,
              "table_markdown": "\n".join(systems_table_lines(systems)) if systems else ""}
    path.write_text(json.dumps(result, indent=2))
    return result
