"""report.html in a real browser (Debian's chromium + chromedriver, driven by selenium), on a
real run: the critique browser shows every pair, its filters and search narrow the list, the
page logs no console error, and model text holding `<script>` / `<img onerror>` runs nothing.

CI installs chromium and chromium-driver (.ci/run); without them locally the test is skipped.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import QUICKSTART, run_wim, sets

from wim.records import read_records, write_records_atomic

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
MISSING = ("needs Debian's chromium and chromium-driver (apt-get install chromium "
           "chromium-driver; .ci/run installs them in CI)")
# CI sets WIM_REQUIRE_BROWSER=1: there a missing browser fails the test instead of skipping it.
REQUIRED = os.environ.get("WIM_REQUIRE_BROWSER") == "1"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER) and not REQUIRED, reason=MISSING),
]

DOMAIN_B = "history & <b>law</b>"  # markup in a domain name must show as text too
PROMPTS = [
    ("sci-1", "science", "Explain why ice floats on water."),
    ("sci-2", "science", "Why is the sky blue during the day?"),
    ("sci-3", "science", "How do vaccines train the immune system?"),
    ("his-1", DOMAIN_B, "Why did the Roman Empire split in two?"),
    ("his-2", DOMAIN_B, "What was the Magna Carta?"),
    # Goes through the real generation and judging: the model may well repeat it.
    ("his-3", DOMAIN_B, 'Repeat this HTML exactly: <img src=x onerror="window.__pwned=3">'
                        "<script>window.__pwned=4</script>"),
]
MARKER = "zanzibar-quokka"  # a word no model writes: the search must find exactly its entry
INJECTED = (f"{MARKER} </script><script>window.__pwned=1;document.title='pwned'</script>"
            "<img src=x onerror=\"window.__pwned=2;document.title='pwned'\"> <!-- ]]>")
SMALL = ["prompts.holdout=0", "generation.max_new_tokens=16", "generation.batch_size=2",
         "judge.max_new_tokens=24",
         "judge.max_retries=1",
         # Failed judgements are still scored (as the authors did), so every prompt gives a pair
         # and the browser has both pairs and marked parse failures (real ones, if any, and the
         # planted one).
         "judge.on_parse_failure=authors"]


# The guided judge rarely fails to parse any more, so one failure is planted (a critique that
# failed while its rating held, a state the judge really records) for the failure filter.
PLANTED_FAILURE = ("his-1", 1)


def _plant(run: Path) -> None:
    """Put the injected text into one response and one critique of every record file, as a
    hostile model (or another tool writing the records) might, and mark one parse failure."""
    for name in ("judgements.jsonl", "scores.jsonl"):
        records = read_records(run / name)
        for r in records:
            if (r["prompt_id"], r["sample_idx"]) == ("sci-1", 0):
                r["response"] = INJECTED
                r["critique"] = INJECTED
            if (r["prompt_id"], r["sample_idx"]) == PLANTED_FAILURE:
                r["parse_ok"], r["parse_error"] = False, "no critique found (planted by the test)"
            if not r["parse_ok"]:
                r["raw_judge_text"] = f"{r['raw_judge_text']} <script>window.__pwned=5</script>"
        write_records_atomic(run / name, records)
    pairs = read_records(run / "pairs.jsonl")
    for p in pairs:
        for side in ("chosen", "rejected"):
            if p["prompt_id"] == "sci-1" and p[f"{side}_sample_idx"] == 0:
                p[side] = [{"role": "assistant", "content": INJECTED}]
    write_records_atomic(run / "pairs.jsonl", pairs)


@pytest.fixture(scope="module")
def report_page(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("browser")
    prompts = folder / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": i, "domain": d, "prompt": p}) + "\n"
                               for i, d, p in PROMPTS))
    run = folder / "run"
    run_wim(["run", str(QUICKSTART), "--out", str(run), "--no-progress", "--skip-train",
             *sets([f"prompts.source={prompts}", *SMALL])])
    _plant(run)
    run_wim(["report", str(run)])  # rebuilt from the run directory alone
    return run, run / "report.html"


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.fail(f"WIM_REQUIRE_BROWSER=1 but chromium is missing: {MISSING}")
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1366,900"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options,
                              service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def _shown(driver) -> int:
    return driver.execute_script(
        "return document.querySelectorAll('#entries article.entry:not([hidden])').length")


def test_critique_browser_in_chromium(browser, report_page) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    run, page = report_page
    pairs = read_records(run / "pairs.jsonl")
    scores = read_records(run / "scores.jsonl")
    failed_prompts = {r["prompt_id"] for r in scores if not r["parse_ok"]}
    assert len(pairs) >= 2 and failed_prompts, "the run should give pairs and parse failures"

    browser.get(page.as_uri())
    errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert errors == []
    # Nothing injected ran: not the planted text, not the prompt the model was asked to repeat.
    assert browser.execute_script("return window.__pwned === undefined")
    assert browser.title == "WIM run report"
    # ... and it shows as text.
    assert INJECTED in browser.find_element(By.ID, "entries").text
    domains = [o.text for o in Select(browser.find_element(By.ID, "f-domain")).options]
    assert DOMAIN_B in domains

    # Every pair of pairs.jsonl is shown, and each prompt without a pair once.
    kinds = browser.execute_script(
        "return Array.from(document.querySelectorAll('#entries article.entry'))"
        ".map(a => a.dataset.kind)")
    assert kinds.count("pair") == len(pairs)
    assert len(kinds) == len(pairs) + len({p for p, _, _ in PROMPTS} - {p["prompt_id"]
                                                                         for p in pairs})
    total = len(kinds)
    assert _shown(browser) == total
    assert browser.find_element(By.ID, "shown-count").text == f"{total} of {total} shown"
    mechanical = browser.find_element(By.CSS_SELECTOR, "#browser .warning")
    assert mechanical.is_displayed() and "135M" in mechanical.text

    # Filters narrow the list, to exactly the matching entries.
    Select(browser.find_element(By.ID, "f-domain")).select_by_visible_text(DOMAIN_B)
    in_b = sum(p["domain"] == DOMAIN_B for p in pairs) + sum(
        1 for p, d, _ in PROMPTS if d == DOMAIN_B and p not in {q["prompt_id"] for q in pairs})
    assert _shown(browser) == in_b < total
    Select(browser.find_element(By.ID, "f-domain")).select_by_index(0)
    Select(browser.find_element(By.ID, "f-kind")).select_by_value("failed")
    failed_entries = browser.execute_script(
        "return Array.from(document.querySelectorAll('#entries article.entry:not([hidden])'))"
        ".map(a => a.querySelector('.meta').textContent)")
    assert len(failed_entries) < total
    assert {m.rsplit(" · ", 1)[1] for m in failed_entries} == failed_prompts
    Select(browser.find_element(By.ID, "f-kind")).select_by_index(0)

    # The text search finds the one entry holding the marker.
    search = browser.find_element(By.ID, "f-text")
    search.send_keys(MARKER.upper())
    assert _shown(browser) == 1
    [entry] = [e for e in browser.find_elements(By.CSS_SELECTOR, "article.entry")
               if e.is_displayed()]
    assert "sci-1" in entry.text and MARKER in entry.text
    search.clear()
    search.send_keys("no entry holds this text 12345")
    assert _shown(browser) == 0
    assert browser.execute_script("return window.__pwned === undefined")
    assert [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")] == []


def test_browser_says_how_many_prompts_it_shows(browser, report_page) -> None:
    """All 6 prompts fit the default cap; with `report.browser_prompts=2` the page shows 2 of
    6: the prompt with the failed judgement first, then one drawn with the seed."""
    from selenium.webdriver.common.by import By

    run, page = report_page
    browser.get(page.as_uri())
    showing = browser.find_element(By.ID, "browser-showing").text
    assert showing == f"Showing {len(PROMPTS)} of {len(PROMPTS)} prompts."

    failed = {r["prompt_id"] for r in read_records(run / "scores.jsonl") if not r["parse_ok"]}
    run_wim(["report", str(run), "--set", "report.browser_prompts=2"])
    browser.get(page.as_uri())
    showing = browser.find_element(By.ID, "browser-showing").text
    assert showing.startswith(f"Showing 2 of {len(PROMPTS)} prompts: every prompt with a failed")
    metas = browser.execute_script(
        "return Array.from(document.querySelectorAll('#entries article.entry'))"
        ".map(a => a.querySelector('.meta').textContent)")
    shown = {m.rsplit(" · ", 1)[1] for m in metas}
    assert len(shown) == 2 and (failed <= shown if len(failed) <= 2 else shown <= failed)
    assert [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")] == []
