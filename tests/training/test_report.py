"""report.md with free-text names: per-domain rows survive `/`, and cells are escaped."""

from __future__ import annotations

import math

from training.report import render_markdown
from wim.config import Config
from wim.metrics import pair_statistics

NASTY = "law/tax | <b>x</b> 🙂\nnext"


def _rec(prompt_id: str, idx: int, rating: int, similarity: float, domain: str) -> dict:
    return {"prompt_id": prompt_id, "sample_idx": idx, "domain": domain, "rating": rating,
            "rating_norm": (rating - 5) / 5, "similarity": similarity}


def _report(stats: dict) -> dict:
    base = {"policy/model": "p|<m>", "judge/model": "j", "judge/role": "fixed",
            "judge/mode": "wim", "score/embedder": "e"}
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
