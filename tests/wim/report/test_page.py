"""`wim report DIR` on a run directory whose records another tool wrote (no model is loaded):
report.md, one self-contained report.html (plots inside as data URIs, all text escaped, the
critique browser's data safe inside <script>), eval.json and per-round tables, and the
mechanical-numbers warning."""

from __future__ import annotations

import base64
import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import QUICKSTART, run_wim

from wim.config import load_config
from wim.pairs import build_pairs
from wim.records import write_records_atomic
from wim.report.browser import script_json
from wim.report.page import inline, markdown_to_html
from wim.rundir import RunDir

EVIL = "<script>window.__pwned=1</script><img src=x onerror=alert(1)> & </script>"
SMALL_JUDGE = "bundled:smollm2-135m-instruct"
EVAL = {
    "evaluator": {"model": "judge-<x>", "mode": "pairwise"},
    "mechanical_warning": "The evaluator is the bundled 135M model: mechanical numbers.",
    "held_out_prompts": 40, "primary": "policy vs base", "min_attainable_p": 1.8e-12,
    "min_attainable_p_holm": 3.6e-12,
    "power_statement": "Power: with 40 prompt(s) and 2 comparison(s) the smallest attainable "
                       "Holm-adjusted p is 3.6e-12.",
    "comparisons": [
        {"name": "policy vs base", "primary": True, "a": "policy", "b": "base", "n": 40,
         "wins": 22, "losses": 14, "ties": 4, "failures": 1,
         "ties_split": {"real": 3, "order_disagreement": 1, "identical": 0},
         "order_agreement": 0.75, "orders_compared": 39, "decisive_rate": 0.611,
         "decisive_95": [0.435, 0.769], "win_rate": 0.6, "bootstrap_95": [0.46, 0.73],
         "p_value": 0.0123, "p_holm": 0.0246,
         "sensitivity": {"failures_as_losses": 0.585, "failures_as_wins": 0.61},
         "length_adjusted_win_rate": 0.57, "length_slope": 0.1,
         "length_adjusted_95": [0.4, 0.7], "length_note": "n = 39 < 50: too few"},
        {"name": "wim vs numeric", "primary": False, "a": "wim", "b": "numeric", "n": 40,
         "wins": 0, "losses": 0, "ties": 40, "failures": 0,
         "ties_split": {"real": 0, "order_disagreement": 40, "identical": 0},
         "order_agreement": 0.0, "decisive_rate": None, "decisive_95": None,
         "win_rate": 0.5, "bootstrap_95": None,
         "bootstrap_note": "all 40 outcomes are equal (ties): no interval", "p_value": 1.0,
         "p_holm": 1.0, "length_adjusted_win_rate": 0.5, "length_slope": None},
    ],
}


def _record(pid: str, idx: int, domain: str, rating: int | None, sim: float | None,
            judge: str, response: str = "an answer") -> dict:
    ok = rating is not None
    rn = (rating - 5) / 5 if ok else None
    return {"prompt_id": pid, "sample_idx": idx, "domain": domain,
            "messages": [{"role": "user", "content": f"question {pid}"}],
            "prompt": f"question {pid}", "response": response, "judge_role": "fixed",
            "judge_model": judge, "critique": "what is missing" if ok else None,
            "rating": rating, "raw_judge_text": "Missing: x\nRating: " + str(rating or "?"),
            "parse_ok": ok, "parse_error": None if ok else "no rating", "attempts": 1,
            "echoed_attempts": 0, "rating_norm": rn, "similarity": sim,
            "score": None if not ok else 0.6 * rn + 0.4 * sim, "zeta": 0.4}


def build_run(folder: Path, judge: str = SMALL_JUDGE) -> Path:
    """A finished run (without training) written by hand: 3 prompts in 2 domains."""
    cfg = load_config(QUICKSTART, [])
    run = RunDir(folder)
    run.ensure_folder()
    run.save_config(cfg)
    records = [
        _record("p1", 0, "science", 8, 0.5, judge, response=EVIL),
        _record("p1", 1, "science", 4, 0.2, judge),
        _record("p2", 0, "law <i>&</i>", 6, 0.3, judge),
        _record("p2", 1, "law <i>&</i>", 6, 0.3, judge),  # a tie under every system
        _record("p3", 0, "science", 7, 0.4, judge),
        _record("p3", 1, "science", None, None, judge),  # a parse failure
    ]
    write_records_atomic(run.judgements, records)
    write_records_atomic(run.scores, records)
    rows, _ = build_pairs(records, cfg.pairs, seed=0)
    write_records_atomic(run.pairs, rows)
    return folder


def _data_uris(page: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)",
                                                    page)]


def test_report_page_is_self_contained_escaped_and_complete(tmp_path: Path) -> None:
    run = build_run(tmp_path / "run")
    (run / "eval.json").write_text(json.dumps(EVAL))
    history = [{"loss": 0.69, "rewards/margins": 0.0, "step": 1},
               {"loss": 0.61, "rewards/margins": 0.2, "step": 2}]
    (run / "train").mkdir()
    (run / "train" / "log_history.json").write_text(json.dumps(history))
    for r in (0, 1):  # two rounds of issue 10's layout: DIR/rounds/<r>/scores.jsonl
        (run / "rounds" / str(r)).mkdir(parents=True)
        (run / "rounds" / str(r) / "scores.jsonl").write_text(
            (run / "scores.jsonl").read_text())
    (run / "plots").mkdir()
    other = run / "plots" / "quality_vs_tokens.png"  # e.g. a refinement run's plot
    other.write_bytes(base64.b64decode(
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAAB"
        "JRU5ErkJggg=="))
    run_wim(["report", str(run)])

    pngs = sorted(p.name for p in (run / "plots").glob("*.png"))
    assert pngs == ["quality_vs_tokens.png", "rounds.png", "score_hist.png", "train.png",
                    "win_rates.png"]
    page = (run / "report.html").read_text()
    # Every plot is inside the page; nothing is loaded from elsewhere.
    embedded = _data_uris(page)
    assert sorted(embedded) == sorted((run / "plots" / n).read_bytes() for n in pngs)
    assert "quality_vs_tokens.png</figcaption>" in page
    links = re.findall(r"""(?:src|href)=["']([^"']*)""", page)
    assert links and all(link.startswith("data:") for link in links)
    assert "@import" not in page and "url(" not in page
    # Model text never becomes markup: only our two script elements exist.
    assert page.count("<script") == 2 and "window.__pwned" in page
    assert "<img src=x" not in page and "<i>&</i>" not in page
    assert "<td>law &lt;i&gt;&amp;&lt;/i&gt;</td>" in page
    # The browser's data is the run's: 2 pairs (p1, p3 with one parse failure -> unpaired),
    data = json.loads(re.search(r'id="wim-data">(.*?)</script>', page, re.S)[1])
    kinds = {e["prompt_id"]: e["kind"] for e in data}
    assert kinds == {"p1": "pair", "p2": "tie", "p3": "unpaired"}
    assert data[0]["sides"][0]["response"] == EVIL
    assert [e["failed"] for e in data] == [False, False, True]
    # The mechanical-numbers warning is on the page, above the tables and in the browser.
    assert page.count("class='note warning") >= 2 and "135M" in page
    # eval.json at the top: warnings and power, the primary comparison, then the table with
    # each interval beside its own rate (raw and Holm p-values), and per-round rows.
    md = (run / "report.md").read_text()
    assert md.index("Blind evaluation") < md.index("Numeric vs WIM vs mixed")
    assert md.index("**Mechanical numbers.**") < md.index("**Power.**") < md.index(
        "Primary comparison (pre-specified): policy vs base")
    assert ("| policy vs base (primary) | 40 | 22 / 14 / 4 | 1 | 3 / 1 / 0 | 0.750 | 0.611 | "
            "[0.435, 0.769] | 0.0123 | 0.0246 | 0.600 | [0.460, 0.730] | 0.585 / 0.610 | "
            "0.570 (0.100) |") in md
    assert "exact Clopper-Pearson 95% [0.435, 0.769], p = 0.0123 (unadjusted" in md
    # All outcomes equal: said in words, no zero-width interval.
    assert "| wim vs numeric | 40 | 0 / 0 / 40 | 0 | 0 / 40 / 0 | 0.000 | - | - | 1 | 1 | " \
           "0.500 | none: all outcomes equal |" in md
    report = json.loads((run / "report.json").read_text())
    assert [r["round"] for r in report["rounds"]] == [0, 1]
    assert report["rounds"][0]["pairs/tie_rate/numeric"] == report["pairs/tie_rate/numeric"]
    assert "## Per round" in md
    assert "<h2>Blind evaluation: did training help? (eval.json)</h2>" in page


def test_no_warning_for_a_strong_judge_and_stale_plots_go(tmp_path: Path) -> None:
    run = build_run(tmp_path / "run", judge="some-70b-judge")
    (run / "plots").mkdir()
    (run / "plots" / "win_rates.png").write_bytes(b"stale")  # no eval.json any more
    run_wim(["report", str(run)])
    page = (run / "report.html").read_text()
    assert "Mechanical numbers" not in page and "Read this first" not in page
    assert not (run / "plots" / "win_rates.png").exists()
    assert sorted(p.name for p in (run / "plots").glob("*.png")) == ["rounds.png",
                                                                     "score_hist.png"]
    # `wim report DIR` alone always rebuilds, so it picks up a plot another tool added since.
    shutil.copy(run / "plots" / "rounds.png", run / "plots" / "refine_quality.png")
    proc = run_wim(["report", str(run)])
    assert "skipped" not in proc.stderr
    assert "refine_quality.png</figcaption>" in (run / "report.html").read_text()


def test_a_broken_eval_json_is_a_clear_error(tmp_path: Path) -> None:
    run = build_run(tmp_path / "run")
    (run / "eval.json").write_text('{"comparisons": 3}')
    proc = run_wim(["report", str(run)], check=False)
    assert proc.returncode == 2
    assert "eval.json: expected an object with a 'comparisons' list" in proc.stderr


@pytest.mark.parametrize("text", [EVIL, "</script><!--", "a\u2028b", "&amp; <b>"])
def test_script_json_cannot_close_its_element_and_round_trips(text: str) -> None:
    encoded = script_json({"t": text, "nan": float("nan")})
    assert "<" not in encoded and ">" not in encoded and "&" not in encoded
    assert json.loads(encoded) == {"t": text, "nan": None}


def test_markdown_to_html_escapes_whatever_the_markdown_did() -> None:
    assert inline(r"p\|&lt;m&gt; `<code>` **bold**") == (
        "p|&lt;m&gt; <code>&lt;code&gt;</code> <strong>bold</strong>")
    assert inline("raw <script>x</script>") == "raw &lt;script&gt;x&lt;/script&gt;"
    html = markdown_to_html("| a | b |\n|---|---|\n| x \\| y | <b> |", Path("."))
    assert "<td>x | y</td><td>&lt;b&gt;</td>" in html


def test_browser_shows_at_most_browser_prompts_failed_first(tmp_path: Path) -> None:
    """2,000 prompts of 2 long responses (4 MB of records): the page carries 50 prompts, the
    3 with a failed judgement among them, says so, and stays small; the same seed draws the
    same ones."""
    cfg = load_config(QUICKSTART, [])
    run = RunDir(tmp_path / "run")
    run.ensure_folder()
    run.save_config(cfg)
    long = "word " * 200
    failed = {"p0007", "p0999", "p1993"}
    records = [_record(f"p{i:04d}", j, "d", None if f"p{i:04d}" in failed and j else 3 + j,
                       0.1 * j, "some/judge", response=long + str(j))
               for i in range(2000) for j in range(2)]
    write_records_atomic(run.judgements, records)
    write_records_atomic(run.scores, records)
    write_records_atomic(run.pairs, build_pairs(records, cfg.pairs, seed=0)[0])
    run_wim(["report", str(run.path), "--set", "report.browser_prompts=50"])
    page = (run.path / "report.html").read_text()
    data = json.loads(re.search(r'id="wim-data">(.*?)</script>', page, re.S)[1])
    shown = [e["prompt_id"] for e in data]
    assert len(set(shown)) == 50 and failed <= set(shown) and shown == sorted(shown)
    assert "Showing 50 of 2,000 prompts: every prompt with a failed judgement first" in page
    assert len(page) < 0.1 * run.scores.stat().st_size
    run_wim(["report", str(run.path), "--set", "report.browser_prompts=50"])
    again = json.loads(re.search(r'id="wim-data">(.*?)</script>',
                                 (run.path / "report.html").read_text(), re.S)[1])
    assert [e["prompt_id"] for e in again] == shown
