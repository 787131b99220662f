"""wim/precision.py: which dtype `auto` picks, per machine, and what a run does with it."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import QUICKSTART

import wim.precision as precision
import wim.rundir as rundir
from wim.cli import main
from wim.config import load_config
from wim.precision import DtypeError, Machine, pick_dtype, pin_dtypes
from wim.rundir import RunDir, RunDirError

XEON_AMX = Machine(cuda=False, cuda_bf16=False, cpu_capability="AVX512",
                   avx512_bf16=True, amx_tile=True)
ZEN4 = Machine(cuda=False, cuda_bf16=False, cpu_capability="AVX512",
               avx512_bf16=True, amx_tile=False)
AMX_ONLY = Machine(cuda=False, cuda_bf16=False, cpu_capability="AVX512",
                   avx512_bf16=False, amx_tile=True)
AVX2 = Machine(cuda=False, cuda_bf16=False, cpu_capability="AVX2",
               avx512_bf16=False, amx_tile=False)
AVX512_NO_BF16 = Machine(cuda=False, cuda_bf16=False, cpu_capability="AVX512", avx512_bf16=False,
                         amx_tile=False)
GPU_OLD_CPU = Machine(cuda=True, cuda_bf16=True, cpu_capability="AVX2", avx512_bf16=False,
                      amx_tile=False)
# A GPU before Ampere (a T4, a V100): bfloat16 only emulated, so `auto` keeps float32.
PRE_AMPERE = Machine(cuda=True, cuda_bf16=False, cpu_capability="AVX512", avx512_bf16=True,
                     amx_tile=True)


@pytest.mark.parametrize("machine, expected", [
    (XEON_AMX, "bfloat16"), (ZEN4, "bfloat16"), (AMX_ONLY, "bfloat16"),
    (AVX2, "float32"), (AVX512_NO_BF16, "float32"), (GPU_OLD_CPU, "bfloat16"),
    (PRE_AMPERE, "float32"),
])
def test_auto_is_bfloat16_only_where_it_is_native(machine: Machine, expected: str) -> None:
    assert pick_dtype("auto", machine) == expected
    assert machine.describe()["native_bf16"] == (machine.avx512_bf16 or machine.amx_tile)


@pytest.mark.parametrize("machine", [XEON_AMX, AVX2, GPU_OLD_CPU])
def test_an_explicit_dtype_is_kept_on_every_machine(machine: Machine) -> None:
    assert pick_dtype("float32", machine) == "float32"
    assert pick_dtype("bfloat16", machine) == "bfloat16"


def test_an_unknown_dtype_is_refused() -> None:
    with pytest.raises(DtypeError, match="float16"):
        pick_dtype("float16", ZEN4)


def test_config_refuses_an_unknown_dtype() -> None:
    from wim.config import ConfigError

    with pytest.raises(ConfigError, match="'judge.dtype' must be one of auto, float32, "
                                          "bfloat16, got 'fp16'"):
        load_config(QUICKSTART, ["judge.dtype=fp16"])


def test_this_machine_as_torch_reports_it_matches_proc_cpuinfo() -> None:
    """For real: the flags torch reads are the kernel's (/proc/cpuinfo), and `auto` follows
    them. Which kind this CPU is decides the expected dtype, not the other way round."""
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        pytest.skip("no /proc/cpuinfo (not Linux)")
    flags = set(next(line for line in cpuinfo.read_text().splitlines()
                     if line.startswith("flags")).split(":", 1)[1].split())
    here = precision.machine()
    assert here.avx512_bf16 == ("avx512_bf16" in flags)
    assert here.amx_tile == ("amx_tile" in flags)
    native = "avx512_bf16" in flags or "amx_tile" in flags
    expected = "bfloat16" if (here.cuda_bf16 if here.cuda else native) else "float32"
    assert precision.resolve_dtype("auto") == expected
    assert str(precision.torch_dtype("auto")) == f"torch.{expected}"


@pytest.mark.slow
def test_the_bundled_model_loads_in_the_resolved_dtype() -> None:
    from wim.models import BUNDLED_POLICY, load_causal_lm

    model, _ = load_causal_lm(BUNDLED_POLICY)
    assert str(model.dtype) == f"torch.{precision.resolve_dtype('auto')}"
    model, _ = load_causal_lm(BUNDLED_POLICY, dtype="float32")
    assert model.dtype.is_floating_point and str(model.dtype) == "torch.float32"


def _on(monkeypatch, machine: Machine) -> None:
    """Run as if on `machine` (both modules that ask)."""
    monkeypatch.setattr(precision, "machine", lambda: machine)
    monkeypatch.setattr(rundir, "machine", lambda: machine)


def test_pin_resolves_only_the_dtypes_that_decide_a_result(monkeypatch) -> None:
    _on(monkeypatch, ZEN4)
    cfg = pin_dtypes(load_config(QUICKSTART, ["blind.backend=http",
                                              "blind.http.base_urls=[http://x/v1]"]))
    assert cfg.policy.dtype == "bfloat16"
    assert cfg.judge.dtype == "auto"  # role fixed: the judge is the policy's weights
    assert cfg.blind.dtype == "auto"  # an http evaluator has no dtype of ours
    ext = pin_dtypes(load_config(QUICKSTART, ["judge.role=external", "judge.model=m"]))
    assert (ext.judge.dtype, ext.blind.dtype) == ("bfloat16", "bfloat16")


def test_the_run_records_the_resolved_dtype_and_the_machine(tmp_path, monkeypatch) -> None:
    _on(monkeypatch, ZEN4)
    run = RunDir(tmp_path / "run")
    run.claim(load_config(QUICKSTART))
    meta = run.read_meta()
    assert meta["config"]["policy"]["dtype"] == "bfloat16"
    assert meta["dtype_picked_for"] == {**ZEN4.describe(), "native_bf16": True}
    assert run.load_config().policy.dtype == "bfloat16"
    _on(monkeypatch, AVX2)
    assert rundir.identity(load_config(QUICKSTART))["policy"]["dtype"] == "float32"


def test_a_resumed_run_refuses_the_dtype_this_machine_would_pick(tmp_path, monkeypatch,
                                                                   capsys) -> None:
    _on(monkeypatch, ZEN4)
    out = tmp_path / "run"
    RunDir(out).claim(load_config(QUICKSTART))
    _on(monkeypatch, AVX2)
    # The real command, as a user types it: refused before any model is loaded.
    assert main(["generate", str(QUICKSTART), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "policy.dtype bfloat16 -> float32" in err
    assert "--set policy.dtype=bfloat16" in err and "AVX2" in err
    with pytest.raises(RunDirError, match="policy.dtype"):
        RunDir(out).claim(load_config(QUICKSTART, ["policy.dtype=float32"]))
    # Set explicitly to the run's dtype, the run continues on this machine.
    RunDir(out).claim(load_config(QUICKSTART, ["policy.dtype=bfloat16"]))
    assert RunDir(out).read_meta()["config"]["policy"]["dtype"] == "bfloat16"


def test_training_resolves_auto_where_it_runs_and_keeps_an_explicit_dtype(tmp_path,
                                                                         monkeypatch) -> None:
    """A directory made where `auto` meant float32 (pinned so for its samples and judgements)
    trains in bfloat16 where training runs on a device that computes it natively; one made
    with an explicit float32 keeps float32 there."""
    _on(monkeypatch, AVX2)
    made = {"auto": RunDir(tmp_path / "auto"), "float32": RunDir(tmp_path / "explicit")}
    made["auto"].claim(load_config(QUICKSTART))
    made["float32"].claim(load_config(QUICKSTART, ["policy.dtype=float32"]))
    for run in made.values():
        assert run.load_config().policy.dtype == "float32"  # pinned for the data stages
        assert run.training_dtype(run.load_config()) == "float32"
    _on(monkeypatch, GPU_OLD_CPU)  # a GPU that computes bfloat16 natively
    assert made["auto"].training_dtype(made["auto"].load_config()) == "bfloat16"
    assert made["float32"].training_dtype(made["float32"].load_config()) == "float32"
    # Saving the config again (a resumed stage reads it back pinned) keeps what was asked.
    made["auto"].save_config(made["auto"].load_config())
    assert made["auto"].training_dtype(made["auto"].load_config()) == "bfloat16"


@pytest.mark.slow
def test_wim_train_on_a_bfloat16_machine_trains_a_cpu_made_directory_in_bfloat16(
        tmp_path, monkeypatch) -> None:
    """The README's "At scale" workflow, in process: the run directory was made where `auto`
    meant float32, and `wim train DIR` runs where it means bfloat16 (here a CPU with native
    bfloat16 stands in for the GPU box; the rule is the same)."""
    import json

    from conftest import GOOD_VS_GARBAGE, write_pair_rows

    _on(monkeypatch, AVX2)
    run = RunDir(tmp_path / "run")
    run.claim(load_config(QUICKSTART))
    write_pair_rows(run.pairs, GOOD_VS_GARBAGE[:4])
    _on(monkeypatch, ZEN4)
    assert main(["train", str(run.path), "--no-progress", "--set", "dpo.max_steps=1",
                 "--set", "dpo.per_device_train_batch_size=2", "--set", "dpo.max_length=64",
                 "--set", "dpo.save_steps=0"]) == 0
    stats = json.loads((run.path / "stats/train.json").read_text())
    assert stats["train/compute_dtype"] == "bfloat16"
    assert stats["train/base_dtype"] == "bfloat16" and stats["train/lora_dtype"] == "float32"
    assert run.load_config().policy.dtype == "float32"  # the data stages' dtype is unchanged
