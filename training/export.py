"""`wim export DIR --merged OUT`: the base model with the run's last adapter merged in, saved
as a plain transformers folder that loads without peft (docs/design.md, "Training: rounds,
online DPO, devices").

The adapter merged is the one `wim eval` evaluates (`RunDir.final_adapter`: the last round's,
else `DIR/train/adapter`; none there is an error naming the command that trains it).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from wim.errors import InputError
from wim.models import load_causal_lm
from wim.rundir import RunDir


def export_merged(run_dir: Path, out: Path) -> dict[str, Any]:
    """Merge the run's last adapter into its base policy and save the result to `out`."""
    from peft import PeftModel

    run = RunDir(run_dir)
    cfg = run.load_config()
    adapter = run.final_adapter()
    if out.exists() and any(out.iterdir()):
        raise InputError(f"{out} exists and is not empty; give --merged a new folder.")
    start = time.perf_counter()
    # Never 4 bit and never bfloat16: merged weights are full float32, whatever the run used.
    model, tokenizer = load_causal_lm(cfg.policy.model, dtype="float32")
    merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    out.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    summary = {"base": cfg.policy.model, "adapter": str(adapter), "merged": str(out),
               "seconds": round(time.perf_counter() - start, 1)}
    (out / "wim_export.json").write_text(json.dumps(summary, indent=2))
    return summary
