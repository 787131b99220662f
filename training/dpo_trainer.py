"""The offline DPO trainer: TRL's DPOTrainer with the compact CPU head from its first forward on.
More: docs/design.md, "Module notes".
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
