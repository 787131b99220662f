"""The install-time llama.cpp smoke check turns a native crash into a clear install failure."""

from __future__ import annotations

import importlib.util
from pathlib import Path

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
