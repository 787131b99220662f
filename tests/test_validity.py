"""`wim validity`: how often each scoring system ranks the better gold answer first."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from conftest import QUICKSTART, run_wim, sets
from scipy.stats import ttest_1samp

from data_gen.validity import load_gold
from data_gen.validity_table import GoldPair, paired_vs_numeric, validity_table
from wim.config import load_config
from wim.errors import InputError
from wim.prompts import load_prompts


def test_bundled_gold_set_covers_the_eight_domains():
    pairs = load_gold()
    assert len(pairs) >= 40
    domains = Counter(p.domain for p in pairs)
    assert set(domains) == {p.domain for p in load_prompts("bundled")}
    assert min(domains.values()) >= 5
    assert len({p.id for p in pairs}) == len(pairs)
    assert all(p.chosen != p.rejected for p in pairs)
    # Not a length test: in some pairs the worse answer is the longer one.
    assert sum(len(p.rejected) > len(p.chosen) for p in pairs) >= 10


def test_other_gold_sources(tmp_path: Path):
    csv_file = tmp_path / "gold.csv"
    csv_file.write_text('prompt,chosen,rejected\n"Q1?","good, yes","bad"\nQ2?,fine,poor\n')
    pairs = load_gold(str(csv_file))
    assert [(p.prompt, p.chosen, p.rejected) for p in pairs] == [
        ("Q1?", "good, yes", "bad"), ("Q2?", "fine", "poor")]
    trl = tmp_path / "gold.jsonl"
    trl.write_text(json.dumps({
        "prompt": [{"role": "user", "content": "Q?"}],
        "chosen": [{"role": "assistant", "content": "right"}],
        "rejected": [{"role": "assistant", "content": "wrong"}]}) + "\n")
    assert load_gold(str(trl))[0] == GoldPair("00000", "", "Q?", "right", "wrong")
    assert len(load_gold(None, limit=3)) == 3


def test_bad_gold_file_names_the_line(tmp_path: Path):
    bad = tmp_path / "gold.jsonl"
    bad.write_text('{"prompt": "Q", "chosen": "a", "rejected": "b"}\n'
                   '{"prompt": "Q2", "chosen": "a"}\n')
    with pytest.raises(InputError, match=r"line 2: missing rejected"):
        load_gold(str(bad))
    # Through the CLI: a clear error and exit 2, before any model is loaded.
    proc = run_wim(["validity", str(QUICKSTART), "--gold", str(bad)], check=False)
    assert proc.returncode == 2 and "line 2: missing rejected" in proc.stderr


def _scored(pid: str, idx: int, rating: int | None, similarity: float | None) -> dict:
    return {"prompt_id": pid, "sample_idx": idx, "rating_norm": None if rating is None
            else (rating - 5) / 5, "similarity": similarity}


def test_counting_right_wrong_ties_and_failures():
    cfg = load_config(QUICKSTART)
    pairs = [GoldPair(f"g{i}", "d", "Q", "long chosen", "short") for i in range(4)]
    scored = [
        _scored("g0", 0, 8, 0.9), _scored("g0", 1, 8, 0.2),     # numeric tie, wim right
        _scored("g1", 0, 3, 0.1), _scored("g1", 1, 9, 0.5),     # both wrong
        _scored("g2", 0, 9, 0.6), _scored("g2", 1, 2, 0.6),     # numeric right, wim tie
        _scored("g3", 0, None, None), _scored("g3", 1, 5, 0.5),  # a failed judgement
    ]
    table = validity_table(cfg, pairs, scored)
    numeric, wim = table["numeric"], table["wim"]
    for row in (numeric, wim):
        assert (row["right"], row["wrong"], row["ties"], row["failures"]) == (1, 1, 1, 1)
    assert numeric["accuracy"] == pytest.approx(1.5 / 3)
    assert numeric["tie_share"] == pytest.approx(1 / 3)
    assert numeric["strict_accuracy"] == pytest.approx(1 / 3)
    assert table["longer answer (reference)"]["right"] == 4
    assert "zeta=0.4" in table


@pytest.mark.slow
def test_validity_runs_on_the_bundled_gold_set_with_the_bundled_judge(tmp_path: Path):
    out = tmp_path / "validity"
    proc = run_wim(["validity", str(QUICKSTART), "--limit", "2", "--out", str(out),
                    "--no-progress", *sets(["judge.max_retries=0", "judge.max_new_tokens=24"])])
    report = json.loads((out / "validity.json").read_text())
    assert report == json.loads(proc.stdout)
    assert report["pairs"] == 2
    assert "not evidence for or against WIM" in report["mechanical_warning"]
    for name in ("numeric", "wim", "zeta=0.4", "longer answer (reference)"):
        row = report["systems"][name]
        assert row["n"] == 2 and row["right"] + row["wrong"] + row["ties"] + row["failures"] == 2
        assert row["accuracy"] is None or 0.0 <= row["accuracy"] <= 1.0
    md = (out / "validity.md").read_text()
    assert "mechanical" in md and "| numeric |" in md and "| wim |" in md
    assert len((out / "validity_judgements.jsonl").read_text().splitlines()) <= 4


def test_paired_test_against_numeric_and_intervals_match_the_libraries():
    from scipy.stats import binomtest

    cfg = load_config(QUICKSTART)
    pairs = [GoldPair(f"g{i}", "ab"[i % 2], "Q", "long chosen", "short") for i in range(12)]
    scored = []
    for i in range(12):
        # numeric: right on g0-g3, a tie on g4-g5, wrong after; wim: right on g0-g9.
        rating = 9 if i < 4 else 5 if i < 6 else 2
        scored += [_scored(f"g{i}", 0, rating, 0.9 if i < 10 else 0.1),
                   _scored(f"g{i}", 1, 5, 0.5)]
    table = validity_table(cfg, pairs, scored)
    numeric, wim = table["numeric"], table["wim"]
    assert (numeric["right"], numeric["ties"], numeric["wrong"]) == (4, 2, 6)
    assert (wim["right"], wim["wrong"]) == (10, 2)
    # The sign test's own interval: Clopper-Pearson of right / (right + wrong).
    ci = binomtest(10, 12).proportion_ci(method="exact")
    assert wim["decisive_95"] == pytest.approx([ci.low, ci.high])
    assert wim["p_value"] == pytest.approx(binomtest(10, 12).pvalue)
    assert "wilson_95" not in wim and wim["bootstrap_95"][0] <= wim["accuracy"]
    # Paired against numeric on the same 12 pairs: wim alone right on g4-g9 (6), numeric
    # alone right on none; the t-test of the per-pair differences with its own interval.
    v = wim["vs_numeric"]
    assert (v["n"], v["only_system_right"], v["only_numeric_right"]) == (12, 6, 0)
    diffs = [0.0] * 4 + [0.5] * 2 + [1.0] * 4 + [0.0] * 2
    t = ttest_1samp(diffs, 0.0)
    assert v["accuracy_diff"] == pytest.approx((10 - 5) / 12) == pytest.approx(np.mean(diffs))
    assert v["diff_p"] == pytest.approx(t.pvalue)
    assert v["diff_95"] == pytest.approx(list(t.confidence_interval()))
    assert "diff_p_holm" in v and "vs_numeric" not in numeric
    # Every per-domain accuracy has its n and an interval (or says why there is none).
    for d in ("a", "b"):
        dom = wim["by_domain"][d]
        assert dom["n"] == 6 and (dom["bootstrap_95"] or dom["bootstrap_note"])


def test_the_paired_test_is_of_the_accuracy_difference_it_sits_beside():
    """12 pairs scored as a tie by the system and wrong by numeric, 8 right by both: the
    difference (ties half) is 0.30, and its test must see it (McNemar on "strictly right"
    said p = 1.0 beside an interval of [0.20, 0.40])."""
    system = [0.5 if i < 12 else 1.0 for i in range(20)]
    numeric = [0.0 if i < 12 else 1.0 for i in range(20)]
    v = paired_vs_numeric(system, numeric)
    assert v["accuracy_diff"] == pytest.approx(0.30)
    assert v["diff_p"] < 0.001 and v["diff_95"][0] > 0  # the test and its interval agree
    t = ttest_1samp([0.5] * 12 + [0.0] * 8, 0.0)
    assert v["diff_p"] == pytest.approx(t.pvalue)
    assert (v["only_system_right"], v["only_numeric_right"]) == (0, 0)
