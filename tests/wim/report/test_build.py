"""The report's text: per-domain rows survive free-text names (`/`, `|`, `<`) and cells are
escaped; the echoed-rubric count sits beside the parse-failure rate; the authors' fallback is
counted, never hidden."""

from __future__ import annotations

import math

from wim.config import Config
from wim.metrics import pair_statistics
from wim.report import render_markdown

NASTY = "law/tax | <b>x</b> 🙂\nnext"


def _rec(prompt_id: str, idx: int, rating: int, similarity: float, domain: str) -> dict:
    return {"prompt_id": prompt_id, "sample_idx": idx, "domain": domain, "rating": rating,
            "rating_norm": (rating - 5) / 5, "similarity": similarity}


def _report(stats: dict) -> dict:
    base = {"policy/model": "p|<m>", "judge/model": "j", "judge/role": "fixed",
            "judge/mode": "wim", "judge/prompt": "ours", "score/embedder": "e"}
    return {**base, **{k: None if isinstance(v, float) and math.isnan(v) else v
                       for k, v in stats.items()}}


def test_a_domain_with_a_slash_keeps_its_statistics_and_is_escaped() -> None:
    scored = [_rec("a/1", 0, 8, 0.5, NASTY), _rec("a/1", 1, 4, 0.4, NASTY),
              _rec("b", 0, 6, 0.4, "plain"), _rec("b", 1, 6, 0.9, "plain")]
    stats = pair_statistics(scored, zeta=0.4, zetas=[])
    assert stats["domain/law%2Ftax | <b>x<%2Fb> 🙂\nnext/tie_rate/numeric"] == 0.0
    markdown = render_markdown(_report(stats), Config(), [])
    [row] = [line for line in markdown.splitlines() if line.startswith("| law/tax")]
    assert row.startswith(r"| law/tax \| &lt;b&gt;x&lt;/b&gt; 🙂 next | 0.0% |")
    assert "n/a" not in row
    # Every row of the per-domain table has as many cells as its header.
    table = markdown.split("## Per domain")[1].split("\n\n")[1].splitlines()
    cells = {len(line.replace(r"\|", "").split("|")) for line in table}
    assert len(cells) == 1
    assert "p\\|&lt;m&gt;" in markdown and "<m>" not in markdown


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
