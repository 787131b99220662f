"""What the pairs stage writes from existing scores, without a model: the agreement with a
source's own labels (data_gen/agreement.py, validity's table) and the dataset card
(wim/card.py), read back with `datasets` and the `huggingface_hub` card parser, offline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import QUICKSTART, run_wim, sets

from data_gen.agreement import label_pair, source_agreement
from wim.card import render_card, size_category
from wim.config import load_config
from wim.pairs import group_by_prompt
from wim.records import write_records_atomic
from wim.rundir import RunDir

BUNDLED_JUDGE = "bundled:smollm2-135m-instruct"


def _scored(pid: str, idx: int, rating: int, sim: float, *, source_rating=None, label=None,
            judge: str = BUNDLED_JUDGE, origin: str = "") -> dict:
    rn = (rating - 5) / 5
    record = {"prompt_id": pid, "sample_idx": idx, "domain": "d",
              "messages": [{"role": "user", "content": f"q {pid}"}], "prompt": f"q {pid}",
              "response": f"answer {pid}/{idx}", "origin": origin, "judge_role": "fixed",
              "judge_model": judge, "critique": "c", "rating": rating, "raw_judge_text": "",
              "parse_ok": True, "parse_error": None, "attempts": 1, "echoed_attempts": 0,
              "rating_norm": rn, "similarity": sim, "score": 0.6 * rn + 0.4 * sim, "zeta": 0.4}
    if source_rating is not None:
        record["source_rating"] = source_rating
    if label is not None:
        record["source_label"] = label
    return record


def _rated(agree: bool) -> list[dict]:
    """4 prompts of 3 UltraFeedback-rated responses; our scores follow the source's ratings
    (agree) or run against them."""
    out = []
    for p in range(4):
        for idx, source in enumerate((7.0, 2.0, 5.0)):
            ours = source if agree else 10 - source
            out.append(_scored(f"p{p}", idx, int(ours), ours / 10, source_rating=source,
                               origin=f"model-{idx}"))
    return out


def test_label_pair_takes_the_best_and_worst_rated_or_the_labels() -> None:
    for records in group_by_prompt(_rated(True)).values():
        (chosen, rejected), kind = label_pair(records)
        assert (chosen["sample_idx"], rejected["sample_idx"], kind) == (0, 1, "ratings")
    tied = [_scored("t", i, 5, 0.5, source_rating=4.0) for i in range(3)]
    assert label_pair(tied) == (None, "ratings")
    # chosen/rejected labels win over the sample order: rejected is sample 0 here.
    labelled = [_scored("x", 0, 5, 0.5, label="rejected"), _scored("x", 1, 5, 0.5, label="chosen")]
    (chosen, rejected), kind = label_pair(labelled)
    assert (chosen["sample_idx"], rejected["sample_idx"], kind) == (1, 0, "chosen/rejected")


@pytest.mark.parametrize(("agree", "accuracy"), [(True, 1.0), (False, 0.0)])
def test_agreement_follows_the_direction_of_our_scores(tmp_path: Path, agree: bool,
                                                       accuracy: float) -> None:
    cfg = load_config(QUICKSTART, [])
    run = RunDir(tmp_path)
    result = source_agreement(cfg, run, _rated(agree))
    assert result["pairs"] == 4
    for system in ("numeric", "wim", "zeta=0.4"):
        assert result["systems"][system]["accuracy"] == accuracy, system
        assert result["systems"][system]["tie_share"] == 0.0
    assert "| numeric | 4 |" in result["table_markdown"]
    assert json.loads((tmp_path / "agreement.json").read_text()) == result
    assert source_agreement(cfg, run, [_scored("a", 0, 5, 0.5), _scored("a", 1, 6, 0.5)]) is None
    assert not (tmp_path / "agreement.json").exists()  # no labels: no (stale) table


def test_card_metadata_parses_and_states_judge_zeta_counts_and_warning() -> None:
    from huggingface_hub import DatasetCard

    cfg = load_config(QUICKSTART, ["scoring.zeta=0.4", "pairs.tie_policy=drop"])
    scored = _rated(True) + [{**_scored("f", 0, 5, 0.5), "parse_ok": False, "score": None,
                              "parse_error": "echoed the rubric"}]
    counts = {"pairs/count": 4, "pairs/prompts": 5, "pairs/ties": 2, "pairs/ties_dropped": 2}
    text = render_card(cfg, scored, counts, "data-*.arrow")
    card = DatasetCard(text)
    assert card.data.task_categories == ["text-generation"]
    assert card.data.size_categories == ["n<1K"]
    assert card.data.configs == [{"config_name": "default",
                                  "data_files": [{"split": "train", "path": "data-*.arrow"}]}]
    wim = card.data.to_dict()["wim"]
    assert (wim["judge_model"], wim["judge_role"], wim["zeta"]) == (BUNDLED_JUDGE, "fixed", 0.4)
    assert (wim["pairs"], wim["ties_dropped"], wim["judge_parse_failed"]) == (4, 2, 1)
    assert wim["mechanical_numbers"] is True
    assert "**Mechanical numbers.**" in card.text and "cannot really judge" in card.text
    assert "| ties dropped | 2 |" in card.text
    assert "| failed judgements (no parse after retries) | 1 |" in card.text
    assert "Embedder `bundled:all-minilm-l6-v2`, zeta 0.4" in card.text
    assert "| tie rate |" in card.text
    strong = [{**r, "judge_model": "Qwen/Qwen2.5-72B-Instruct"} for r in scored]
    card = DatasetCard(render_card(cfg, strong, counts, "pairs.jsonl"))
    assert "Mechanical numbers" not in card.text
    assert card.data.to_dict()["wim"]["mechanical_numbers"] is False
    assert [size_category(n) for n in (0, 999, 1000, 250_000)] == \
        ["n<1K", "n<1K", "1K<n<10K", "100K<n<1M"]


def test_wim_pairs_and_report_on_written_scores(tmp_path: Path) -> None:
    """The real commands on scores written by hand: the saved dataset loads with its card next
    to it, pairs.jsonl has its own card, and report.md holds the agreement table."""
    import datasets
    from huggingface_hub import DatasetCard

    out = tmp_path / "run"
    source = tmp_path / "uf.jsonl"
    source.write_text('{"prompt": "q", "responses": ["a", "b"]}\n')  # (its content unused here)
    cfg = load_config(QUICKSTART, [f"generation.source={source}", "prompts.holdout=0"])
    run = RunDir(out)
    run.ensure_folder()
    run.save_config(cfg)
    scored = _rated(True)
    write_records_atomic(run.judgements, scored)
    write_records_atomic(run.scores, scored)
    for command in ("pairs", "report"):
        run_wim([command, str(out), "--no-progress", *sets([])])
    saved = datasets.load_from_disk(str(out / "pairs"))
    assert saved.num_rows == 4 and saved.split == "train"
    pairs = datasets.load_dataset("json", data_files=str(out / "pairs.jsonl"), split="train")
    assert saved.to_list() == pairs.to_list() and saved.features == pairs.features
    assert set(saved["chosen_origin"]) == {"model-0"} and set(saved["rejected_origin"]) == \
        {"model-1"}
    card = DatasetCard.load(out / "pairs" / "README.md")
    assert card.data.to_dict()["wim"]["pairs"] == 4
    assert DatasetCard.load(out / "pairs.README.md").data.configs[0]["data_files"][0][
        "path"] == "pairs.jsonl"
    report = (out / "report.md").read_text()
    assert "## Agreement with the source's own preferences" in report
    assert "| wim | 4 | 4 | 0 | 0 | 0 | 1.000 |" in report


def test_card_license_from_the_config_the_source_or_unknown(tmp_path: Path) -> None:
    import datasets
    from huggingface_hub import DatasetCard

    from wim.errors import ConfigError
    from wim.sources import source_license

    scored, counts = _rated(True), {"pairs/count": 4}
    cfg = load_config(QUICKSTART, ["card.license=cc-by-4.0"])
    card = DatasetCard(render_card(cfg, scored, counts, "pairs.jsonl", source_license="mit"))
    assert card.data.license == "cc-by-4.0" and "set by `card.license`" in card.text
    cfg = load_config(QUICKSTART)
    card = DatasetCard(render_card(cfg, scored, counts, "pairs.jsonl", source_license="mit"))
    assert card.data.license == "mit" and "as the source's own card gives it" in card.text
    card = DatasetCard(render_card(cfg, scored, counts, "pairs.jsonl"))
    assert card.data.license == "unknown" and "License: **unknown**. Nothing set it" in card.text
    # A saved dataset names its license in its dataset info; a plain file names none.
    info = datasets.DatasetInfo(license="apache-2.0")
    datasets.Dataset.from_list([{"prompt": "Q?", "responses": ["a", "b"]}], info=info
                               ).save_to_disk(str(tmp_path / "saved"))
    assert source_license(str(tmp_path / "saved")) == "apache-2.0"
    (tmp_path / "r.jsonl").write_text("{}\n")
    assert source_license(str(tmp_path / "r.jsonl")) is None
    with pytest.raises(ConfigError, match=r"'card.license' must be a Hub license id .* got "
                                          r"'Apache 2'"):
        load_config(QUICKSTART, ["card.license=Apache 2"])
    with pytest.raises(ConfigError, match=r"'report.browser_prompts' must be a positive "
                                          r"integer .* got 0"):
        load_config(QUICKSTART, ["report.browser_prompts=0"])


def test_streamed_agreement_equals_the_table_on_the_full_records(tmp_path: Path) -> None:
    """source_agreement keeps only score fields and same-length stand-ins of the answers; its
    table must be the one validity_table gives on the whole records and texts."""
    from data_gen.validity_table import GoldPair, validity_table
    from wim.records import RecordIndex

    cfg = load_config(QUICKSTART, [])
    scored = [{**r, "response": "x" * (7 * r["sample_idx"] + len(r["prompt_id"]))}
              for r in _rated(True) + _rated(False)[:6]]
    scored = [{**r, "prompt_id": f"{r['prompt_id']}-{n // 12}"} for n, r in enumerate(scored)]
    write_records_atomic(tmp_path / "scores.jsonl", scored)
    streamed = source_agreement(cfg, RunDir(tmp_path),
                                RecordIndex(tmp_path / "scores.jsonl").groups())
    gold, remapped = [], []
    pairs = [pair for records in group_by_prompt(scored).values()
             if (pair := label_pair(records)[0]) is not None]
    for chosen, rejected in pairs:
        gid = f"{chosen['prompt_id']}#{chosen['sample_idx']}>{rejected['sample_idx']}"
        gold.append(GoldPair(gid, chosen["domain"], chosen["prompt"], chosen["response"],
                             rejected["response"]))
        remapped += [{**chosen, "prompt_id": gid, "sample_idx": 0},
                     {**rejected, "prompt_id": gid, "sample_idx": 1}]
    assert streamed["systems"] == json.loads(json.dumps(validity_table(cfg, gold, remapped)))
    assert streamed["pairs"] == len(pairs) == 6
