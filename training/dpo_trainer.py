"""The offline DPO trainer: TRL's DPOTrainer with the compact CPU head from its first forward on.

TRL patches its fused LM head onto the model and, with `precompute_ref_log_probs`, runs the whole
reference pass inside `__init__`, before a caller could touch the trainer. `WimDPOTrainer` puts
the compact head (training/cpu_head.py) on right before that pass and after `__init__` (where
there is no pass), so on a device without Triton every log-probability, the precomputed
reference's included, comes from the completion tokens only. No attribute of TRL's modules is
touched; on CUDA and XPU `use_compact_head` changes nothing.
"""

from __future__ import annotations

from typing import Any

from trl import DPOTrainer

from training.cpu_head import use_compact_head


class WimDPOTrainer(DPOTrainer):
    """DPOTrainer whose policy (and reference model) score only completion tokens on a CPU."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        use_compact_head(self)

    def _precompute_ref_logps(self, dataset, name: str, batch_size: int):
        # Called by DPOTrainer.__init__ (TRL 1.16) after it patched its head onto the model.
        use_compact_head(self)
        return super()._precompute_ref_logps(dataset, name, batch_size)
