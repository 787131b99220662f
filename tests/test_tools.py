"""The install-time llama.cpp smoke check turns a native crash into a clear install failure;
the server launcher's wait (tools/vllm_server.py, also the tests' llama-cpp-python fixture) and
its `run`, which leaves no child process behind when it times out."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import free_port, tools_launcher

ROOT = Path(__file__).resolve().parents[1]


def _load_check():
    spec = importlib.util.spec_from_file_location("check_llama_cpp",
                                                  ROOT / "tools" / "check_llama_cpp.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_crash_in_the_child_fails_with_the_signal_and_what_to_do(capsys) -> None:
    check = _load_check()
    # A real SIGSEGV in the child process, as a miscompiled kernel would raise.
    assert check.smoke_check("import ctypes; ctypes.string_at(0)") == 1
    err = capsys.readouterr().err
    assert "signal SIGSEGV" in err
    assert "make install-dev" in err


def test_a_clean_child_passes(capsys) -> None:
    check = _load_check()
    assert check.smoke_check("print('ok')") == 0
    assert "'ok'" not in capsys.readouterr().err


def test_wait_ready_returns_once_models_answers(tmp_path: Path) -> None:
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "models").write_text("{}")
    port, log = free_port(), tmp_path / "log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind",
                                 "127.0.0.1", "--directory", str(tmp_path)], stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        tools_launcher().wait_ready(f"http://127.0.0.1:{port}/v1", proc, log, timeout_s=30,
                               poll_s=0.1)
    finally:
        proc.terminate()
        proc.wait()


def test_wait_ready_names_a_server_that_exited_and_shows_its_log(tmp_path: Path) -> None:
    log = tmp_path / "log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", "print('no model here'); exit(3)"],
                                stdout=out, stderr=subprocess.STDOUT)
    proc.wait()
    with pytest.raises(RuntimeError, match=r"(?s)llama_cpp.server exited with 3:.*no model here"):
        tools_launcher().wait_ready(f"http://127.0.0.1:{free_port()}/v1", proc, log, timeout_s=5,
                               name="llama_cpp.server", poll_s=0.1)


def _alive(pid: int) -> bool:
    """A process that has not ended (a zombie has ended, only not been reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_run_that_times_out_leaves_no_child_behind(tmp_path: Path) -> None:
    """As `vllm run_batch` does, the command starts a child of its own (vLLM's engine) and the
    child outlives it unless its whole process group is killed."""
    child_pid = tmp_path / "child.pid"
    script = ("import subprocess, sys, time\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
              f"open({str(child_pid)!r}, 'w').write(str(child.pid))\n"
              "time.sleep(600)\n")
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        tools_launcher().run([sys.executable, "-c", script], tmp_path / "log", timeout_s=5)
    assert time.monotonic() - start < 30
    pid = int(child_pid.read_text())
    deadline = time.monotonic() + 5  # SIGKILL is asynchronous
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid), f"the command's child {pid} is still running"


def test_test_cost_sums_a_real_junit_file_and_holds_the_budget(tmp_path: Path) -> None:
    """tools/test_cost.py on the JUnit file of a real pytest run: the slow test is listed first,
    its file's total is there, and a budget under the suite's wall time fails the check."""
    (tmp_path / "test_two.py").write_text(
        "import time\n\ndef test_slow():\n    time.sleep(0.6)\n\ndef test_quick():\n    pass\n")
    junit = tmp_path / "results.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    f"--junitxml={junit}", str(tmp_path / "test_two.py")],
                   cwd=tmp_path, check=True, capture_output=True)
    tool = [sys.executable, str(ROOT / "tools" / "test_cost.py"), str(junit)]
    ok = subprocess.run([*tool, "--budget-s", "600", "--write", str(tmp_path / "cost.txt")],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout == (tmp_path / "cost.txt").read_text()
    slowest = ok.stdout.split("slowest tests")[1].splitlines()[1:3]
    assert "test_slow" in slowest[0] and "test_quick" in slowest[1], ok.stdout
    assert float(slowest[0].split()[0]) >= 0.6
    assert "tests: 2 " in ok.stdout
    over = subprocess.run([*tool, "--budget-s", "0.3"], capture_output=True, text=True)
    assert over.returncode == 1 and "over its budget of 0.3 s" in over.stderr, over.stderr


def test_xdist_groups_send_a_group_to_one_worker(tmp_path: Path) -> None:
    """make test relies on `--dist loadgroup` (one vLLM server, one shared run): the tests of
    a group run in one worker. pytest 9.2 with pytest-xdist 3.8 silently stopped grouping."""
    (tmp_path / "test_groups.py").write_text(
        "import os\nimport pytest\n\n" + "".join(
            f"@pytest.mark.xdist_group('g')\ndef test_g{i}():\n"
            f"    open('{tmp_path}/g{i}', 'w').write(os.environ['PYTEST_XDIST_WORKER'])\n\n"
            for i in range(4)) + "def test_other():\n    pass\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-n", "2", "--dist", "loadgroup", str(tmp_path / "test_groups.py")],
                          cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:]
    workers = {(tmp_path / f"g{i}").read_text() for i in range(4)}
    assert len(workers) == 1, workers
