"""The report's text: the echoed-rubric count sits beside the parse-failure rate, and the
authors' fallback is counted, never hidden."""

from __future__ import annotations

from training.report import render_markdown
from wim.config import Config

BASE = {"policy/model": "p", "judge/model": "j", "judge/role": "fixed", "judge/mode": "wim",
        "judge/prompt": "ours", "score/embedder": "bundled:all-mpnet-base-v2",
        "judge/count": 20, "judge/parse_failed": 9, "judge/parse_fail_rate": 0.45,
        "judge/echoed_rubric": 7, "judge/echoed_rubric_rate": 0.35,
        "judge/echoed_rubric_any_attempt": 15, "judge/echoed_rubric_any_attempt_rate": 0.75}


def test_echoed_rubric_count_beside_parse_failures() -> None:
    text = render_markdown(BASE, Config(), [])
    assert "9 failed to parse after retries (45.0%), of which 7 echoed the rubric" in text
    assert "(35.0% of all judgements); 15 (75.0%) echoed it on at least one attempt" in text
    assert "left out of ranking" in text
    assert "embedder `bundled:all-mpnet-base-v2`" in text


def test_authors_fallback_is_counted_in_the_text() -> None:
    r = {**BASE, "score/on_parse_failure": "authors", "score/fallback_rating": 3,
         "score/fallback_critique": 8}
    text = render_markdown(r, Config(), [])
    assert "3 with an unparseable rating counted as rating_norm 0" in text
    assert "8 without a critique scored by the rating alone" in text
