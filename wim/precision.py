"""Which floating-point type a local model computes in: `dtype: auto | float32 | bfloat16`.

`auto` is bfloat16 only where the device computes it natively: on a GPU from Ampere on, on a CPU
with AMX tiles or AVX512-BF16 (as torch reports them); elsewhere (older GPUs included) bfloat16 is
emulated and slower than float32, so float32 stays. `pick_dtype` is the pure rule; `machine()` asks
torch what this machine has. The in-process embedder follows it too (`scoring.dtype`,
wim/embedders.py); its dtype is part of each stored similarity's key, so dtypes never mix.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, replace
from typing import Any

from wim.config.sampling import DTYPES
from wim.errors import WimError


class DtypeError(WimError):
    """A dtype name that is none of DTYPES."""


@dataclass(frozen=True)
class Machine:
    """What the dtype choice depends on."""

    cuda: bool
    """A CUDA GPU is visible (models then run on it)."""
    cuda_bf16: bool
    """That GPU computes bfloat16 natively (Ampere and later); older ones emulate it, slowly."""
    cpu_capability: str
    """torch's SIMD level for its CPU kernels (AVX2, AVX512, ...)."""
    avx512_bf16: bool
    """The CPU has AVX512-BF16 (`torch.cpu._is_avx512_bf16_supported()`)."""
    amx_tile: bool
    """The CPU has AMX tiles (`torch.cpu._is_amx_tile_supported()`)."""

    @property
    def native_bf16(self) -> bool:
        """The CPU computes bfloat16 matmuls in hardware (oneDNN uses AMX or AVX512-BF16)."""
        return self.amx_tile or self.avx512_bf16

    def describe(self) -> dict:
        """The record kept beside a resolved dtype (resolved_config.yaml, report.json)."""
        return {**asdict(self), "native_bf16": self.native_bf16}


def pick_dtype(requested: str, machine: Machine) -> str:
    """The dtype `requested` (`auto`, `float32`, `bfloat16`) resolves to on `machine`."""
    if requested not in DTYPES:
        raise DtypeError(f"dtype must be one of {', '.join(DTYPES)}, got {requested!r}")
    if requested != "auto":
        return requested
    if machine.cuda:
        return "bfloat16" if machine.cuda_bf16 else "float32"
    return "bfloat16" if machine.native_bf16 else "float32"


@functools.lru_cache(maxsize=1)
def machine() -> Machine:
    """This machine, as torch sees it (imports torch; asked once per process)."""
    import torch

    cuda = torch.cuda.is_available()
    return Machine(cuda=cuda,
                   cuda_bf16=cuda and torch.cuda.is_bf16_supported(including_emulation=False),
                   cpu_capability=torch.backends.cpu.get_cpu_capability(),
                   avx512_bf16=bool(torch.cpu._is_avx512_bf16_supported()),
                   amx_tile=bool(torch.cpu._is_amx_tile_supported()))


def resolve_dtype(requested: str) -> str:
    """`pick_dtype` on this machine; torch is imported only when `requested` is `auto`."""
    return requested if requested in DTYPES[1:] else pick_dtype(requested, machine())


def torch_dtype(name: str):
    """The torch dtype of a resolved name (`auto` is resolved first)."""
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[resolve_dtype(name)]


def pin_dtypes(cfg: Any) -> Any:
    """`cfg` (a Config) with each `auto` dtype that decides a result resolved on this machine:
    the policy's (it samples, judges, trains), an external judge's and the blind evaluator's on
    the transformers backend.
    The run's identity and resolved_config.yaml hold these, so a run never mixes dtypes."""
    judge, blind = cfg.judge, cfg.blind
    if judge.role == "external" and judge.backend == "transformers":
        judge = replace(judge, dtype=resolve_dtype(judge.dtype))
    if blind.backend == "transformers":
        blind = replace(blind, dtype=resolve_dtype(blind.dtype))
    return replace(cfg, policy=replace(cfg.policy, dtype=resolve_dtype(cfg.policy.dtype)),
                   judge=judge, blind=blind)


def uses_auto(cfg: Any) -> bool:
    """Some dtype of `cfg` is `auto` (so the machine decides it)."""
    return "auto" in (cfg.policy.dtype, cfg.judge.dtype, cfg.blind.dtype)
