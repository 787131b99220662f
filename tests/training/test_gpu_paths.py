"""What a CPU can show of the training path on a GPU box: one GPU per process without a
launcher, each rank's own GPU for a 4-bit model, float32 LoRA weights on a quantized base,
sampling with a KV cache while online DPO checkpoints, a resumed rank's initial weights, and
online DPO refused under a launcher. tests/gpu_check.py runs the rest on a real GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import QUICKSTART

from wim.config import load_config


def _tiny_llama(dtype=torch.float32):
    """A randomly initialised two-layer Llama (no download, under a second)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2)
    return LlamaForCausalLM(config).to(dtype)


@pytest.fixture
def four_gpus(monkeypatch):
    """torch sees four CUDA GPUs (nothing runs on them: the test only builds arguments)."""
    from accelerate.state import AcceleratorState

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def test_several_gpus_without_a_launcher_train_on_one(four_gpus, tmp_path: Path) -> None:
    """Without the pin, transformers reports n_gpu 4: TRL's DPO then refuses nn.DataParallel,
    and online DPO silently runs on it."""
    from training.train import _dpo_args
    from training.trl_config import online_dpo_config

    cfg = load_config(QUICKSTART, ["policy.dtype=float32"])
    offline = _dpo_args(cfg, tmp_path / "offline", progress=False, n_pairs=8)
    assert offline.device.type == "cuda" and not offline.use_cpu
    assert offline.n_gpu == 1
    online = online_dpo_config(cfg, tmp_path / "online", progress=False)
    assert online.n_gpu == 1


def test_a_4bit_model_goes_to_this_ranks_gpu(monkeypatch) -> None:
    """QLoRA under DDP: rank 1 loads onto GPU 1, not GPU 0 (where accelerate refuses it). The
    loader is patched: bitsandbytes needs CUDA."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import wim.models as models

    seen = {}

    def loaded(path, **kwargs):
        seen.update(kwargs)
        return _tiny_llama()

    monkeypatch.setattr(models, "quantization_config", lambda four_bit: "4-bit")
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", loaded)
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", lambda path: None)
    for rank in (0, 1):
        monkeypatch.setenv("LOCAL_RANK", str(rank))
        models.load_causal_lm("some/llama", load_in_4bit=True, dtype="float32")
        assert seen["device_map"] == {"": rank} and seen["quantization_config"] == "4-bit"


def test_adam_at_dpo_learning_rates_cannot_move_a_bfloat16_weight() -> None:
    """Why the LoRA weights stay float32: one AdamW step at the paper's lr 5e-7 leaves a
    bfloat16 weight of LoRA's scale exactly as it was, and moves the float32 one."""
    torch.manual_seed(0)
    # LoRA A's scale (kaiming-uniform over 576 inputs: up to 0.04), away from zero, where a
    # bfloat16 step is as fine as float32's.
    start = (torch.rand(256) * 0.035 + 0.005) * torch.sign(torch.randn(256))
    grad = torch.randn(256)
    moved = {}
    for dtype in (torch.bfloat16, torch.float32):
        weight = torch.nn.Parameter(start.to(dtype).clone())
        optimizer = torch.optim.AdamW([weight], lr=5e-7, weight_decay=0.0)
        weight.grad = grad.to(dtype)
        optimizer.step()
        moved[dtype] = int((weight.detach() != start.to(dtype)).sum())
    assert moved[torch.bfloat16] == 0
    assert moved[torch.float32] == 256


def test_lora_on_a_quantized_base_goes_back_to_float32() -> None:
    """TRL casts the trainable weights of a quantized base to bfloat16 (as below);
    keep_lora_float32 restores float32 and leaves the frozen base as it is. On a base that is
    not quantized it changes nothing."""
    from peft import LoraConfig, get_peft_model

    from training.placement import keep_lora_float32

    for quantized in (True, False):
        base = _tiny_llama(torch.bfloat16)
        base.is_loaded_in_4bit = quantized  # what transformers sets on a bitsandbytes model
        model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
        for param in model.parameters():
            if param.requires_grad:
                param.data = param.data.to(torch.bfloat16)  # as TRL does for QLoRA
        keep_lora_float32(model)
        trained = {p.dtype for p in model.parameters() if p.requires_grad}
        frozen = {p.dtype for p in model.parameters() if not p.requires_grad}
        assert trained == ({torch.float32} if quantized else {torch.bfloat16})
        assert frozen == {torch.bfloat16}


def test_online_dpo_samples_with_a_kv_cache_while_checkpointing(tmp_path: Path) -> None:
    """TRL turns the cache off for sampling when gradient checkpointing is on (several times
    slower); wim's generation settings turn it back on."""
    from transformers import AutoTokenizer

    from training.online_trainer import WimOnlineDPOTrainer
    from training.trl_config import online_dpo_config
    from wim.models import BUNDLED_POLICY, resolve_causal_lm

    cfg = load_config(QUICKSTART, ["training.gradient_checkpointing=true", "policy.dtype=float32"])
    args = online_dpo_config(cfg, tmp_path, progress=False)
    assert args.gradient_checkpointing
    tokenizer = AutoTokenizer.from_pretrained(resolve_causal_lm(BUNDLED_POLICY))
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=32,
                                         intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2))
    import datasets

    class Reward:
        __name__ = "reward"

        def __call__(self, prompts, completions, **kwargs):
            return [0.0] * len(prompts)

        def take_choice(self):
            return None

    trainer = WimOnlineDPOTrainer(
        model=model, reward_funcs=[Reward()],
        args=args, processing_class=tokenizer,
        train_dataset=datasets.Dataset.from_list([{"prompt": "Hi"}]))
    assert trainer.generation_config.use_cache is True


def test_a_resumed_rank_loads_the_initial_weights_where_it_can(tmp_path: Path,
                                                             monkeypatch) -> None:
    """lora_init.pt is read onto the CPU (then each rank moves it to its own device); without
    map_location every rank would load it onto the GPU that saved it."""
    from training.train import _initial_lora

    path = tmp_path / "lora_init.pt"
    torch.save({"w": torch.ones(2)}, path)
    real_load = torch.load
    calls = []

    def load(*args, **kwargs):
        calls.append(kwargs.get("map_location"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", load)
    lora = {"w": torch.nn.Parameter(torch.zeros(2))}
    initial = _initial_lora(lora, path, resuming=True)
    assert calls == ["cpu"] and torch.equal(initial["w"], torch.ones(2))


def test_online_dpo_under_a_launcher_says_to_run_it_in_one_process(tmp_path: Path, capsys,
                                                                   monkeypatch) -> None:
    """Before: "only `wim train` runs under the launcher; build the pairs first", which online
    DPO has none of, and `wim train` on an online run then said to use `wim run`."""
    from wim.cli import main

    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["train", str(QUICKSTART), "--out", str(tmp_path / "run"),
                 "--set", "training.mode=online"]) == 2
    err = capsys.readouterr().err
    assert "runs in one process, not under accelerate launch" in err
    assert "build the pairs first" not in err and not (tmp_path / "run").exists()



def test_the_adapter_is_saved_from_gathered_weights_not_emptied_parameters(tmp_path: Path
                                                                          ) -> None:
    """ZeRO-3 leaves a partitioned LoRA tensor empty outside a forward. The adapter is written
    from the gathered copies (`gathered`, taken while the weights were whole), so peft writes
    the real tensors; saved from the parameters it writes zero-size ones (its warning is made
    an error here), and the next `wim eval` or round cannot load them."""
    import warnings

    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoTokenizer

    from training.placement import gathered, save_adapter
    from wim.models import BUNDLED_POLICY, resolve_causal_lm

    model = get_peft_model(_tiny_llama(), LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                                     init_lora_weights=False))
    lora = {n: p for n, p in model.named_parameters() if "lora_" in n}
    weights = gathered(lora)
    for param in lora.values():
        param.data = torch.empty(0)  # as ZeRO-3 leaves a partitioned parameter
    tokenizer = AutoTokenizer.from_pretrained(resolve_causal_lm(BUNDLED_POLICY))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        save_adapter(model, tokenizer, tmp_path / "adapter", weights)
    loaded = PeftModel.from_pretrained(_tiny_llama(), tmp_path / "adapter")
    reloaded = {n: p for n, p in loaded.named_parameters() if "lora_" in n}
    assert reloaded.keys() == weights.keys()
    for name, tensor in weights.items():
        assert torch.equal(reloaded[name], tensor), name
