"""The GPU check: one command on a GPU box, read line by line, PASS or FAIL (not collected by
pytest, and it needs nothing from it).

    python tests/gpu_check.py                 # one GPU: bf16 DPO, online DPO, QLoRA
    python tests/gpu_check.py --ddp 2         # also accelerate launch, 2 processes
    python tests/gpu_check.py --zero3         # also DeepSpeed ZeRO-3 (pip install deepspeed)
    python tests/gpu_check.py --cpu           # the same checks on this CPU (a dry run)

It pins one GPU itself (CUDA_VISIBLE_DEVICES, the first unless set), and takes a few minutes
on one H100-class GPU with the bundled model. What it checks, each a line:
- bf16 offline DPO through the precomputed-reference path and with gradient checkpointing:
  the loss falls, the base is bfloat16 on cuda and the LoRA weights float32, the CPU-only
  patches (eager bfloat16 attention, the compact head) are off;
- the saved adapter, loaded again onto the base, gives the trained model's log-probabilities;
- two steps of online DPO (`training.mode: online`) through the real CLI;
- QLoRA (`training.load_in_4bit`) where bitsandbytes is installed: LoRA float32, loss falls;
- `--ddp N`: `accelerate launch` of `wim train` in N processes: every rank steps, their LoRA
  weights agree, one adapter that loads;
- `--zero3`: ZeRO-3 with a persistence threshold of 0 and LoRA on every projection, so that
  even the bundled model's LoRA tensors are partitioned: the adapter is whole and loads.
Exit status 0 when every line passed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
ALL_PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# Clearly better chosen answers, so that a few steps at a high learning rate lower the loss.
PAIRS = [
    ("How many legs does a spider have?", "A spider has eight legs.", "zq xv blorp 7 ## kk"),
    ("What is the capital of Italy?", "The capital of Italy is Rome.", "fnord ;; 99 qqq wub"),
    ("What colour is the sky on a clear day?", "On a clear day the sky is blue.",
     "ppp ~~ 3x zzt orb"),
    ("How many days are in a week?", "A week has seven days.", "lorp %% 12 vvk ugh"),
    ("What do bees make?", "Bees make honey from the nectar of flowers.", "kq9 ## blat zz mn"),
    ("What is 3 + 4?", "3 + 4 = 7.", "wibble 88 ?? trr xo"),
    ("Which planet do we live on?", "We live on the planet Earth.", "qop $$ 41 zzk fen"),
    ("What is frozen water called?", "Frozen water is called ice.", "snarf 0 ^^ plk yy"),
]
TRAIN = ["dpo.learning_rate=5e-4", "dpo.per_device_train_batch_size=4", "dpo.max_length=128",
         "dpo.save_steps=0", "dpo.beta=0.1"]

results: list[bool] = []


def check(name: str, ok: bool, detail: str = "") -> bool:
    print(f"{'PASS' if ok else 'FAIL'}  {name}{'  (' + detail + ')' if detail else ''}",
          flush=True)
    results.append(bool(ok))
    return ok


def write_pairs(path: Path, copies: int) -> None:
    with path.open("w") as f:
        for prompt, good, bad in PAIRS * copies:
            f.write(json.dumps({"prompt": [{"role": "user", "content": prompt}],
                                "chosen": [{"role": "assistant", "content": good}],
                                "rejected": [{"role": "assistant", "content": bad}]}) + "\n")


def run_dir(work: Path, name: str, copies: int, overrides: list[str]) -> Path:
    """A run directory holding only pairs (made as `wim run --skip-train` would leave it)."""
    from wim.config import load_config
    from wim.rundir import RunDir

    run = RunDir(work / name)
    run.claim(load_config(QUICKSTART, overrides))
    write_pairs(run.pairs, copies)
    return run.path


def wim(args: list[str], launcher: list[str] | None = None) -> subprocess.CompletedProcess:
    cmd = [*(launcher or [sys.executable]), "-m", "wim", *args, "--no-progress"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
    return proc


def completion_log_probs(model, tokenizer, device) -> list[float]:
    """The summed log-probability of each chosen answer given its prompt."""
    import torch

    out = []
    for prompt, good, _ in PAIRS:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                            add_generation_prompt=True, return_tensors="pt")
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        answer = tokenizer(good, add_special_tokens=False, return_tensors="pt").input_ids
        full = torch.cat([ids, answer], dim=1).to(device)
        with torch.no_grad():
            logits = model(input_ids=full).logits.float()
        logp = torch.log_softmax(logits[0, ids.shape[1] - 1:-1], dim=-1)
        out.append(float(logp.gather(1, full[0, ids.shape[1]:, None]).sum()))
    return out


@contextlib.contextmanager
def plain_forward(model):
    """The trained model keeps the Trainer's forwards: accelerate's autocast wrapper on the
    peft model, TRL's fused head (and on a CPU the compact head) on the base. The reloaded model
    has the plain ones, whose bfloat16 logits round differently (0.4 nats over an answer seen).
    Compare like with like: the instance forwards are set aside meanwhile."""
    patched = {m: m.__dict__.pop("forward") for m in model.modules() if "forward" in m.__dict__}
    try:
        yield model
    finally:
        for module, forward in patched.items():
            module.forward = forward


def offline(work: Path, model_name: str, steps: int, device: str) -> None:
    """bf16 DPO through the precompute path with checkpointing; the adapter reloads."""
    import torch
    from peft import PeftModel

    from training.train import train_dpo_model
    from wim.config import load_config
    from wim.models import load_causal_lm

    cfg = load_config(QUICKSTART, [f"policy.model={model_name}", f"dpo.max_steps={steps}",
                                   "dpo.reference_pass=precompute",
                                   "training.gradient_checkpointing=true", *TRAIN])
    write_pairs(work / "pairs.jsonl", 8)  # 64 pairs: over TRL's precompute batch of 32
    metrics, trained = train_dpo_model(cfg, work / "pairs.jsonl", work / "train",
                                       progress=False)
    base = trained.get_base_model()
    check("offline DPO: loss falls", metrics["train/loss_last"] < metrics["train/loss_first"],
          f"{metrics['train/loss_first']:.4f} -> {metrics['train/loss_last']:.4f} in "
          f"{metrics['train/steps']} steps, {metrics['train/seconds']:.1f} s")
    check("offline DPO: the model is on the device", next(base.parameters()).device.type ==
          device, str(next(base.parameters()).device))
    want = "bfloat16" if device == "cuda" else metrics["train/base_dtype"]
    check("offline DPO: bf16 compute, bf16 base, float32 LoRA",
          (metrics["train/compute_dtype"], metrics["train/base_dtype"],
           metrics["train/lora_dtype"]) == (want, want, "float32"),
          f"{metrics['train/compute_dtype']}, {metrics['train/base_dtype']}, "
          f"{metrics['train/lora_dtype']}")
    compact = getattr(base.forward, "scores_completions_only", False)
    cpu_patch = metrics["train/attention"] != "sdpa" or compact
    check("offline DPO: the CPU-only patches are " + ("off" if device == "cuda" else "as on a CPU"),
          not cpu_patch if device == "cuda" else True,
          f"attention {metrics['train/attention']}, compact head {compact}")
    check("offline DPO: the LoRA weights moved", metrics["train/lora_delta_norm"] > 0,
          f"delta norm {metrics['train/lora_delta_norm']:.4g}")
    if device == "cuda":
        check("offline DPO: peak GPU memory recorded", metrics.get("train/peak_gpu_mb", 0) > 0,
              f"{metrics.get('train/peak_gpu_mb')} MB")
    model, tokenizer = load_causal_lm(model_name, dtype=cfg.policy.dtype)
    reloaded = PeftModel.from_pretrained(model, str(work / "train" / "adapter")).eval()
    dev = next(base.parameters()).device
    with plain_forward(trained):
        a = completion_log_probs(trained, tokenizer, dev)
    b = completion_log_probs(reloaded, tokenizer, dev)
    worst = max(abs(x - y) for x, y in zip(a, b, strict=True))
    check("saved adapter reloads to the trained model's log-probs", worst < 1e-3,
          f"largest difference {worst:.2g} nats over {len(a)} answers")
    del trained, reloaded, model
    torch.cuda.empty_cache() if device == "cuda" else None


def online(work: Path, model_name: str) -> None:
    out = work / "online"
    proc = wim(["run", str(QUICKSTART), "--out", str(out), "--set", f"policy.model={model_name}",
                "--set", "training.mode=online", "--set", "dpo.max_steps=2",
                "--set", "prompts.limit=4", "--set", "prompts.holdout=0",
                "--set", "training.online_max_new_tokens=24", "--set", "judge.max_new_tokens=48",
                "--set", "dpo.per_device_train_batch_size=2",
                "--set", "training.gradient_checkpointing=true"])
    ok = proc.returncode == 0 and (out / "train/metrics.json").is_file()
    metrics = json.loads((out / "train/metrics.json").read_text()) if ok else {}
    check("online DPO: two steps through `wim run`", ok and metrics.get("train/steps") == 2,
          f"exit {proc.returncode}, steps {metrics.get('train/steps')}")


def qlora(work: Path, model_name: str, steps: int) -> None:
    import importlib.util

    if importlib.util.find_spec("bitsandbytes") is None:
        print("SKIP  QLoRA: bitsandbytes is not installed (pip install bitsandbytes)")
        return
    from training.train import train_dpo_model
    from wim.config import load_config

    cfg = load_config(QUICKSTART, [f"policy.model={model_name}", f"dpo.max_steps={steps}",
                                   "training.load_in_4bit=true", *TRAIN])
    write_pairs(work / "qlora_pairs.jsonl", 2)
    metrics, _ = train_dpo_model(cfg, work / "qlora_pairs.jsonl", work / "qlora",
                                 progress=False)
    check("QLoRA: LoRA weights float32, loss falls",
          metrics["train/lora_dtype"] == "float32"
          and metrics["train/loss_last"] < metrics["train/loss_first"],
          f"lora {metrics['train/lora_dtype']}, loss {metrics['train/loss_first']:.4f} -> "
          f"{metrics['train/loss_last']:.4f}")


def launched(work: Path, model_name: str, processes: int, zero3: bool, cpu: bool) -> None:
    """`accelerate launch -m wim train DIR` in `processes` processes (ZeRO-3 or DDP)."""
    name = "zero3" if zero3 else "ddp"
    overrides = [f"policy.model={model_name}", "dpo.max_steps=4", *TRAIN]
    if zero3:
        overrides.append(f"lora.target_modules=[{','.join(ALL_PROJECTIONS)}]")
    run = run_dir(work, name, 2, overrides)
    config = ROOT / "configs/accelerate" / ("ddp_cpu.yaml" if cpu else f"{name}.yaml")
    extra: list[str] = []
    if zero3:
        # Threshold 0: every parameter is partitioned, as LoRA tensors of a 7B model are.
        ds = {"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
              "bf16": {"enabled": "auto"}, "train_micro_batch_size_per_gpu": "auto",
              "gradient_accumulation_steps": "auto", "gradient_clipping": 1.0}
        (work / "ds.json").write_text(json.dumps(ds))
        extra = ["--use_deepspeed", "--deepspeed_config_file", str(work / "ds.json"),
                 "--zero3_init_flag", "true"]
        config = ROOT / "configs/accelerate" / ("ddp_cpu.yaml" if cpu else "ddp.yaml")
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
                "--num_processes", str(processes), *extra]
    proc = wim(["train", str(run)], launcher=launcher)
    ranks = [json.loads(p.read_text()) for p in sorted((run / "train/ranks").glob("*.json"))]
    sums = [r["lora_checksum"] for r in ranks]
    check(f"{name}: {processes} ranks stepped alike", proc.returncode == 0 and len(ranks) ==
          processes and len({r["steps"] for r in ranks}) == 1
          and max(sums) - min(sums) <= 1e-6 * max(1.0, max(sums)),
          f"exit {proc.returncode}, steps {[r['steps'] for r in ranks]}")
    adapter = run / "train/adapter"
    whole = False
    if (adapter / "adapter_model.safetensors").is_file():
        from safetensors.torch import load_file

        tensors = load_file(str(adapter / "adapter_model.safetensors"))
        whole = bool(tensors) and all(t.dim() == 2 and t.numel() > 0 for t in tensors.values())
        stats = json.loads((run / "stats/train.json").read_text())
        whole = whole and stats["train/lora_delta_norm"] > 0
    check(f"{name}: one whole adapter (every LoRA tensor 2-D, non-empty; weights moved)", whole)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bundled:smollm2-135m-instruct")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--ddp", type=int, default=0, metavar="N",
                        help="also run accelerate launch with N processes (N GPUs)")
    parser.add_argument("--zero3", action="store_true", help="also run DeepSpeed ZeRO-3")
    parser.add_argument("--cpu", action="store_true", help="run the checks on the CPU")
    args = parser.parse_args()
    users_gpus = os.environ.get("CUDA_VISIBLE_DEVICES")
    # One GPU for the single-process checks, pinned before torch starts CUDA (none: --cpu).
    os.environ["CUDA_VISIBLE_DEVICES"] = "" if args.cpu else (users_gpus or "0").split(",")[0]
    sys.path.insert(0, str(ROOT))
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not args.cpu:
        print("gpu_check: no CUDA GPU visible (run with --cpu for a dry run on the CPU)")
        return 1
    name = torch.cuda.get_device_name(0) if device == "cuda" else "CPU"
    print(f"gpu_check on {name}; torch {torch.__version__}; model {args.model}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        offline(work, args.model, args.steps, device)
        online(work, args.model)
        if device == "cuda":
            qlora(work, args.model, args.steps)
        if args.ddp or args.zero3:
            if device == "cuda":  # the launched processes see the user's GPUs again
                os.environ.pop("CUDA_VISIBLE_DEVICES")
                if users_gpus is not None:
                    os.environ["CUDA_VISIBLE_DEVICES"] = users_gpus
            if args.ddp:
                launched(work, args.model, args.ddp, zero3=False, cpu=device == "cpu")
            if args.zero3 and device == "cpu":
                print("SKIP  zero3: DeepSpeed ZeRO-3 needs GPUs")
            elif args.zero3:
                launched(work, args.model, max(args.ddp, 2), zero3=True, cpu=device == "cpu")
    print(f"gpu_check: {sum(results)} of {len(results)} passed;",
          "OK" if all(results) else "FAILED", flush=True)
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
