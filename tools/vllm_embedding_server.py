"""Start vLLM's CPU build (`.venv-vllm`) as an embeddings server: `--runner pooling` on a
sentence-transformers folder, `POST /v1/embeddings`. Used by the slow test of `scoring.backend:
http` (tests/test_score_vllm.py) and the embedding benchmark (tests/benchmarks/bench_embed.py);
waiting and stopping are tools/vllm_server.py's.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from vllm_server import DEFAULT_PYTHON, free_port, stop, wait_ready

__all__ = ["DEFAULT_PYTHON", "SERVED_NAME", "command", "free_port", "start", "stop",
           "wait_ready"]

SERVED_NAME = "minilm"


def command(python: Path, model_dir: str, port: int, name: str = SERVED_NAME) -> list[str]:
    # --max-model-len 256: sentence-transformers' MiniLM reads at most 256 tokens of a text.
    # --dtype float32: left to itself the CPU build loads MiniLM in float16.
    return [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
            "--served-model-name", name, "--runner", "pooling", "--dtype", "float32",
            "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "256",
            "--gpu-memory-utilization", "0.15", "--disable-log-stats"]


def start(model_dir: str, port: int, log_path: Path, python: Path = DEFAULT_PYTHON,
          name: str = SERVED_NAME) -> subprocess.Popen:
    """The server as a child process (a session of its own), its output in `log_path`."""
    env = {**os.environ, "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
           "PYTHONPATH": ""}  # our checkout must not shadow the server's packages
    with open(log_path, "wb") as log:
        return subprocess.Popen(command(python, model_dir, port, name), stdout=log,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
