"""Install-time smoke check: one llama.cpp completion on the bundled GGUF, in a subprocess.

A llama-cpp-python build tuned for another CPU dies with SIGSEGV/SIGILL inside its kernels. Run in
a child process, such a crash fails the install with a message that says what to do, instead of
killing a later test run halfway through.
"""

from __future__ import annotations

import signal
import subprocess
import sys

CHILD = """
from llama_cpp import Llama
from wim.models import bundled_gguf_path
llm = Llama(model_path=str(bundled_gguf_path()), n_ctx=512, verbose=False)
out = llm.create_completion("Hello", max_tokens=8, temperature=0.0)
print(repr(out["choices"][0]["text"]))
"""


def smoke_check(child: str = CHILD) -> int:
    """0 when `child` (Python code) runs cleanly in a subprocess; else 1, with a message."""
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                          timeout=300)
    if proc.returncode == 0:
        print(f"    llama.cpp smoke completion ok: {proc.stdout.strip()}")
        return 0
    how = f"exit code {proc.returncode}"
    if proc.returncode < 0:
        how = f"signal {signal.Signals(-proc.returncode).name}"
    print(f"llama.cpp smoke check failed ({how}): one completion on the bundled model crashed.\n"
          "The llama-cpp-python build does not run on this CPU. Rebuild it portably:\n"
          "  rm -f .venv/.installed-llama && pip cache remove 'llama_cpp_python*'\n"
          "  make install-dev\n"
          f"--- child stderr (tail) ---\n{proc.stderr[-3000:]}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(smoke_check())
