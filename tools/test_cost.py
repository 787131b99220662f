"""What the test suite costs, read from the JUnit file that `make test` writes, and a budget.

Usage: python tools/test_cost.py test-results.xml [--budget-s S] [--top N] [--write FILE]

Prints the suite's wall time, the sum of the tests' own times (setup, call and teardown; a
module's shared fixture counts in its first test), totals by file and the N slowest tests.
With --budget-s it exits 1 when the suite's wall time is over S seconds, so a slow new test is
seen in the change that adds it (the budget and how it was chosen: docs/benchmarks.md, "The
test suite's cost"). --write also saves the printout, e.g. in tests/benchmarks/results/.
"""

from __future__ import annotations

import argparse
import os
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_file(classname: str) -> str:
    """tests.wim.test_x.TestY -> tests/wim/test_x.py: the longest dotted prefix that is a file."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        path = Path(*parts[:end]).with_suffix(".py")
        if (ROOT / path).exists():
            return path.as_posix()
    return classname


def read(junit: Path) -> tuple[float, list[tuple[float, str, str]]]:
    """(the suite's wall time, [(seconds, file, test name)]) from a pytest JUnit XML file."""
    root = ET.parse(junit).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    wall = sum(float(s.get("time", 0)) for s in suites)
    cases = [(float(c.get("time", 0)), test_file(c.get("classname", "")), c.get("name", ""))
             for s in suites for c in s.iter("testcase")]
    return wall, cases


def summary(wall: float, cases: list[tuple[float, str, str]], top: int) -> str:
    by_file: dict[str, list[float]] = defaultdict(list)
    for secs, path, _ in cases:
        by_file[path].append(secs)
    total = sum(secs for secs, _, _ in cases)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    lines = [f"tests: {len(cases)}   suite wall time: {wall:.0f} s   sum of test times: "
             f"{total:.0f} s   load average at the end: {load}",
             "", "totals by file (s, tests, file):"]
    for path, times in sorted(by_file.items(), key=lambda kv: -sum(kv[1])):
        lines.append(f"{sum(times):8.1f} {len(times):4d}  {path}")
    lines += ["", f"the {top} slowest tests (s, file::test):"]
    for secs, path, name in sorted(cases, reverse=True)[:top]:
        lines.append(f"{secs:8.1f}  {path}::{name}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit", type=Path)
    parser.add_argument("--budget-s", type=float, help="fail when the suite's wall time is over")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--write", type=Path, help="also write the summary to this file")
    args = parser.parse_args(argv)
    if not args.junit.exists():
        print(f"test_cost: {args.junit} not found: run `make test` first", file=sys.stderr)
        return 2
    wall, cases = read(args.junit)
    text = summary(wall, cases, args.top)
    print(text, end="")
    if args.write:
        args.write.write_text(text)
    if args.budget_s is not None and wall > args.budget_s:
        print(f"test_cost: the suite took {wall:.0f} s, over its budget of {args.budget_s:g} s. "
              "Find the new slow tests in the list above and make them cheaper (or raise the "
              "budget in the Makefile, TEST_BUDGET_S, with the reason in docs/benchmarks.md).",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
