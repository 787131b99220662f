"""The GPU check: one command on a GPU box, read line by line (not collected by pytest).

    python tests/gpu_check.py                 # every row this box can run (a few minutes)
    python tests/gpu_check.py --rows online,zero3     # some rows only
    python tests/gpu_check.py --cpu           # a dry run: what a CPU can run, on the CPU

Each check prints PASS or FAIL with what it saw; a row this box cannot run prints SKIP with the
reason (no bitsandbytes, no deepspeed, one GPU where it needs two), and then the last line says
INCOMPLETE (exit 2), never OK. FAILED: exit 1; OK: exit 0. Nothing is pinned: every process
sees the GPUs the user gave it. Install what a full check needs: `pip install bitsandbytes
deepspeed` (README, "GPU box"). A row that raises is reported FAIL with the error, and the
others still run. The rows (`ROWS`):
- offline: bf16 DPO in this process through the precompute path with checkpointing: the loss
  falls, bfloat16 base and compute with float32 LoRA on cuda, the CPU-only patches off, the
  saved adapter reloads to the trained model's log-probs;
- several_gpus: `wim train` in a child that sees every GPU (no launcher) trains on the first;
- online: `wim run` with `training.mode: online` and checkpointing in a child that sees every
  GPU: two steps, and every sampling forward after the prompt's takes one new token (the KV
  cache is used), none of it on another GPU;
- elsewhere: a run directory made with `policy.dtype: auto` as another machine makes it (an
  AVX2 CPU driver: float32 pinned) trains here through `wim train` in bfloat16;
- qlora: `training.load_in_4bit` in this process: LoRA float32, the loss falls;
- ddp: `accelerate launch` of `wim train` on every GPU: every rank steps alike on its own GPU,
  and the adapter reloads to the trained model's log-probs;
- qlora_ddp: the same with `training.load_in_4bit`: each rank's 4-bit model on its own GPU;
- zero3: DeepSpeed ZeRO-3 with a persistence threshold of 0 and LoRA on every projection (even
  the bundled model's LoRA tensors are partitioned): the saved adapter, reloaded from the file
  onto the base, gives the trained model's log-probs within TOLERANCE_NATS.
A child runs wim's CLI entry (`wim.cli.main`, what `python -m wim` runs) under probes that
record what the GPU check reads back (`child`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import traceback
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
# A reloaded adapter's summed log-probability of each answer (6-12 tokens) may differ from the
# trained model's by this much (both computed alike, in the dtype training used); training must
# have moved them by MOVED_NATS at least, or a wrong adapter could pass.
TOLERANCE_NATS = 0.01
MOVED_NATS = 0.1
# name: (what it checks, what of it a CPU runs in the dry run).
ROWS = {
    "offline": ("bf16 DPO in process: loss, dtypes, CPU patches off, the adapter reloads",
                "runs; the CPU patches being off and the GPU memory need a GPU"),
    "several_gpus": ("several GPUs without a launcher: a child that sees every GPU trains on one",
                     "needs 2 GPUs"),
    "online": ("online DPO through `wim run`, sampling with its KV cache while checkpointing",
               "runs; 'no other GPU used' needs 2 GPUs"),
    "elsewhere": ("a run directory made with dtype auto elsewhere trains here via `wim train`",
                  "runs: made as a machine whose auto is the other dtype than here's"),
    "qlora": ("QLoRA in process: float32 LoRA, the loss falls", "needs a GPU and bitsandbytes"),
    "ddp": ("accelerate launch on every GPU: ranks step alike, the adapter reloads",
            "runs in 2 CPU processes over gloo; 'each rank on its own GPU' needs 2 GPUs"),
    "qlora_ddp": ("QLoRA under --ddp: each rank's 4-bit model on its own GPU",
                  "needs 2 GPUs and bitsandbytes"),
    "zero3": ("ZeRO-3: the saved adapter reloads from the file to the trained log-probs",
              "needs a GPU and deepspeed"),
}
CPU_ROWS = ("offline", "online", "elsewhere", "ddp")


class Results:
    """The lines printed so far: PASS, FAIL, SKIP (with the reason) and GPU (dry run only)."""

    def __init__(self) -> None:
        self.counts = {"PASS": 0, "FAIL": 0, "SKIP": 0, "GPU": 0}

    def line(self, status: str, name: str, detail: str = "") -> bool:
        print(f"{status:<5} {name}{'  (' + detail + ')' if detail else ''}", flush=True)
        self.counts[status] += 1
        return status == "PASS"

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        return self.line("PASS" if ok else "FAIL", name, detail)

    def summary(self, cpu: bool) -> tuple[str, int]:
        c = self.counts
        head = f"gpu_check{' --cpu' if cpu else ''}: {c['PASS']} passed, {c['FAIL']} failed, " \
               f"{c['SKIP']} skipped" + (f", {c['GPU']} need a GPU (not run)" if cpu else "")
        if c["FAIL"]:
            return head + "; FAILED", 1
        if c["SKIP"] or not c["PASS"]:
            return head + "; INCOMPLETE (see SKIP above)", 2
        if cpu:
            return head + "; DRY RUN PASSED (a CPU run: not a GPU check)", 0
        return head + "; OK", 0


R = Results()


# ---------------------------------------------------------------- helpers shared with the child

def write_pairs(path: Path, copies: int) -> None:
    with path.open("w") as f:
        for prompt, good, bad in PAIRS * copies:
            f.write(json.dumps({"prompt": [{"role": "user", "content": prompt}],
                                "chosen": [{"role": "assistant", "content": good}],
                                "rejected": [{"role": "assistant", "content": bad}]}) + "\n")


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
    Compare like with like: the instance forwards are set aside meanwhile, the LoRA layers cast
    their input as a reloaded model's do (training turns that off under autocast), and the
    attention is SDPA, as loaded (a bfloat16 CPU model trains with an eager one: 0.23 nats)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    from wim.models import attention_implementation

    patched = {m: m.__dict__.pop("forward") for m in model.modules() if "forward" in m.__dict__}
    casting = {m: m.cast_input_dtype_enabled for m in model.modules()
               if isinstance(m, BaseTunerLayer)}
    was_training = model.training
    for layer in casting:
        layer.cast_input_dtype_enabled = True
    model.eval()
    try:
        with attention_implementation(model, "sdpa"):
            yield model
    finally:
        model.train(was_training)
        for layer, value in casting.items():
            layer.cast_input_dtype_enabled = value
        for module, forward in patched.items():
            module.forward = forward


def trained_model_facts(model, tokenizer) -> dict:
    """Where the trained model lives, its dtypes, and its log-probs of the chosen answers."""
    base = model.get_base_model()
    named = list(model.named_parameters())
    device = model.get_input_embeddings().weight.device
    with plain_forward(model):
        logprobs = completion_log_probs(model, tokenizer, device)
    return {"devices": sorted({str(p.device) for _, p in named}),
            "loaded_in_4bit": bool(getattr(base, "is_loaded_in_4bit", False)),
            "lora_dtype": sorted({str(p.dtype) for n, p in named if "lora_" in n}),
            "base_dtype": str(next(p.dtype for n, p in named if "lora_" not in n
                                   and p.is_floating_point())),
            "logprobs": logprobs}


# ---------------------------------------------------------------- the child (`--child DIR ...`)

def child(probe_dir: Path, wim_args: list[str]) -> int:
    """Run `wim <wim_args>` through wim's CLI entry with probes; write what they saw to
    probe_dir/rank<RANK>.json: the GPUs visible, the exit status, each GPU's peak memory, the
    trained model (offline: `trained_model_facts` after training, on every rank, as ZeRO-3's
    forward needs) and each online sampling call (the forward input lengths, the cache flag)."""
    sys.path.insert(0, str(ROOT))
    import torch

    from training.dpo_trainer import WimDPOTrainer
    from training.online_trainer import WimOnlineDPOTrainer
    from wim.cli import main

    rank = os.environ.get("RANK", "0")
    probe: dict = {"rank": int(rank), "visible_gpus": torch.cuda.device_count(), "sampling": []}
    real_train, real_generate = WimDPOTrainer.train, WimOnlineDPOTrainer._generate

    def train(self, *args, **kwargs):
        out = real_train(self, *args, **kwargs)
        probe["trained"] = trained_model_facts(self.model, self.processing_class)
        return out

    def generate(self, model, prompts, *args, **kwargs):
        lengths: list[int] = []
        embed = self.model.get_input_embeddings()
        hook = embed.register_forward_pre_hook(
            lambda module, inputs: lengths.append(int(inputs[0].shape[1]))
            if not torch.is_grad_enabled() else None)
        try:
            out = real_generate(self, model, prompts, *args, **kwargs)
        finally:
            hook.remove()
        probe["sampling"].append({"use_cache": self.generation_config.use_cache,
                                  "checkpointing": bool(self.args.gradient_checkpointing),
                                  "forward_lengths": lengths})
        return out

    WimDPOTrainer.train, WimOnlineDPOTrainer._generate = train, generate
    try:
        probe["exit"] = main([*wim_args, "--no-progress"])
    finally:
        if torch.cuda.is_available():
            probe["peak_gpu_mb"] = [torch.cuda.max_memory_allocated(i) / 2 ** 20
                                    for i in range(torch.cuda.device_count())]
        probe_dir.mkdir(parents=True, exist_ok=True)
        (probe_dir / f"rank{rank}.json").write_text(json.dumps(probe))
    return probe["exit"]


def run_child(probe_dir: Path, wim_args: list[str], launcher: list[str] | None = None,
              timeout: int = 900) -> tuple[int, list[dict]]:
    """(exit status, each rank's probe) of `wim <wim_args>` in a child process (under
    `launcher`, e.g. accelerate launch). Killed with its process group on timeout."""
    cmd = [*(launcher or [sys.executable]), str(Path(__file__).resolve()), "--child",
           str(probe_dir), *wim_args]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True,
                            env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise TimeoutError(f"`wim {' '.join(wim_args[:2])}` ran past {timeout} s") from None
    if proc.returncode != 0:
        print(output[-3000:], file=sys.stderr)
    probes = sorted((json.loads(p.read_text()) for p in probe_dir.glob("rank*.json")),
                    key=lambda probe: probe["rank"])
    return proc.returncode, probes


def run_dir(work: Path, name: str, copies: int, overrides: list[str]) -> Path:
    """A run directory holding only pairs (made as `wim run --skip-train` would leave it)."""
    from wim.config import load_config
    from wim.rundir import RunDir

    run = RunDir(work / name)
    run.claim(load_config(QUICKSTART, overrides))
    write_pairs(run.pairs, copies)
    return run.path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def adapter_reloads(name: str, adapter: Path, trained: dict, model_name: str) -> None:
    """The adapter saved in `adapter`, loaded onto a fresh base in the dtypes training used,
    gives the trained model's log-probs (`trained`: `trained_model_facts`)."""
    import torch
    from peft import PeftModel

    from wim.models import load_causal_lm

    model, tokenizer = load_causal_lm(model_name,
                                      dtype=trained["base_dtype"].removeprefix("torch."))
    reloaded = PeftModel.from_pretrained(model, str(adapter)).eval()
    lora_dtype = getattr(torch, trained["lora_dtype"][0].removeprefix("torch."))
    for param_name, param in reloaded.named_parameters():
        if "lora_" in param_name:  # peft loads float32; ZeRO-3 trained them in bfloat16
            param.data = param.data.to(lora_dtype)
    device = reloaded.get_input_embeddings().weight.device
    got = completion_log_probs(reloaded, tokenizer, device)
    with reloaded.disable_adapter():
        base = completion_log_probs(reloaded, tokenizer, device)
    worst = max(abs(a - b) for a, b in zip(got, trained["logprobs"], strict=True))
    moved = max(abs(a - b) for a, b in zip(base, trained["logprobs"], strict=True))
    R.check(f"{name}: the saved adapter, reloaded from its file onto the base, gives the "
            "trained model's log-probs", worst <= TOLERANCE_NATS and moved >= MOVED_NATS,
            f"largest difference {worst:.2g} nats over {len(got)} answers, tolerance "
            f"{TOLERANCE_NATS}; training moved them by up to {moved:.2g} (>= {MOVED_NATS} needed)")


class Box:
    """What this machine offers the rows: the device, the GPUs, the optional packages."""

    def __init__(self, cpu: bool) -> None:
        import importlib.util

        import torch

        self.cpu = cpu
        self.gpus = 0 if cpu else torch.cuda.device_count()
        self.device = "cpu" if cpu else "cuda"
        self.has = {p: importlib.util.find_spec(p) is not None
                    for p in ("bitsandbytes", "deepspeed")}

    def cannot_run(self, row: str) -> str | None:
        """Why `row` cannot run here (None: it can)."""
        if self.cpu:
            return None if row in CPU_ROWS else ROWS[row][1]
        gpus = {"several_gpus": 2, "ddp": 2, "qlora_ddp": 2}.get(row, 1)
        if self.gpus < gpus:
            return f"needs {gpus} GPUs, {self.gpus} visible"
        lacking = [p for p in {"qlora": ["bitsandbytes"], "qlora_ddp": ["bitsandbytes"],
                               "zero3": ["deepspeed"]}.get(row, []) if not self.has[p]]
        return f"pip install {' '.join(lacking)}" if lacking else None

    def gpu_part(self, name: str, gpus: int, check) -> None:
        """A part of a row that needs `gpus` GPUs: checked (`check()`: ok, detail) where there
        are as many, listed (dry run) or skipped otherwise."""
        if self.gpus >= gpus:
            R.check(name, *check())
        else:
            R.line("GPU" if self.cpu else "SKIP", name, f"needs {gpus} GPU(s)")


# ---------------------------------------------------------------- the rows

def offline(work: Path, args, box: Box) -> None:
    from transformers import AutoTokenizer

    from training.train import train_dpo_model
    from wim.config import load_config
    from wim.precision import resolve_dtype

    cfg = load_config(QUICKSTART, [f"policy.model={args.model}", f"dpo.max_steps={args.steps}",
                                   "dpo.reference_pass=precompute",
                                   "training.gradient_checkpointing=true", *TRAIN])
    write_pairs(work / "pairs.jsonl", 8)  # 64 pairs: over TRL's precompute batch of 32
    metrics, trained = train_dpo_model(cfg, work / "pairs.jsonl", work / "train",
                                       progress=False)
    base = trained.get_base_model()
    R.check("offline: loss falls", metrics["train/loss_last"] < metrics["train/loss_first"],
            f"{metrics['train/loss_first']:.4f} -> {metrics['train/loss_last']:.4f} in "
            f"{metrics['train/steps']} steps, {metrics['train/seconds']:.1f} s")
    device = next(base.parameters()).device
    R.check("offline: the model is on the device", device.type == box.device, str(device))
    here = resolve_dtype("auto")  # bfloat16 on a GPU from Ampere on
    dtypes = (metrics["train/compute_dtype"], metrics["train/base_dtype"],
              metrics["train/lora_dtype"])
    R.check(f"offline: {here} compute, {here} base, float32 LoRA",
            dtypes == (here, here, "float32"), ", ".join(dtypes))
    compact = getattr(base.forward, "scores_completions_only", False)
    box.gpu_part("offline: the CPU-only patches (eager bfloat16 attention, compact head) are "
                 "off", 1, lambda: (metrics["train/attention"] == "sdpa" and not compact,
                                    f"attention {metrics['train/attention']}, compact {compact}"))
    box.gpu_part("offline: peak GPU memory recorded", 1, lambda: (
        metrics.get("train/peak_gpu_mb", 0) > 0, f"{metrics.get('train/peak_gpu_mb')} MB"))
    tokenizer = AutoTokenizer.from_pretrained(work / "train" / "adapter")
    adapter_reloads("offline", work / "train" / "adapter",
                    trained_model_facts(trained, tokenizer), args.model)


def several_gpus(work: Path, args, box: Box) -> None:
    run = run_dir(work, "several", 1, [f"policy.model={args.model}", "dpo.max_steps=2", *TRAIN])
    code, probes = run_child(work / "probe", ["train", str(run)], timeout=args.timeout)
    probe = probes[0] if probes else {}
    peaks = [round(mb) for mb in probe.get("peak_gpu_mb", [])]
    devices = probe.get("trained", {}).get("devices")
    R.check("several_gpus: `wim train` in a child that sees every GPU, no launcher, trains on "
            "the first only", code == 0 and probe.get("visible_gpus") == box.gpus
            and devices == ["cuda:0"] and not any(peaks[1:]),
            f"exit {code}, {probe.get('visible_gpus')} GPUs seen, model on {devices}, peak MB "
            f"per GPU {peaks}")


def online(work: Path, args, box: Box) -> None:
    out = work / "run"
    sets = [f"policy.model={args.model}", "training.mode=online", "dpo.max_steps=2",
            "prompts.limit=4", "prompts.holdout=0", "training.online_max_new_tokens=24",
            "judge.max_new_tokens=48", "dpo.per_device_train_batch_size=2",
            "training.gradient_checkpointing=true"]
    code, probes = run_child(work / "probe", ["run", str(QUICKSTART), "--out", str(out),
                                              *[a for s in sets for a in ("--set", s)]],
                             timeout=args.timeout)
    probe = probes[0] if probes else {}
    metrics = (json.loads((out / "train/metrics.json").read_text())
               if (out / "train/metrics.json").is_file() else {})
    R.check("online: two steps through `wim run`, in a child that sees every GPU",
            code == 0 and metrics.get("train/steps") == 2,
            f"exit {code}, steps {metrics.get('train/steps')}")
    calls = probe.get("sampling", [])
    lengths = [c["forward_lengths"] for c in calls]
    cached = bool(calls) and all(len(n) >= 2 and n[0] > 1 and set(n[1:]) == {1} for n in lengths)
    R.check("online: samples with its KV cache while checkpointing (each sampling forward after "
            "the prompt's takes one new token)",
            cached and all(c["checkpointing"] for c in calls),
            f"{len(calls)} sampling calls, checkpointing {[c['checkpointing'] for c in calls]}, "
            f"use_cache {[c['use_cache'] for c in calls]}, forward input lengths of the first "
            f"{(lengths or [[]])[0][:6]}...")
    peaks = [round(mb) for mb in probe.get("peak_gpu_mb", [])]
    box.gpu_part("online: nothing runs on the other GPUs", 2,
                 lambda: (len(peaks) >= 2 and not any(peaks[1:]), f"peak MB per GPU {peaks}"))


@contextlib.contextmanager
def as_machine(machine):
    """wim's dtype rule sees `machine` instead of this one (to write a run directory as it)."""
    import wim.precision
    import wim.rundir

    saved = wim.precision.machine, wim.rundir.machine
    wim.precision.machine = wim.rundir.machine = lambda: machine
    try:
        yield
    finally:
        wim.precision.machine, wim.rundir.machine = saved


def elsewhere(work: Path, args, box: Box) -> None:
    """A run directory begun with `policy.dtype: auto` on the other kind of machine (here
    bfloat16: an AVX2 CPU driver, which pins float32), trained here through `wim train`."""
    import yaml

    from wim.precision import Machine, resolve_dtype
    from wim.rundir import RunDir

    here = resolve_dtype("auto")
    if here == "bfloat16":
        other, label = Machine(False, False, "AVX2", False, False), "an AVX2 CPU driver"
    else:
        other, label = Machine(True, True, "AVX512", False, False), "an Ampere GPU box"
    with as_machine(other):
        run = run_dir(work, "run", 1, [f"policy.model={args.model}", "policy.dtype=auto",
                                       "dpo.max_steps=2", *TRAIN])
    pinned = yaml.safe_load(RunDir(run).config_file.read_text())["config"]["policy"]["dtype"]
    code, _ = run_child(work / "probe", ["train", str(run)], timeout=args.timeout)
    metrics = (json.loads((run / "train/metrics.json").read_text())
               if (run / "train/metrics.json").is_file() else {})
    got = (metrics.get("train/compute_dtype"), metrics.get("train/base_dtype"))
    R.check(f"elsewhere: a run directory made by {label} (auto pinned to {pinned}) trains here "
            f"in {here} through `wim train`", pinned != here and code == 0
            and got == (here, here), f"exit {code}, compute {got[0]}, base {got[1]}, LoRA "
            f"{metrics.get('train/lora_dtype')}")


def qlora(work: Path, args, box: Box) -> None:
    from training.train import train_dpo_model
    from wim.config import load_config

    cfg = load_config(QUICKSTART, [f"policy.model={args.model}", f"dpo.max_steps={args.steps}",
                                   "training.load_in_4bit=true", *TRAIN])
    write_pairs(work / "pairs.jsonl", 2)
    metrics, _ = train_dpo_model(cfg, work / "pairs.jsonl", work / "train", progress=False)
    R.check("qlora: LoRA weights float32, loss falls",
            metrics["train/lora_dtype"] == "float32"
            and metrics["train/loss_last"] < metrics["train/loss_first"],
            f"lora {metrics['train/lora_dtype']}, loss {metrics['train/loss_first']:.4f} -> "
            f"{metrics['train/loss_last']:.4f}")


def launched(work: Path, args, box: Box, kind: str) -> None:
    """`accelerate launch` of `wim train DIR` (kind: ddp, qlora_ddp or zero3) on every GPU (a
    dry run: 2 CPU processes; ZeRO-3 on one GPU still partitions every parameter)."""
    processes = 2 if box.cpu else args.ddp or box.gpus
    overrides = [f"policy.model={args.model}", "dpo.max_steps=4", *TRAIN]
    overrides += {"zero3": [f"lora.target_modules=[{','.join(ALL_PROJECTIONS)}]"],
                  "qlora_ddp": ["training.load_in_4bit=true"]}.get(kind, [])
    run = run_dir(work, "run", 2, overrides)
    config = ROOT / "configs/accelerate" / ("ddp_cpu.yaml" if box.cpu else "ddp.yaml")
    extra: list[str] = []
    if kind == "zero3":
        # Threshold 0: every parameter is partitioned, as LoRA tensors of a 7B model are.
        ds = {"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
              "bf16": {"enabled": "auto"}, "train_micro_batch_size_per_gpu": "auto",
              "gradient_accumulation_steps": "auto", "gradient_clipping": 1.0}
        (work / "ds.json").write_text(json.dumps(ds))
        # Mixed precision named here: taken from ddp.yaml, accelerate refuses it beside a
        # DeepSpeed config file ("the following accelerate config variables will be ignored").
        extra = ["--use_deepspeed", "--deepspeed_config_file", str(work / "ds.json"),
                 "--zero3_init_flag", "true", "--mixed_precision", "bf16"]
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
                "--num_processes", str(processes), "--main_process_port", str(free_port()),
                *extra]
    code, probes = run_child(work / "probe", ["train", str(run)], launcher, args.timeout)
    ranks = [json.loads(p.read_text()) for p in sorted((run / "train/ranks").glob("*.json"))]
    sums = [r["lora_checksum"] for r in ranks]
    R.check(f"{kind}: {processes} ranks stepped alike", code == 0 and len(ranks) == processes
            and len({r["steps"] for r in ranks}) == 1
            and max(sums) - min(sums) <= 1e-6 * max(1.0, max(sums)),
            f"exit {code}, steps {[r['steps'] for r in ranks]}, LoRA checksums {sums}")
    trained = [p.get("trained", {}) for p in probes]
    four_bit = kind == "qlora_ddp"
    box.gpu_part(f"{kind}: each rank's {'4-bit ' if four_bit else ''}model on its own GPU",
                 processes, lambda: (
                     [t.get("devices") for t in trained]
                     == [[f"cuda:{i}"] for i in range(processes)]
                     and all(t.get("loaded_in_4bit") == four_bit for t in trained),
                     f"devices {[t.get('devices') for t in trained]}, 4-bit "
                     f"{[t.get('loaded_in_4bit') for t in trained]}"))
    adapter = run / "train/adapter"
    if kind == "zero3":
        from safetensors.torch import load_file

        tensors = load_file(str(adapter / "adapter_model.safetensors"))
        R.check("zero3: every saved LoRA tensor is whole (2-D, non-empty)", bool(tensors) and all(
            t.dim() == 2 and t.numel() > 0 for t in tensors.values()),
            f"{len(tensors)} tensors, shapes {sorted({tuple(t.shape) for t in tensors.values()})}")
    if not four_bit:
        adapter_reloads(kind, adapter, trained[0], args.model)


ROW_FUNCTIONS = {"offline": offline, "several_gpus": several_gpus, "online": online,
                 "elsewhere": elsewhere, "qlora": qlora,
                 "ddp": lambda w, a, b: launched(w, a, b, "ddp"),
                 "qlora_ddp": lambda w, a, b: launched(w, a, b, "qlora_ddp"),
                 "zero3": lambda w, a, b: launched(w, a, b, "zero3")}


def run_row(name: str, work: Path, args, box: Box) -> None:
    """One row; an error in it is a FAIL naming the error, and the next row still runs."""
    import gc

    import torch

    why_not = box.cannot_run(name)
    if why_not:
        R.line("GPU" if box.cpu else "SKIP", name, f"{ROWS[name][0]}: {why_not}")
        return
    (work / name).mkdir()
    try:
        ROW_FUNCTIONS[name](work / name, args, box)
    except Exception as err:  # noqa: BLE001 - reported, and the other rows still run
        traceback.print_exc()
        R.line("FAIL", f"{name}: stopped by an error", f"{type(err).__name__}: {err}"[:400])
    finally:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        return child(Path(sys.argv[2]), sys.argv[3:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bundled:smollm2-135m-instruct")
    parser.add_argument("--steps", type=int, default=8, help="in-process training steps")
    parser.add_argument("--ddp", type=int, default=0, metavar="N",
                        help="processes for the launched rows (default: every visible GPU)")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"of {', '.join(ROWS)}")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per child process")
    parser.add_argument("--cpu", action="store_true", help="a dry run on the CPU")
    args = parser.parse_args()
    rows = args.rows.split(",")
    if unknown := set(rows) - set(ROWS):
        parser.error(f"unknown rows {sorted(unknown)}; the rows are {', '.join(ROWS)}")
    if args.cpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the dry run and its children stay on the CPU
    sys.path.insert(0, str(ROOT))
    import torch

    box = Box(args.cpu)
    if not box.cpu and not box.gpus:
        print("gpu_check: no CUDA GPU visible (run with --cpu for a dry run on the CPU)")
        return 1
    where = (", ".join(torch.cuda.get_device_name(i) for i in range(box.gpus)) if box.gpus
             else "CPU (dry run)")
    print(f"gpu_check on {where}; torch {torch.__version__}; model {args.model}; "
          f"bitsandbytes {box.has['bitsandbytes']}, deepspeed {box.has['deepspeed']}")
    for name, (what, on_cpu) in ROWS.items():
        print(f"  row {name:<13}{what}  [CPU: {on_cpu}]")
    with tempfile.TemporaryDirectory() as tmp:
        for name in rows:
            run_row(name, Path(tmp), args, box)
    line, code = R.summary(box.cpu)
    print(line, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
