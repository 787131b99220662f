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
    assert row.startswith(r"| law/tax \| \<b>x\</b> 🙂 next | 0.0% |")
    assert "n/a" not in row
    # Every row of the per-domain table has as many cells as its header.
    table = markdown.split("## Per domain")[1].split("\n\n")[1].splitlines()
    cells = {len(line.replace(r"\|", "").split("|")) for line in table}
    assert len(cells) == 1
    assert "p\\|\\<m>" in markdown and markdown.count("<m>") == markdown.count("\\<m>")


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


def test_per_round_statistics_read_each_round_by_prompt(tmp_path) -> None:
    """collect_rounds streams each round's scores one prompt at a time (a resumed round's
    records of one prompt need not be together) and agrees with the whole-list statistics."""
    import json

    from wim.report.sections import collect_rounds
    from wim.rundir import RunDir

    cfg = Config()
    expected = {}
    for r, shift in ((1, 0), (2, 3)):
        records = [_rec(f"p{i}", k, 1 + (i * 3 + k * 5 + shift) % 10, (i + k) % 7 / 7, "d")
                   for i in range(6) for k in range(4)]
        expected[r] = pair_statistics(records, cfg.scoring.zeta, [], cfg.pairs.tie_tolerance)
        # Written out of prompt order: sample 3 of every prompt last, as a resume appends.
        order = [x for x in records if x["sample_idx"] < 3] + \
            [x for x in records if x["sample_idx"] == 3]
        folder = tmp_path / "rounds" / str(r)
        folder.mkdir(parents=True)
        (folder / "scores.jsonl").write_text("".join(json.dumps(x) + "\n" for x in order))
        (folder / "pairs.jsonl").write_text("{}\n" * (r + 1))
    rounds = collect_rounds(cfg, RunDir(tmp_path))
    assert [e["round"] for e in rounds] == [1, 2]
    for entry in rounds:
        want = {k: v for k, v in expected[entry["round"]].items() if k.startswith("pairs/")}
        assert entry == {"round": entry["round"], **want, "pairs/count": entry["round"] + 1}
