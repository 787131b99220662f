"""Quiet logs, through the real CLI: an HTTP stage writes no line per request, and `--verbose`
(before or after the command) brings them back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import QUICKSTART, http_overrides, run_wim, sets

PROMPTS = [{"id": f"p{i}", "domain": "x", "prompt": f"Question number {i}?"} for i in range(6)]


@pytest.mark.parametrize("verbose", [[], ["--verbose"]])
def test_one_line_per_request_only_with_verbose(flaky_server, tmp_path: Path, verbose) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    cmd = ["generate", str(QUICKSTART), "--out", str(tmp_path / "run"), "--no-progress",
           *verbose, *sets([*http_overrides(flaky_server.url), f"prompts.source={prompts}"])]
    err = run_wim(cmd).stderr
    sent = sum(flaky_server.counts.values())
    assert sent >= len(PROMPTS)
    per_request = [line for line in err.splitlines()
                   if "POST " in line or "HTTP Request" in line]
    assert len(per_request) == (sent if verbose else 0), err[-2000:]
