"""Report sections beyond the single-run tables: rounds and the blind evaluation (eval.json,
rendered by evaluation.py),
plus the markdown helpers they share with wim/report/build.py.

Rounds. `report.json` holds a `rounds` key when the run has more than one round of judging
and training: a list of flat metric dicts, one per round, each with an integer `round` and the
same `pairs/...` keys as the top level (`pairs/tie_rate/<system>`, `pairs/delta/<system>`,
`pairs/count`, ...). It comes from a stage's stats (`stats/*.json` holding `rounds` as that
list, or as a dict keyed by round) or, failing that, is derived from `DIR/rounds/<r>/scores.jsonl`
(and `DIR/rounds/<r>/pairs.jsonl` for the pair count). A run of one round has no `rounds` key;
its plot shows the top-level numbers as round 0.
"""

from __future__ import annotations

import math
from typing import Any

from wim.config import Config
from wim.metrics import pair_statistics
from wim.records import read_records
from wim.report.evaluation import evaluation_body
from wim.rundir import RunDir

SYSTEMS = ("numeric", "wim", "mixed")


def md_cell(text: Any) -> str:
    """Free text (a domain name, a model name) safe inside a markdown table cell: no line
    breaks, `|` escaped, and no raw HTML (`<`, `>`, `&` as entities)."""
    text = " ".join(str(text).split())
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("`", "\\`")


def fmt(value: Any, pct: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if isinstance(value, float):
        return f"{100 * value:.1f}%" if pct else f"{value:.3f}"
    return str(value)


def _round_list(value: Any) -> list[dict[str, Any]]:
    """The `rounds` value as a list sorted by round; entries without an integer round dropped."""
    if isinstance(value, dict):
        value = [{**v, "round": int(k)} for k, v in value.items()
                 if isinstance(v, dict) and str(k).lstrip("-").isdigit()]
    if not isinstance(value, list):
        return []
    out = [dict(v) for v in value if isinstance(v, dict) and isinstance(v.get("round"), int)]
    return sorted(out, key=lambda v: v["round"])


def collect_rounds(cfg: Config, run: RunDir, given: Any = None) -> list[dict[str, Any]]:
    """Per-round metrics: `given` (a stats file's `rounds`), else from DIR/rounds/<r>/."""
    rounds = _round_list(given)
    folder = run.file("rounds")
    if rounds or not folder.is_dir():
        return rounds
    for sub in sorted(folder.iterdir(), key=lambda p: (len(p.name), p.name)):
        scores = read_records(sub / "scores.jsonl") if sub.name.isdigit() else []
        if not scores:
            continue
        stats = pair_statistics(scores, cfg.scoring.zeta, [], cfg.pairs.tie_tolerance)
        entry: dict[str, Any] = {"round": int(sub.name)}
        entry.update({k: v for k, v in stats.items() if k.startswith("pairs/")})
        if (sub / "pairs.jsonl").is_file():
            entry["pairs/count"] = len(read_records(sub / "pairs.jsonl"))
        rounds.append(entry)
    return rounds


def rounds_lines(value: Any) -> list[str]:
    rounds = _round_list(value)
    if not rounds:
        return []
    lines = ["", "## Per round", "",
             "| round | pairs | " + " | ".join(f"tie rate {s}" for s in SYSTEMS) + " | "
             + " | ".join(f"delta {s}" for s in SYSTEMS) + " |",
             "|---" * (2 + 2 * len(SYSTEMS)) + "|"]
    for r in rounds:
        ties = [fmt(r.get(f"pairs/tie_rate/{s}"), True) for s in SYSTEMS]
        deltas = [fmt(r.get(f"pairs/delta/{s}")) for s in SYSTEMS]
        lines.append(f"| {r['round']} | {fmt(r.get('pairs/count'))} | "
                     + " | ".join(ties + deltas) + " |")
    return lines


def evaluation_lines(evaluation: dict[str, Any] | None) -> list[str]:
    """The blind evaluation (eval.json): warnings and the power statement first, then the
    primary comparison with its own test, then every comparison, each interval labelled
    (wim/report/evaluation.py). The report puts it at the top."""
    if not evaluation:
        return []
    lines = ["## Blind evaluation: did training help? (eval.json)", ""]
    who = evaluation.get("evaluator") or {}
    if isinstance(who, dict) and who:
        lines += ["Evaluator: " + "; ".join(f"{md_cell(k)} {md_cell(v)}"
                                            for k, v in who.items())
                  + f"; held-out prompts: {fmt(evaluation.get('held_out_prompts'))}.", ""]
    return lines + evaluation_body(evaluation)


def read_agreement(run: RunDir) -> dict[str, Any] | None:
    """DIR/agreement.json (the pairs stage writes it for a source with its own preferences),
    checked for the keys the report reads."""
    import json

    from wim.records import RecordsError

    path = run.file("agreement.json")
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except ValueError as err:
        raise RecordsError(f"{path} is not valid JSON ({err}); run `wim pairs` again.") from None
    if not (isinstance(data, dict) and isinstance(data.get("systems"), dict)
            and isinstance(data.get("table_markdown"), str)):
        raise RecordsError(f"{path}: expected an object with 'systems' and 'table_markdown'; "
                           "run `wim pairs` again.")
    return data


def agreement_lines(agreement: dict[str, Any] | None) -> list[str]:
    """Agreement of our rankings with the source's own labels (the `wim validity` table)."""
    if not agreement:
        return []
    lines = ["", "## Agreement with the source's own preferences", "",
             f"The source ({md_cell(agreement.get('source'))}) says which response is better "
             f"({md_cell(agreement.get('labels'))}); one labelled pair per prompt "
             f"({fmt(agreement.get('pairs'))} pairs; "
             f"{fmt(agreement.get('label_ties'))} prompts whose responses the source rates "
             "alike left out). Accuracy: how often a system scores the source's better "
             "response higher (a tie counts as half; strict: as wrong); failures (a judgement "
             "that did not parse) are counted, not ranked. The same table as `wim validity`.",
             ""]
    if agreement["table_markdown"]:
        lines += agreement["table_markdown"].splitlines()
    return lines


def source_lines(r: dict[str, Any]) -> list[str]:
    """Where the responses came from: sampled by the policy, or read from generation.source."""
    if not r.get("generate/source"):
        return [f"Responses sampled by the policy {md_cell(r.get('policy/model'))}.", ""]
    origins = r.get("generate/origins") or {}
    listed = ", ".join(f"{md_cell(k)} ({v})" for k, v in sorted(origins.items())) or "none"
    sha = str(r.get("generate/source_sha256") or "")
    return [f"Responses not sampled: read from {md_cell(r['generate/source'])} (shape "
            f"{md_cell(r.get('generate/source_shape'))}, sha256 {sha[:16]}...): "
            f"{fmt(r.get('generate/records'))} responses to "
            f"{fmt(r.get('generate/source_prompts'))} prompts; "
            f"{fmt(r.get('generate/source_too_few_responses'))} prompts with fewer than two "
            f"responses skipped. Written by: {listed}.", ""]
