"""Report sections beyond the single-run tables (rounds, the blind evaluation, agreement, the
source) and the markdown helpers build.py shares.

Rounds. `report.json` holds a `rounds` key when the run has more than one round of judging
and training: a list of flat metric dicts, one per round, each with an integer `round` and the
same `pairs/...` keys as the top level. A stage's stats give it (`collect_rounds`), else the
rounds' own folders. A run of one round has no `rounds` key; its plot shows the top-level
numbers as round 0.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from wim.config import Config
from wim.markdown import fmt_value, markdown_table, md_cell
from wim.metrics import PairStatistics
from wim.records import RecordIndex, RecordsError, iter_records
from wim.report.evaluation import evaluation_body
from wim.rundir import AGREEMENT, RunDir

SYSTEMS = ("numeric", "wim", "mixed")


def tie_delta_table(heads: list[str], systems: list[str],
                    rows: list[tuple[list[str], dict[str, Any], str]]) -> list[str]:
    """A markdown table: the `heads` columns, then the tie rate and the mean abs delta of each
    system. A row: its leading cells, a record, and the prefix of its keys in that record
    (`<prefix>tie_rate/<system>`, `<prefix>delta/<system>`)."""
    header = [*heads, *(f"tie rate {s}" for s in systems), *(f"delta {s}" for s in systems)]
    return markdown_table(header, [
        [*cells, *(fmt_value(record.get(f"{prefix}tie_rate/{s}"), True) for s in systems),
         *(fmt_value(record.get(f"{prefix}delta/{s}")) for s in systems)]
        for cells, record, prefix in rows])


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
    folder = run.rounds_folder
    if rounds or not folder.is_dir():
        return rounds
    for sub in sorted(folder.iterdir(), key=lambda p: (len(p.name), p.name)):
        # One prompt's records at a time, as the run's own report reads them.
        if not sub.name.isdigit() or not len(scores := RecordIndex(RunDir(sub).scores)):
            continue
        stats = PairStatistics(cfg.scoring.zeta, [], cfg.pairs.tie_tolerance)
        for group in scores.groups():
            stats.add(group)
        entry = {"round": int(sub.name),
                 **{k: v for k, v in stats.result().items() if k.startswith("pairs/")}}
        if RunDir(sub).pairs.is_file():
            entry["pairs/count"] = sum(1 for _ in iter_records(RunDir(sub).pairs))
        rounds.append(entry)
    return rounds


def rounds_lines(value: Any) -> list[str]:
    rounds = _round_list(value)
    if not rounds:
        return []
    rows = [([str(r["round"]), fmt_value(r.get("pairs/count"))], r, "pairs/") for r in rounds]
    return ["", "## Per round", "", *tie_delta_table(["round", "pairs"], list(SYSTEMS), rows)]


def evaluation_lines(evaluation: dict[str, Any] | None) -> list[str]:
    """The blind evaluation (eval.json), in evaluation.py's order; the report puts it at the
    top."""
    if not evaluation:
        return []
    lines = ["## Blind evaluation: did training help? (eval.json)", ""]
    who = evaluation.get("evaluator") or {}
    if isinstance(who, dict) and who:
        lines += ["Evaluator: " + "; ".join(f"{md_cell(k)} {md_cell(v)}"
                                            for k, v in who.items())
                  + f"; held-out prompts: {fmt_value(evaluation.get('held_out_prompts'))}.", ""]
    return lines + evaluation_body(evaluation)


def read_run_json(run: RunDir, name: str, command: str, valid: Callable[[Any], bool],
                  expected: str) -> Any:
    """DIR/<name> parsed, or None when there is no such file; RecordsError naming `command`,
    the one that writes it, when it is not valid JSON or not `valid` (`expected` says what)."""
    path = run.file(name)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except ValueError as err:
        raise RecordsError(f"{path} is not valid JSON ({err}); run `{command}` again.") from None
    if not valid(data):
        raise RecordsError(f"{path}: expected {expected}; run `{command}` again.")
    return data


def read_agreement(run: RunDir) -> dict[str, Any] | None:
    """DIR/agreement.json (the pairs stage writes it for a source with its own preferences),
    checked for the keys the report reads."""
    return read_run_json(run, AGREEMENT, "wim pairs",
                         lambda d: (isinstance(d, dict) and isinstance(d.get("systems"), dict)
                                    and isinstance(d.get("table_markdown"), str)),
                         "an object with 'systems' and 'table_markdown'")


def agreement_lines(agreement: dict[str, Any] | None) -> list[str]:
    """Agreement of our rankings with the source's own labels (the `wim validity` table)."""
    if not agreement:
        return []
    lines = ["", "## Agreement with the source's own preferences", "",
             f"The source ({md_cell(agreement.get('source'))}) says which response is better "
             f"({md_cell(agreement.get('labels'))}); one labelled pair per prompt "
             f"({fmt_value(agreement.get('pairs'))} pairs; "
             f"{fmt_value(agreement.get('label_ties'))} prompts whose responses the source rates "
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
            f"{fmt_value(r.get('generate/records'))} responses to "
            f"{fmt_value(r.get('generate/source_prompts'))} prompts; "
            f"{fmt_value(r.get('generate/source_too_few_responses'))} prompts with fewer than two "
            f"responses skipped. Written by: {listed}.", ""]
