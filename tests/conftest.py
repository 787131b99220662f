"""Shared fixtures: a shrunk quickstart config on the real bundled models."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from recording_server import JSONServer, chat_completion

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"

# A datasets cache of the suite's own, new for each test process and the processes it starts:
# what another run loaded into the machine's cache (~/.cache/huggingface/datasets) must not
# decide a test (a stale cached export once passed for this run's).
if "WIM_TEST_DATASETS_CACHE" not in os.environ:
    os.environ["WIM_TEST_DATASETS_CACHE"] = tempfile.mkdtemp(prefix="wim-test-datasets-")
    atexit.register(shutil.rmtree, os.environ["WIM_TEST_DATASETS_CACHE"], True)
os.environ["HF_DATASETS_CACHE"] = os.environ["WIM_TEST_DATASETS_CACHE"]

# `make test` runs two pytest-xdist workers on two cores: one thread each for torch, in the
# worker and in the processes it starts, so that the two do not oversubscribe the cores.
ONE_THREAD_EACH = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1
if ONE_THREAD_EACH:
    os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session", autouse=True)
def _one_thread_per_worker() -> None:
    if ONE_THREAD_EACH:
        import torch

        torch.set_num_threads(1)

# 4 prompts, 2 samples, 16 new tokens, 2 DPO steps: every stage for real, in about a minute.
SHRUNK = [
    "prompts.holdout=0",  # the quickstart holds out 16 prompts; shrunk runs evaluate nothing
    "prompts.limit=4",
    "generation.max_new_tokens=16",
    "generation.batch_size=2",
    "judge.max_new_tokens=24",
    "judge.max_retries=1",
    "dpo.max_steps=2",
    "dpo.per_device_train_batch_size=2",
    "dpo.max_length=128",
]


# Fixtures that load a real model or start a server: every test using one is marked `slow` here,
# so the marking cannot drift. Tests that load a model inline carry the mark themselves.
REAL_MODEL_FIXTURES = {"embedder", "bundled", "backend", "server_url", "finished_run",
                       "reference_run", "trained_adapter", "vllm_server"}


# Session fixtures that start a server or make a run: under `pytest -n 2 --dist loadgroup`
# (make test) the tests using one go to the same worker, so each is made once per test run.
# The vLLM pooling server of test_score_vllm.py joins the vLLM group: one vLLM at a time
# (so does test_judge_batch.py's `vllm run_batch` test, by its own xdist_group mark).
SHARED_FIXTURE_GROUPS = {"vllm_server": "vllm", "server_url": "llama_server",
                         "finished_run": "finished_run", "trained_adapter": "trained_adapter"}
FILE_GROUPS = {"test_score_vllm.py": "vllm"}


@pytest.hookimpl(tryfirst=True)  # before xdist reads the xdist_group marks
def pytest_collection_modifyitems(items) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if REAL_MODEL_FIXTURES & fixtures:
            item.add_marker(pytest.mark.slow)
        # One group per test (xdist joins several marks into a new group name): the first in
        # SHARED_FIXTURE_GROUPS' order, vLLM first, so no test starts a second vLLM server.
        groups = [g for f, g in SHARED_FIXTURE_GROUPS.items() if f in fixtures]
        groups = [FILE_GROUPS[item.path.name]] if item.path.name in FILE_GROUPS else groups
        if groups:
            item.add_marker(pytest.mark.xdist_group(groups[0]))


def sets(overrides: list[str]) -> list[str]:
    out = []
    for item in overrides:
        out += ["--set", item]
    return out


def run_wim(args: list[str], check: bool = True, *, subprocess_: bool = False
            ) -> subprocess.CompletedProcess:
    """Run the real CLI, `wim.cli.main` (what `wim` and `python -m wim` call), on `args`, and
    return its exit code, stdout and stderr (log lines included) as a CompletedProcess.

    In this process by default: a subprocess pays the interpreter and the imports of torch,
    transformers and TRL again, about 10 s a call (tests/benchmarks/results/test_durations_*).
    `subprocess_=True` runs `python -m wim` instead, for a test of the process itself."""
    if subprocess_:
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
        proc = subprocess.run([sys.executable, "-m", "wim", *map(str, args)],
                              capture_output=True, text=True, env=env, cwd=ROOT)
    else:
        proc = _run_wim_here([str(a) for a in args])
    if check and proc.returncode != 0:
        raise AssertionError(f"wim {' '.join(map(str, args))} failed:\n{proc.stderr[-4000:]}")
    return proc


def _run_wim_here(args: list[str]) -> subprocess.CompletedProcess:
    """`wim.cli.main(args)` with what a subprocess would give: cwd ROOT, stdout and stderr
    captured (the log lines the CLI's basicConfig would print, at INFO), an exception's
    traceback on stderr with exit code 1, argparse's exit code."""
    import contextlib
    import io
    import logging
    import traceback

    from wim.cli import main

    out, err = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(err)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    level, cwd = root.level, os.getcwd()
    tokenizers = os.environ.get("TOKENIZERS_PARALLELISM")
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.chdir(ROOT)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(args)
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else (exit_.code is not None)
            except Exception:  # noqa: BLE001 - as a process would: the traceback, exit 1
                traceback.print_exc()
                code = 1
    finally:
        os.chdir(cwd)
        root.removeHandler(handler)
        root.setLevel(level)
        if tokenizers is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = tokenizers
    return subprocess.CompletedProcess(["wim", *args], int(code), out.getvalue(), err.getvalue())


@pytest.fixture(scope="session")
def quickstart() -> Path:
    return QUICKSTART


def finished_run_command(out: Path) -> list[str]:
    """`wim run` of the shrunk quickstart, every stage, into `out`."""
    return ["run", str(QUICKSTART), "--out", str(out), "--no-progress", *sets(SHRUNK)]


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory) -> Path:
    """One finished shrunk quickstart run for the whole test run (every stage, through the real
    CLI in a subprocess). Read it in place; a test that writes copies it first."""
    out = tmp_path_factory.mktemp("finished") / "run"
    run_wim(finished_run_command(out))
    return out


def tools_launcher():
    """tools/vllm_server.py: free_port, wait_ready (any OpenAI-compatible server), start, stop."""
    if str(ROOT / "tools") not in sys.path:
        sys.path.insert(0, str(ROOT / "tools"))
    import vllm_server

    return vllm_server


def free_port() -> int:
    return tools_launcher().free_port()


def served_models(base_url: str) -> list[str]:
    """The model names a server lists (`GET /v1/models`): base model and adapters."""
    with urllib.request.urlopen(base_url.rstrip("/") + "/models", timeout=30) as reply:
        return [m["id"] for m in json.loads(reply.read())["data"]]


@pytest.fixture(scope="session")
def server_url(tmp_path_factory):
    """A real OpenAI-compatible server (llama-cpp-python) on 127.0.0.1 with the bundled GGUF."""
    pytest.importorskip("llama_cpp", reason="needs the llama extra: pip install 'wim[llama]'")
    from wim.models import bundled_gguf_path

    launcher = tools_launcher()
    port = launcher.free_port()
    log_path = tmp_path_factory.mktemp("llama_server") / "server.log"
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(bundled_gguf_path()),
           "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "2048", "--verbose", "False"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        try:
            launcher.wait_ready(url, proc, log_path, timeout_s=90, name="llama_cpp.server",
                                poll_s=0.25)
        except RuntimeError as exc:
            pytest.fail(str(exc))
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def need_vllm_venv(python: Path) -> None:
    """Skip the test when the vLLM venv (`python`, its interpreter) is missing; under
    WIM_REQUIRE_VLLM=1 (CI) fail it instead, so a run without vLLM cannot pass as complete."""
    if not python.exists():
        message = f"needs the vLLM venv {python.parents[1]}: make install-vllm"
        if os.environ.get("WIM_REQUIRE_VLLM") == "1":
            pytest.fail(message)
        pytest.skip(message)


@dataclass(frozen=True)
class VLLMServer:
    url: str
    """The OpenAI-compatible base URL (…/v1)."""
    name: str
    """The served name of the base model."""
    model_dir: str
    """The folder it serves (the bundled model's transformers folder)."""
    log: Path


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory):
    """A real vLLM server (the CPU build in .venv-vllm, `make install-vllm`) on the bundled
    model's folder, with runtime LoRA loading on; one for the whole session (60-100 s to start).
    Skipped when .venv-vllm is missing, unless WIM_REQUIRE_VLLM=1 (CI), where that fails.
    WIM_VLLM_URL: use a server already running there instead (started as tools/vllm_server.py
    starts it, on this machine), e.g. while working on these tests."""
    from wim.models import resolve_causal_lm

    launcher = tools_launcher()

    if os.environ.get("WIM_VLLM_URL"):
        yield VLLMServer(os.environ["WIM_VLLM_URL"].rstrip("/"), launcher.SERVED_NAME,
                         resolve_causal_lm("bundled:smollm2-135m-instruct"), Path(os.devnull))
        return
    need_vllm_venv(launcher.DEFAULT_PYTHON)
    port = launcher.free_port()
    log = tmp_path_factory.mktemp("vllm_server") / "server.log"
    model_dir = resolve_causal_lm("bundled:smollm2-135m-instruct")
    proc = launcher.start(launcher.DEFAULT_PYTHON, model_dir, port, log)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        try:
            launcher.wait_ready(url, proc, log)
        except RuntimeError as exc:
            pytest.fail(str(exc))
        yield VLLMServer(url, launcher.SERVED_NAME, model_dir, log)
    finally:
        launcher.stop(proc)


class FlakyServer(JSONServer):
    """A small OpenAI-compatible chat server on 127.0.0.1 that can be down for a while.

    Not a model: it answers a policy request with a fixed response and a judge request (one with
    a system message) with a well-formed verdict, or with text that does not parse when the
    request holds UNPARSEABLE. `generate_up` / `judge_up` are how many more requests of each kind
    it answers before it returns 503 for them (None: always up).
    """

    def __init__(self) -> None:
        self.generate_up: int | None = None
        self.judge_up: int | None = None
        # Not `requests`: JSONServer keeps each request's (path, Authorization) there.
        self.counts = {"generate": 0, "judge": 0, "503": 0}
        self.longest = 0  # characters of the longest request seen
        super().__init__()

    def respond(self, path: str, body: dict) -> tuple[int, dict]:
        status, text = self.answer(body["messages"])
        return status, chat_completion(text, 10, 5) if status == 200 else {"error": "down"}

    def answer(self, messages: list[dict]) -> tuple[int, str]:
        kind = "judge" if any(m["role"] == "system" for m in messages) else "generate"
        with self.lock:
            self.counts[kind] += 1
            self.longest = max(self.longest, sum(len(m["content"]) for m in messages))
            budget = getattr(self, f"{kind}_up")
            if budget is not None:
                if budget <= 0:
                    self.counts["503"] += 1
                    return 503, ""
                setattr(self, f"{kind}_up", budget - 1)
        if kind == "generate":
            return 200, "A short answer."
        if any("UNPARSEABLE" in m["content"] for m in messages):
            return 200, "I would rather not say."
        return 200, "Missing: nothing\nRating: 7"


@pytest.fixture
def flaky_server():
    server = FlakyServer()
    try:
        yield server
    finally:
        server.close()


def http_overrides(url: str) -> list[str]:
    """Policy and judge both over HTTP, requests failing fast; numeric judging, so that no
    embedder (no local model at all) is needed."""
    return ["prompts.holdout=0", "policy.backend=http", "judge.role=external",
            "judge.backend=http", f"http.base_urls=[{url}]", "http.model=flaky",
            "http.max_retries=0", "http.concurrency=2", "http.timeout_s=10",
            "generation.batch_size=2", "judge.max_retries=1", "judge.mode=numeric",
            "scoring.zeta=0"]


def check_two_step_judgement(raw: str, critique: str | None, rating: int | None,
                             parse_ok: bool) -> None:
    """A judgement of the two prefilled steps ("Missing:" + the model's critique, then
    "\nRating:" + the model's rating): the model wrote both parts, and what was parsed is what
    it wrote there (the prefills are the code's own text, so they prove nothing)."""
    import re

    written, _, rated = raw.removeprefix("Missing:").partition("\nRating:")
    assert written.strip() and rated.strip(), raw  # the model's parts, not only the prefills
    if not parse_ok:
        return
    if critique:  # "" when the model wrote a nothing-missing form ("None.")
        assert critique == " ".join(written.split()), raw
    number = re.match(r"\s*(\d+)", rated)
    assert number is not None and rating == int(number[1]), raw


# Pairs whose chosen side is clearly better: a correct, complete answer against garbage.
GOOD_VS_GARBAGE = [
    ("How many legs does a spider have?", "A spider has eight legs.", "zq xv blorp 7 ## kk"),
    ("What is the capital of Italy?", "The capital of Italy is Rome.", "fnord ;; 99 qqq wub"),
    ("What colour is the sky on a clear day?", "On a clear day the sky is blue.",
     "ppp ~~ 3x zzt orb"),
    ("How many days are in a week?", "A week has seven days.", "lorp %% 12 vvk ugh"),
    ("What do bees make?", "Bees make honey from the nectar of flowers.", "kq9 ## blat zz mn"),
    ("What is 3 + 4?", "3 + 4 = 7.", "wibble 88 ?? trr xo"),
    ("Which planet do we live on?", "We live on the planet Earth.", "qop $$ 41 zzk fen"),
    ("What is frozen water called?", "Frozen water is called ice.", "snarf 0 ^^ plk yy"),
]
HELD_OUT = [
    ("How many wheels does a bicycle have?", "A bicycle has two wheels.", "gorp ** 5 zxq lm"),
    ("What is the capital of Spain?", "The capital of Spain is Madrid.", "vvt ## 17 qup ow"),
    ("What do cows drink?", "Cows drink water.", "blim ;; 2k rrz ef"),
]


def write_pair_rows(path: Path, pairs, swap: bool = False) -> None:
    import json

    with path.open("w") as f:
        for prompt, good, bad in pairs:
            chosen, rejected = (bad, good) if swap else (good, bad)
            f.write(json.dumps({"prompt": [{"role": "user", "content": prompt}],
                                "chosen": [{"role": "assistant", "content": chosen}],
                                "rejected": [{"role": "assistant", "content": rejected}]}) + "\n")


def train_small_adapter(out: Path, swap: bool = False) -> Path:
    """A real DPO run on the bundled model (6 steps, high learning rate): `out/adapter`."""
    from training.train import train_dpo_model
    from wim.config import load_config

    cfg = load_config(QUICKSTART, ["dpo.learning_rate=5e-3", "dpo.max_steps=6",
                                   "dpo.per_device_train_batch_size=4", "dpo.max_length=64",
                                   "dpo.beta=0.1"])
    write_pair_rows(out / "pairs.jsonl", GOOD_VS_GARBAGE, swap=swap)
    train_dpo_model(cfg, out / "pairs.jsonl", out / "train", progress=False)
    return out / "train" / "adapter"


@pytest.fixture(scope="session")
def trained_adapter(tmp_path_factory) -> Path:
    return train_small_adapter(tmp_path_factory.mktemp("adapter"))
