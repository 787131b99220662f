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
