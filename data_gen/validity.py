"""`wim validity CONFIG`: scorer validity on gold preference pairs, in the manner of RewardBench:
fewer ties only help if the winner is right (docs/design.md, "Held-out evaluation, arms, scorer
validity"; the table: validity_table.py).

The systems ranked are numeric (zeta 0), WIM (zeta 1) and the mixes at `scoring.report_zetas`,
`scoring.zeta` and `eval.compare_zetas`. A gold file is .jsonl or .json; its rows may carry an
optional `id` and `domain`. The bundled set's 48 pairs are 6 in each of the 8 bundled domains.
"""

from __future__ import annotations

import csv
import json
import logging
from importlib import resources
from pathlib import Path

from tqdm.auto import tqdm

from data_gen.validity_table import GoldPair, systems_table_lines, validity_table
from wim.config import Config
from wim.errors import InputError
from wim.markdown import fmt_value, markdown_table
from wim.records import read_input_jsonl
from wim.report.evaluation import pval
from wim.statistics import MECHANICAL_WARNING, is_bundled

logger = logging.getLogger(__name__)

BUNDLED_GOLD = "bundled"
_FIELDS = ("prompt", "chosen", "rejected")


def _text(value, role: str, where: str, key: str) -> str:
    """A string, or the last `role` message of a chat list (TRL's preference rows)."""
    if isinstance(value, list):
        texts = [m.get("content") for m in value if isinstance(m, dict) and m.get("role") == role]
        value = texts[-1] if texts else None
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{where}: '{key}' must be a non-empty string or a list of chat "
                         f"messages with a '{role}' message; got {str(value)[:60]!r}.")
    return value


def _pair(record, index: int, where: str) -> GoldPair:
    if not isinstance(record, dict):
        raise InputError(f"{where}: expected an object with {', '.join(_FIELDS)}.")
    missing = [k for k in _FIELDS if k not in record]
    if missing:
        raise InputError(f"{where}: missing {', '.join(missing)}; each gold pair needs "
                         f"{', '.join(_FIELDS)} (and may have id, domain).")
    return GoldPair(
        id=str(record.get("id") or f"{index:05d}"), domain=str(record.get("domain") or ""),
        prompt=_text(record["prompt"], "user", where, "prompt"),
        chosen=_text(record["chosen"], "assistant", where, "chosen"),
        rejected=_text(record["rejected"], "assistant", where, "rejected"))


def load_gold(source: str | None = None, limit: int | None = None) -> list[GoldPair]:
    """Gold pairs from the bundled set (None or "bundled") or a .jsonl/.json/.csv file."""
    if source in (None, BUNDLED_GOLD):
        path = Path(str(resources.files("wim").joinpath("data", "gold_pairs.jsonl")))
    else:
        path = Path(source).expanduser()
        if not path.is_file():
            raise InputError(f"gold file '{path}' does not exist; give a .jsonl or .csv with "
                             "prompt, chosen, rejected, or leave --gold out for the bundled set.")
    if path.suffix.lower() == ".csv":
        rows = csv.DictReader(path.read_text(encoding="utf-8").splitlines())
        pairs = [_pair(row, i, f"{path}: row {i + 2}") for i, row in enumerate(rows)]
    else:
        records = read_input_jsonl(path, "Gold", InputError)
        pairs = [_pair(r, i, f"{path}: line {n}") for i, (n, r) in enumerate(records)]
    if not pairs:
        raise InputError(f"{path} holds no gold pairs.")
    return pairs[:limit] if limit else pairs


def judge_gold(cfg: Config, pairs: list[GoldPair], progress: bool = True) -> list[dict]:
    """Judgement records (sample_idx 0 = chosen, 1 = rejected), scored at every zeta."""
    from data_gen.pipeline import Resources

    res = Resources(cfg)
    try:
        judge = res.judge()
        items = [(p.prompt, text) for p in pairs for text in (p.chosen, p.rejected)]
        fits = judge.fit(items, cfg.judge.overlong, cfg.judge.max_input_tokens)
        records = []
        size = cfg.judge.batch_size
        for start in tqdm(range(0, len(items), size), desc="judge gold", unit="batch",
                          disable=not progress):
            batch = [(i, item) for i, (item, _) in enumerate(fits[start:start + size], start)
                     if item is not None]
            results = judge.judge([item for _, item in batch], seed=cfg.seed + start)
            for (i, _), j in zip(batch, results, strict=True):
                records.append({"prompt_id": pairs[i // 2].id, "sample_idx": i % 2,
                                "response": items[i][1], "critique": j.critique,
                                "rating": j.rating, "parse_ok": j.parse_ok and not
                                j.backend_failed, "raw_judge_text": j.raw})
    finally:
        res.close()
    return score_gold(cfg, records)


def score_gold(cfg: Config, records: list[dict]) -> list[dict]:
    """The gold judgements scored as the score stage scores a run (embedder, batches, cosine)."""
    from wim.embedders import open_embedder
    from wim.scoring import score_judgements

    if cfg.judge.mode != "wim":
        return score_judgements(records, None, 0.0, cfg.judge.on_parse_failure)
    embedder = open_embedder(cfg)
    try:
        return score_judgements(records, embedder, cfg.scoring.zeta, cfg.judge.on_parse_failure,
                                cfg.scoring.batch_size)
    finally:
        embedder.close()


def scorer_validity(cfg: Config, gold: str | None = None, limit: int | None = None,
                    out: Path | None = None, progress: bool = True) -> dict:
    pairs = load_gold(gold, limit)
    scored = judge_gold(cfg, pairs, progress)
    judge_model = cfg.judge.model if cfg.judge.role == "external" else cfg.policy.model
    report = {
        "gold": gold or BUNDLED_GOLD, "pairs": len(pairs),
        "judge": {"role": cfg.judge.role, "model": judge_model, "mode": cfg.judge.mode,
                  "embedder": cfg.scoring.embedder},
        "mechanical_warning": MECHANICAL_WARNING if is_bundled(judge_model) else None,
        "judge_parse_failed": sum(not r["parse_ok"] for r in scored),
        "systems": validity_table(cfg, pairs, scored),
    }
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "validity.json").write_text(json.dumps(report, indent=2))
        (out / "validity.md").write_text(validity_markdown(report))
        (out / "validity_judgements.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in scored))
    return report


def validity_markdown(report: dict) -> str:
    j = report["judge"]
    lines = ["# Scorer validity on gold pairs", ""]
    if report.get("mechanical_warning"):
        lines += [f"> **{report['mechanical_warning']}**", ""]
    lines += [f"Gold: {report['gold']} ({report['pairs']} pairs). Judge: `{j['model']}` "
              f"({j['role']}, {j['mode']}), embedder `{j['embedder']}`. Accuracy: how often a "
              "system scores the better answer higher, a tie counting as half, with a paired "
              "bootstrap 95% interval over pairs (strict: ties as wrong). Sign test: right "
              "against wrong, ties left out, with its own exact Clopper-Pearson 95% interval of "
              "right / (right + wrong). Failures (a judgement that did not parse) are left out "
              "and counted.", ""]
    lines += systems_table_lines(report["systems"])
    lines += ["", "## Each system against numeric, on the same pairs", "",
              "Accuracy difference (ties half), the mean over pairs of the system's outcome "
              "minus numeric's (1 right, 1/2 tie, 0 wrong), with the one-sample t-test of those "
              "differences against 0 and its own t 95% interval (p < 0.05 exactly when 0 is "
              "outside it); Holm over the systems below. The strictly-right counts describe "
              "the pairs where only one ranked the better answer first.", ""]
    paired = [(name, r["vs_numeric"]) for name, r in report["systems"].items()
              if r.get("vs_numeric")]
    lines += markdown_table(
        ["system", "pairs", "accuracy - numeric", "t 95%", "p", "p (Holm)", "only system right",
         "only numeric right"],
        [[name, v["n"], fmt_value(v["accuracy_diff"]), fmt_value(v["diff_95"]), pval(v["diff_p"]),
          pval(v["diff_p_holm"]), v["only_system_right"], v["only_numeric_right"]]
         for name, v in paired])
    lines += ["", "## Per domain (accuracy, ties half; n; paired bootstrap 95%)", ""]
    lines += markdown_table(["system", "domain", "n", "accuracy", "bootstrap 95%"], [
        [name, d or "(none)", v["n"], fmt_value(v["accuracy"]),
         fmt_value(v["bootstrap_95"]) if v["bootstrap_95"] else (v["bootstrap_note"] or "-")]
        for name, r in report["systems"].items() for d, v in r["by_domain"].items()])
    return "\n".join(lines) + "\n"
