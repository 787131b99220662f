"""GPU check (not collected by pytest): a few DPO steps in bf16 and in 4 bit (QLoRA) on a small
Llama-architecture model, printing seconds per step and peak GPU memory.

    python tests/gpu_check.py [--model bundled:smollm2-135m-instruct] [--steps 5]

Needs a CUDA GPU; the 4-bit run also needs `pip install bitsandbytes` (skipped with a note
when missing). The bundled SmolLM2-135M is a LlamaForCausalLM, so it runs offline; pass a local
folder of a larger Llama-class model for more telling numbers. Each run also checks what the
code promises on a GPU: bf16 weights, the model on cuda, and the LoRA weights moved.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def one_run(model: str, steps: int, four_bit: bool, work: Path) -> dict:
    import torch
    from conftest import GOOD_VS_GARBAGE, write_pair_rows

    from training.dpo import train_dpo_model
    from wim.config import Config

    cfg = Config()
    cfg.policy.model = model
    cfg.dpo.max_steps, cfg.dpo.per_device_train_batch_size = steps, 4
    cfg.dpo.max_length, cfg.dpo.save_steps, cfg.dpo.learning_rate = 128, 0, 1e-3
    cfg.lora.target_modules = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                               "down_proj"]
    cfg.training.load_in_4bit = four_bit
    write_pair_rows(work / "pairs.jsonl", GOOD_VS_GARBAGE * 4)
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    metrics, trained = train_dpo_model(cfg, work / "pairs.jsonl", work / "train", progress=False)
    total = time.perf_counter() - start
    base = trained.get_base_model()
    return {
        "mode": "4-bit QLoRA" if four_bit else "bf16 LoRA",
        "device": str(next(base.parameters()).device),
        "dtype": str(base.dtype),
        "steps": metrics["train/steps"],
        "s_per_step": round(metrics["train/seconds"] / max(1, metrics["train/steps"]), 3),
        "seconds_with_load": round(total, 1),
        "peak_gpu_mb": metrics.get("train/peak_gpu_mb"),
        "peak_rss_mb": metrics["train/peak_rss_mb"],
        "loss_first": metrics["train/loss_first"],
        "loss_last": metrics["train/loss_last"],
        "lora_delta_norm": metrics["train/lora_delta_norm"],
    }


def main() -> int:
    import importlib.util

    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bundled:smollm2-135m-instruct")
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU visible; nothing to check.")
        return 1
    print(f"GPU: {torch.cuda.get_device_name(0)}; torch {torch.__version__}")
    results, ok = [], True
    for four_bit in (False, True):
        if four_bit and importlib.util.find_spec("bitsandbytes") is None:
            print("4-bit: skipped, bitsandbytes is not installed (pip install bitsandbytes)")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            r = one_run(args.model, args.steps, four_bit, Path(tmp))
        results.append(r)
        print(json.dumps(r))
        ok &= r["device"].startswith("cuda") and r["lora_delta_norm"] > 0
        ok &= four_bit or r["dtype"] == "torch.bfloat16"
    print("| mode | s/step | peak GPU MB | loss first -> last |")
    print("|---|---|---|---|")
    for r in results:
        print(f"| {r['mode']} | {r['s_per_step']} | {r['peak_gpu_mb']} | "
              f"{r['loss_first']:.4f} -> {r['loss_last']:.4f} |")
    print("gpu_check:", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
