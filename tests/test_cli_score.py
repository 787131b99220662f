"""`wim score` on judgements written by hand (as another tool would write them), through the
real CLI: the nothing-missing rule and the formula are applied to whatever it reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import QUICKSTART, run_wim

from wim.config import load_config
from wim.records import read_records
from wim.rundir import RunDir

NOTHING = ["None", "none", "Nothing is missing.", "", "N/A"]


def _judgement(i: int, critique: str, rating: int, parse_ok: bool = True) -> dict:
    return {"prompt_id": f"p{i // 2}", "sample_idx": i % 2, "domain": "science",
            "messages": [{"role": "user", "content": "Why is the sky blue?"}],
            "prompt": "Why is the sky blue?", "response": f"Rayleigh scattering, answer {i}.",
            "judge_role": "external", "judge_model": "another-tool", "critique": critique,
            "rating": rating, "parse_ok": parse_ok}


def _run_with(tmp_path: Path, judgements: list[dict]) -> Path:
    out = tmp_path / "run"
    RunDir(out).claim(load_config(QUICKSTART))
    (out / "judgements.jsonl").write_text("".join(json.dumps(j) + "\n" for j in judgements))
    return out


@pytest.mark.parametrize("zeta", [0.4, 1.0])
def test_nothing_missing_forms_score_as_similarity_one(tmp_path: Path, zeta: float) -> None:
    ratings = [3, 8, 10, 6, 1]
    out = _run_with(tmp_path, [_judgement(i, c, n)
                               for i, (c, n) in enumerate(zip(NOTHING, ratings, strict=True))])
    run_wim(["score", str(out), "--set", f"scoring.zeta={zeta}"])
    scores = read_records(out / "scores.jsonl")
    assert len(scores) == len(NOTHING)
    for record, rating in zip(scores, ratings, strict=True):
        assert record["similarity"] == pytest.approx(1.0, abs=1e-5)
        expected = (1 - zeta) * (rating - 5) / 5 + zeta * 1.0
        assert record["score"] == pytest.approx(expected, abs=1e-5)
        assert record["critique"] == ""  # normalized, so the report counts it as nothing missing


def test_bad_judgement_record_names_file_record_and_key(tmp_path: Path) -> None:
    out = _run_with(tmp_path, [_judgement(0, "None", 7), _judgement(1, "None", 11)])
    proc = run_wim(["score", str(out)], check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "judgements.jsonl, record 2" in proc.stderr and "'rating'" in proc.stderr
    assert not (out / "scores.jsonl").exists()


def test_authors_fallback_scores_and_counts_failed_parses(tmp_path: Path) -> None:
    """judge.on_parse_failure=authors, switched on for existing judgements by `wim score`:
    an unparseable rating counts as rating_norm 0, a missing critique leaves the rating alone."""
    judgements = [
        _judgement(0, "None", 9),
        {**_judgement(1, None, 8, parse_ok=False), "parse_error": "echoed rubric"},
        {**_judgement(2, "", None, parse_ok=False), "parse_error": "no rating found"},
        {**_judgement(3, None, None, parse_ok=False), "parse_error": "no rating found"},
    ]
    out = _run_with(tmp_path, judgements)
    run_wim(["score", str(out)])  # the default, exclude: failed parses get no score
    assert [r["score"] for r in read_records(out / "scores.jsonl")][1:] == [None] * 3
    run_wim(["score", str(out), "--set", "judge.on_parse_failure=authors",
             "--set", "scoring.zeta=0.4"])
    scores = read_records(out / "scores.jsonl")
    expected = [0.6 * 0.8 + 0.4, 0.6, 0.4 * 1.0, 0.0]
    assert [r["score"] for r in scores] == pytest.approx(expected, abs=1e-9)
    assert [r.get("fallback") for r in scores] == [None, "critique", "rating",
                                                   "rating+critique"]
    stats = json.loads((out / "stats" / "score.json").read_text())
    assert stats["score/fallback_rating"] == 2 and stats["score/fallback_critique"] == 2
