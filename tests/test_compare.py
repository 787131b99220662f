"""`wim compare`: numeric, WIM, mixed and random arms from one generation and one judging pass,
trained with the same seed and steps, evaluated blind against the base and each other."""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path

import pytest
import yaml
from conftest import QUICKSTART, SHRUNK, run_wim, sets

from wim.records import read_keyed, read_records

ARMS = ["numeric", "wim", "mixed-0.4", "random"]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _pairs(n: int) -> list[dict]:
    return [{"prompt_id": f"p{i}", "chosen": f"good {i}", "rejected": f"bad {i}",
             "chosen_sample_idx": 0, "rejected_sample_idx": 1,
             "chosen_score": 0.9, "rejected_score": 0.1} for i in range(n)]


def test_random_control_flips_a_seeded_half_of_the_pairs(tmp_path: Path):
    """Checked against the pairs it was given, not against its own `flipped` flag: a control
    that never flipped, flipped everything or ignored its seed would fail here."""
    from training.compare import randomize_pairs
    from wim.records import write_records_atomic

    flips = {}
    for seed in (0, 0, 1):
        path = tmp_path / f"pairs_{seed}.jsonl"
        write_records_atomic(path, _pairs(200))
        randomize_pairs(path, seed)
        rows = read_records(path)
        swapped = []
        for original, row in zip(_pairs(200), rows, strict=True):
            flipped = row["chosen"] == original["rejected"]
            if flipped:  # both sides and their audit fields change places
                assert (row["rejected"], row["chosen_sample_idx"], row["rejected_score"]) == (
                    original["chosen"], 1, 0.9)
            else:
                assert {k: row[k] for k in original} == original
            assert row["flipped"] is flipped and row["random_control"] is True
            swapped.append(flipped)
        if seed in flips:
            assert swapped == flips[seed]  # the same seed flips the same pairs
        flips[seed] = swapped
    assert 70 <= sum(flips[0]) <= 130  # about half (binomial(200, 1/2): 5.6 sd either side)
    assert flips[0] != flips[1]  # another seed, other pairs


@pytest.mark.slow
def test_compare_on_the_quickstart_config(tmp_path: Path):
    out = tmp_path / "compare"
    proc = run_wim(["compare", str(QUICKSTART), "--out", str(out), "--no-progress",
                    *sets([*SHRUNK, "generation.k=3", "eval.limit=2", "eval.compare_holdout=4",
                           "eval.max_new_tokens=12", "blind.max_new_tokens=12",
                           "blind.max_retries=1"])])
    assert "mechanical" in proc.stdout
    report = json.loads((out / "compare.json").read_text())
    assert "not evidence for or against WIM" in report["mechanical_warning"]
    arms = {a["name"]: a for a in report["arms"]}
    assert list(arms) == ARMS
    assert [arms[a]["zeta"] for a in ARMS] == [0.0, 1.0, 0.4, None]

    # One generation and one judging pass: every arm holds the shared files, byte for byte,
    # and the arms' configs differ in scoring.zeta only.
    shared = out / "shared"
    configs = {}
    for name in ARMS:
        for file in ("samples.jsonl", "judgements.jsonl"):
            assert _sha(out / "arms" / name / file) == _sha(shared / file)
        cfg = yaml.safe_load((out / "arms" / name / "resolved_config.yaml").read_text())["config"]
        configs[name] = cfg
    base = configs["wim"]
    for cfg in configs.values():
        assert {k for k in cfg if cfg[k] != base[k]} <= {"scoring"}
        assert {k for k in cfg["scoring"] if cfg["scoring"][k] != base["scoring"][k]} <= {"zeta"}
    held = json.loads((shared / "split.json").read_text())["holdout"]
    assert len(held) == 4
    assert not {r["prompt_id"] for r in read_keyed(shared / "samples.jsonl")} & set(held)

    # The random control: the WIM arm's pairs, each flipped or not by a seeded coin.
    wim_pairs = read_records(out / "arms" / "wim" / "pairs.jsonl")
    random_pairs = read_records(out / "arms" / "random" / "pairs.jsonl")
    assert [p["prompt_id"] for p in random_pairs] == [p["prompt_id"] for p in wim_pairs]
    for w, r in zip(wim_pairs, random_pairs, strict=True):
        assert r["random_control"] is True
        assert (r["chosen"], r["rejected"]) == ((w["rejected"], w["chosen"]) if r["flipped"]
                                                else (w["chosen"], w["rejected"]))

    trained = [a for a in ARMS if arms[a]["trained"]]
    assert trained  # with 3 samples per prompt some arm has pairs
    judge_tokens = sum(j["prompt_tokens"] + j["completion_tokens"]
                       for j in read_keyed(shared / "judgements.jsonl"))
    for name in trained:
        a = arms[name]
        assert a["pairs_kept"] == len(read_records(out / "arms" / name / "pairs.jsonl")) > 0
        assert a["usable_pairs_per_1k_judge_tokens"] == pytest.approx(
            a["pairs_kept"] / judge_tokens * 1000)
        assert a["train_steps"] == 2 and a["loss_last"] is not None
        assert a["vs_base"]["p_holm"] is not None
    # The pre-specified primary (WIM arm vs numeric arm) first, then every trained arm against
    # the base and against every other trained arm, Holm over all.
    primary = {"wim", "numeric"} <= set(trained)
    expected = ["wim vs numeric"] if primary else []
    expected += [f"{a} vs base" for a in trained]
    expected += [f"{a} vs {b}" for a, b in itertools.combinations(trained, 2)
                 if {a, b} != {"wim", "numeric"}]
    assert [c["name"] for c in report["comparisons"]] == expected
    assert report["primary"] == ("wim vs numeric" if primary else expected[0])
    assert [c["primary"] for c in report["comparisons"]] == [True] + [False] * (len(expected) - 1)
    # 2 prompts can never be significant, and compare.json and compare.md say so first.
    assert report["min_attainable_p_holm"] == pytest.approx(min(1.0, len(expected) * 0.5))
    assert report["power_statement"].startswith("No result of this size can be significant")
    for c in report["comparisons"]:
        assert c["n"] == 2 and c["wins"] + c["losses"] + c["ties"] + c["failures"] == 2
        assert c["p_value"] <= c["p_holm"] <= 1
    md = (out / "compare.md").read_text()
    assert "mechanical" in md
    assert md.index("No result of this size can be significant") < md.index("| arm |")
    for name in ARMS:
        assert f"| {name} |" in md


def test_compare_md_shows_the_unadjusted_p_beside_clopper_pearson():
    from training.compare import _attach_wins, compare_markdown

    base = {"name": "wim vs base", "a": "wim", "b": "base", "primary": False, "n": 20,
            "wins": 12, "losses": 3, "ties": 5, "failures": 0, "win_rate": 0.725,
            "bootstrap_95": [0.6, 0.85], "decisive_rate": 0.8, "decisive_95": [0.519, 0.957],
            "p_value": 0.0352, "p_holm": 0.0704,
            "weighted": {"preference": 0.61, "ci95": [0.52, 0.70], "p_value": 0.021,
                         "p_holm": 0.042, "n": 20, "sources": {"top_logprobs": 20}}}
    arm = {"name": "wim", "zeta": 1.0, "tie_rate": 0.1, "delta": 1.2, "pairs_kept": 30,
           "usable_pairs_per_1k_judge_tokens": 2.5, "loss_first": 0.69, "loss_last": 0.5,
           "reward_margin_last": 0.3}
    report = {"evaluator": {"model": "m", "mode": "pairwise", "verdict": "weighted"},
              "held_out_prompts": 20, "comparisons": [base], "arms": [arm]}
    _attach_wins(report)
    md = compare_markdown(report)
    row = next(line for line in md.splitlines() if line.startswith("| wim | 1.00 |"))
    # Clopper-Pearson, then the sign test's own unadjusted p, then Holm's.
    assert row.endswith("| [0.519, 0.957] | 0.0352 | 0.0704 |")
    assert "| 0.610 | [0.520, 0.700] | 0.042 |" in row  # the weighted test, Holm-adjusted
