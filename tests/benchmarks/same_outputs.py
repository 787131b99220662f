"""Issue 42's acceptance: the same run, before and after, writes byte-identical outputs.

    python tests/benchmarks/same_outputs.py --tree A --tree B [--runs quickstart,sourced,rounds]
        [--sourced-prompts 2000] [--out /tmp/same] [--quick] [--python PY] [--write FILE]

A tree is a git checkout (e.g. `git worktree add /tmp/before COMMIT`, and /work/main); each runs
its own `wim` (`PY -m wim`, cwd the tree, PYTHONPATH the tree) on its own configs/. Run kinds:
  quickstart  `wim run configs/quickstart.yaml` (--quick: `--skip-train` and conftest's SHRUNK);
  sourced     configs/ultrafeedback_source.yaml on an UltraFeedback-shaped parquet of N prompts
              x 4 completions, judged over HTTP by tests/benchmarks/standin_server.js, as
              bench_scale.py runs it (`--skip-train`); one parquet and one server for both trees;
  rounds      the quickstart with test_rounds.py's ROUNDS (two shrunk rounds) and a changing
              judge: rounds/1, rounds/2 and any top-level files are compared.
Each kind runs in turn, A then B, so both see the same machine. samples, judgements, scores and
pairs (.jsonl) are compared by sha256; the exit code is 1 if any differs or a run fails. The same
tree twice checks that a run is deterministic at all. Every run writes into the same folder,
OUT/run/KIND, then moves to OUT/TREE-NAME/KIND: paths a run records (round 2's judge is round
1's adapter, by its absolute path) are then the same for both trees. The sourced files record
the parquet's path (OUT/source_N.parquet): compare them within one call, not across OUTs.
--quick took 3 (quickstart, sourced) to 20 minutes (with rounds) on 2 busy cores; a full call,
the quickstart ~10 minutes a tree, about 35-50. Not a test: the file name keeps pytest from
collecting it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # bench_scale, conftest and test_rounds

from bench_scale import K, Standin, run_overrides, write_source  # noqa: E402
from conftest import SHRUNK, sets  # noqa: E402
from test_rounds import ROUNDS  # noqa: E402

FILES = ("samples.jsonl", "judgements.jsonl", "scores.jsonl", "pairs.jsonl")
KINDS = ("quickstart", "sourced", "rounds")
QUICKSTART = "configs/quickstart.yaml"
SOURCED = "configs/ultrafeedback_source.yaml"


def wim_args(kind: str, out: Path, quick: bool, source: Path | None, url: str | None,
             fast_embedder: bool) -> list[str]:
    """The `wim` command line of one run kind, its output folder `out`."""
    if kind == "quickstart":
        shrink = ["--skip-train", *sets(SHRUNK)] if quick else []
        return ["run", QUICKSTART, "--out", str(out), *shrink]
    if kind == "sourced":
        return ["run", SOURCED, "--out", str(out), "--skip-train",
                *run_overrides(source, url, url, fast_embedder, concurrency=32)]
    return ["run", QUICKSTART, "--out", str(out), *sets([*ROUNDS, "judge.role=changing"])]


def run_tree(tree: Path, python: str, args: list[str], log: Path) -> tuple[int, float]:
    """`python -m wim ARGS --no-progress` of `tree`, its log lines to `log`: exit code, seconds."""
    env = {**os.environ, "PYTHONPATH": str(tree), "TOKENIZERS_PARALLELISM": "false"}
    start = time.perf_counter()
    with log.open("w") as out:
        code = subprocess.run([python, "-m", "wim", *args, "--no-progress"], cwd=tree, env=env,
                              stdout=out, stderr=subprocess.STDOUT).returncode
    return code, time.perf_counter() - start


def compared(kind: str, run_a: Path, run_b: Path) -> list[str]:
    """The files to compare, relative to a run folder: a rounds run's top-level files only
    where either tree wrote them."""
    if kind != "rounds":
        return list(FILES)
    top = [f for f in FILES if (run_a / f).exists() or (run_b / f).exists()]
    return top + [f"rounds/{r}/{f}" for r in (1, 2) for f in FILES]


def digest(path: Path) -> tuple[str, int] | None:
    """sha256 (first 12 hex) and line count of a file, None if it is not there."""
    if not path.is_file():
        return None
    data = path.read_bytes()
    return hashlib.sha256(data).hexdigest()[:12], data.count(b"\n")


def table(rows: list[tuple[str, str, tuple | None, tuple | None]]) -> tuple[list[str], bool]:
    """The comparison table's lines, and whether every file is there and the same."""
    lines = [f"{'kind':<11}{'file':<27}{'A sha256':<14}{'B sha256':<14}"
             f"{'lines A':>8}{'lines B':>8}  result"]
    all_same = True
    for kind, name, a, b in rows:
        same = a is not None and a == b
        all_same &= same
        cells = [x[0] if x else "missing" for x in (a, b)]
        counts = [str(x[1]) if x else "-" for x in (a, b)]
        lines.append(f"{kind:<11}{name:<27}{cells[0]:<14}{cells[1]:<14}{counts[0]:>8}"
                     f"{counts[1]:>8}  {'same' if same else 'DIFFERENT'}")
    return lines, all_same


def commit(tree: Path) -> str:
    head = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    changed = subprocess.run(["git", "-C", str(tree), "status", "--porcelain"],
                             capture_output=True, text=True, check=True).stdout.splitlines()
    return f"{head} " + (f"dirty ({len(changed)} paths changed or untracked)" if changed
                         else "clean")


def machine(python: str) -> list[str]:
    """The CPU (its bfloat16 and AMX flags decide what `policy.dtype: auto` computes in) and the
    libraries' versions."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines()
                  if line.startswith("model name")), "unknown")
    flags = next((set(line.split(":", 1)[1].split()) for line in info.splitlines()
                  if line.startswith("flags")), set())
    amx = sorted(f for f in flags if f.startswith("amx"))
    versions = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print(', '.join(f'{p} ' + m.version(p) "
                       "for p in ('torch', 'transformers', 'trl', 'peft')))"],
        capture_output=True, text=True).stdout.strip()
    load = os.getloadavg()[0]
    return [f"CPU: {model}, {os.cpu_count()} CPUs, avx512_bf16 "
            f"{'yes' if 'avx512_bf16' in flags else 'no'}, amx {', '.join(amx) or 'no'}; "
            f"load average {load:.2f} at the start",
            f"Python: {python} ({versions})"]


def tree_names(trees: list[Path]) -> list[str]:
    """Folder names under OUT: the trees' own names, told apart when they are the same."""
    names = [t.name for t in trees]
    return [names[0], names[1] if names[1] != names[0] else names[1] + "-2"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", action="append", type=Path, required=True,
                        help="a git checkout; give two, A then B")
    parser.add_argument("--runs", default=",".join(KINDS), help="comma-separated run kinds")
    parser.add_argument("--sourced-prompts", type=int, default=None,
                        help="prompts of the sourced run's parquet (2000; --quick 50)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/same"),
                        help="runs go to OUT/TREE-NAME/KIND, their logs to OUT/TREE-NAME")
    parser.add_argument("--quick", action="store_true",
                        help="a shrunk quickstart without training, 50 sourced prompts")
    parser.add_argument("--fast-embedder", action="store_true",
                        help="sourced: the stand-in's hashing vectors instead of MiniLM")
    parser.add_argument("--python", default=sys.executable, help="the interpreter of wim")
    parser.add_argument("--write", type=Path, default=None, help="also write the output here")
    args = parser.parse_args()
    if len(args.tree) != 2:
        parser.error("give --tree twice: A, then B")
    kinds = args.runs.split(",")
    if unknown := set(kinds) - set(KINDS):
        parser.error(f"unknown run kinds {sorted(unknown)}; known: {', '.join(KINDS)}")
    trees = [t.resolve() for t in args.tree]
    names = tree_names(trees)
    prompts = args.sourced_prompts or (50 if args.quick else 2000)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)

    report = [f"same_outputs.py{' --quick' if args.quick else ''} --runs {','.join(kinds)}"
              + (f" --sourced-prompts {prompts} (x {K} completions)" if "sourced" in kinds
                 else "")
              + f", {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"]
    report += [f"{label}: {tree} ({name}) at {commit(tree)}"
               for label, tree, name in zip("AB", trees, names, strict=True)]
    report += machine(args.python)
    if trees[0] == trees[1]:
        report.append("One tree twice: this checks that each run is deterministic.")
    print("\n".join(report), flush=True)

    server = source = None
    if "sourced" in kinds:
        source = out / f"source_{prompts}.parquet"
        write_source(source, prompts)  # once: both trees read the same bytes
        server = Standin()
    rows, times = [], []
    try:
        for kind in kinds:
            cmd = wim_args(kind, out / "run" / kind, args.quick, source,
                           server and server.url, args.fast_embedder)
            runs = [run_kind(tree, name, label, kind, cmd, out, args.python, times)
                    for label, tree, name in zip("AB", trees, names, strict=True)]
            rows += [(kind, f, digest(runs[0] / f), digest(runs[1] / f))
                     for f in compared(kind, *runs)]
    finally:
        if server is not None:
            server.close()
    lines, all_same = table(rows)
    failed = any("FAILED" in t for t in times)
    tail = ["", "Run times (whole `wim run`, this machine):", *times, "", *lines, "",
            "All files byte-identical." if all_same else "Some files DIFFER or are missing."]
    print("\n".join(tail))
    if args.write:
        args.write.write_text("\n".join(report + tail) + "\n")
        print(f"written to {args.write}")
    return 0 if all_same and not failed else 1


def run_kind(tree: Path, name: str, label: str, kind: str, cmd: list[str], out: Path,
             python: str, times: list[str]) -> Path:
    """One tree's run of one kind in OUT/run/KIND, moved to OUT/NAME/KIND; its time and status
    appended to `times` (and printed to stderr at once)."""
    work, final = out / "run" / kind, out / name / kind
    for folder in (work, final):
        shutil.rmtree(folder, ignore_errors=True)
    final.parent.mkdir(parents=True, exist_ok=True)
    code, seconds = run_tree(tree, python, cmd, final.parent / f"{kind}.log")
    if work.exists():
        work.rename(final)
    status = "ok" if code == 0 else f"FAILED (exit {code}, see {name}/{kind}.log)"
    times.append(f"{kind:<11}{label} {seconds:>7.1f} s  {status}")
    print(times[-1], file=sys.stderr, flush=True)  # progress; the summary repeats it
    return final

if __name__ == "__main__":
    sys.exit(main())
