"""Model resolution: bundled names, and a conversion cache that two processes can share."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from wim.models import (
    BUNDLED_EMBEDDER,
    ModelNotFoundError,
    bundled_gguf_path,
    resolve_causal_lm,
    resolve_embedder,
)


def test_bundled_files_exist() -> None:
    assert bundled_gguf_path().is_file()
    assert (Path(resolve_embedder(BUNDLED_EMBEDDER)) / "modules.json").is_file()


def test_other_names_pass_through_and_unknown_bundled_names_fail() -> None:
    assert resolve_causal_lm("/some/folder") == "/some/folder"
    assert resolve_embedder("sentence-transformers/all-mpnet-base-v2").endswith("mpnet-base-v2")
    with pytest.raises(ModelNotFoundError, match="bundled:smollm2-135m-instruct"):
        resolve_causal_lm("bundled:llama-70b")


@pytest.mark.slow
def test_two_processes_converting_at_once_share_one_good_cache(tmp_path: Path) -> None:
    code = ("from wim.models import resolve_causal_lm, BUNDLED_POLICY; "
            "print(resolve_causal_lm(BUNDLED_POLICY))")
    env = {**os.environ, "WIM_CACHE": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outputs]
    folders = {out.strip().splitlines()[-1] for out, _ in outputs}
    assert folders == {str(tmp_path / "smollm2-135m-instruct")}
    # No half-written temporary folders are left behind, and the result loads.
    assert [p.name for p in tmp_path.iterdir()] == ["smollm2-135m-instruct"]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "smollm2-135m-instruct"))
    assert model.config.model_type == "llama"
