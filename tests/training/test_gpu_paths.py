"""What a CPU can show of the training path on a GPU box: one GPU per process without a
launcher, each rank's own GPU for a 4-bit model, float32 LoRA weights on a quantized base,
sampling with a KV cache while online DPO checkpoints, a resumed rank's initial weights, and
online DPO refused under a launcher. tests/gpu_check.py runs the rest on a real GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import GOOD_VS_GARBAGE, QUICKSTART, write_pair_rows

from wim.config import load_config


def _tiny_llama(dtype=torch.float32, vocab_size: int = 64):
    """A randomly initialised two-layer Llama (no download, under a second)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64,
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


def _bundled_tokenizer():
    from transformers import AutoTokenizer

    from wim.models import BUNDLED_POLICY, resolve_causal_lm

    return AutoTokenizer.from_pretrained(resolve_causal_lm(BUNDLED_POLICY))


def test_lora_on_a_quantized_base_trains_in_float32(tmp_path: Path) -> None:
    """QLoRA through `train_dpo_model`: TRL casts the trainable weights of a quantized base to
    bfloat16, where AdamW's step at DPO's learning rate (5e-7, the paper's) is under half an
    ulp of a LoRA A weight, so A never moves. wim casts them back before the optimizer exists:
    after two steps (B is zero at the first, so A's gradient is too) most A weights moved.
    A CPU has no bitsandbytes kernels: the tiny bfloat16 base carries the flag transformers sets
    on a bitsandbytes model (8-bit's: TRL and wim treat it as 4-bit's, and transformers' parameter
    count imports bitsandbytes for 4-bit's only); TRL's cast and wim's training are the real
    ones."""
    from training.train import train_dpo_model

    tokenizer = _bundled_tokenizer()
    base = _tiny_llama(torch.bfloat16, vocab_size=len(tokenizer))
    base.is_loaded_in_8bit = True  # what transformers sets on a bitsandbytes 8-bit model
    cfg = load_config(QUICKSTART, ["policy.dtype=bfloat16", "dpo.learning_rate=5e-7",
                                   "dpo.max_steps=2", "dpo.per_device_train_batch_size=2",
                                   "dpo.max_length=64", "dpo.save_steps=0",
                                   "lora.target_modules=[q_proj,v_proj]"])
    write_pair_rows(tmp_path / "pairs.jsonl", GOOD_VS_GARBAGE[:4])
    metrics, trained = train_dpo_model(cfg, tmp_path / "pairs.jsonl", tmp_path / "train",
                                       progress=False, lm=(base, tokenizer))
    assert metrics["train/steps"] == 2 and metrics["train/compute_dtype"] == "bfloat16"
    assert metrics["train/lora_dtype"] == "float32"
    start = torch.load(tmp_path / "train/trainer/lora_init.pt")
    a_weights = {n: p for n, p in trained.named_parameters() if "lora_A" in n}
    assert a_weights
    for name, weight in a_weights.items():
        moved = (weight.detach().cpu() != start[name]).float().mean()
        assert moved > 0.5, f"{name}: {moved:.0%} of its weights moved"


def test_online_dpo_samples_with_a_kv_cache_while_checkpointing(tmp_path: Path) -> None:
    """One step of wim's online trainer, built as online_run builds it, with gradient
    checkpointing on. TRL then samples without a KV cache (every new token re-reads the whole
    sequence: several times slower); wim's generation settings keep the cache. Seen in the
    model's forwards while sampling: after the prompt, one new token each."""
    import datasets

    from training.online_trainer import PairChoice, WimOnlineDPOTrainer
    from training.train import lora_config
    from training.trl_config import online_dpo_config

    new_tokens = 6
    cfg = load_config(QUICKSTART, ["training.gradient_checkpointing=true", "policy.dtype=float32",
                                   f"training.online_max_new_tokens={new_tokens}",
                                   "dpo.max_steps=1", "dpo.per_device_train_batch_size=1",
                                   "lora.target_modules=[q_proj,v_proj]"])
    tokenizer = _bundled_tokenizer()
    model = _tiny_llama(vocab_size=len(tokenizer))

    class Reward:
        """Stands in for WimReward (a judge and an embedder): equal scores, the pair kept."""
        __name__ = "reward"

        def __call__(self, prompts, completions, **kwargs):
            return [0.0] * len(prompts)

        def take_choice(self):
            return PairChoice(first_chosen=[True], keep=[True])

    args = online_dpo_config(cfg, tmp_path, progress=False)
    trainer = WimOnlineDPOTrainer(
        model=model, reward_funcs=[Reward()], args=args, processing_class=tokenizer,
        train_dataset=datasets.Dataset.from_list([{"prompt": "What do bees make?"}]),
        peft_config=lora_config(cfg))
    sampled = []  # the length of each forward's input while sampling (no gradient)
    model.model.embed_tokens.register_forward_pre_hook(
        lambda module, args: sampled.append(args[0].shape[1])
        if not torch.is_grad_enabled() else None)
    trainer.train()
    assert trainer.state.global_step == 1 and args.gradient_checkpointing
    prompt, *decoded = sampled[:new_tokens]
    assert prompt > 1 and decoded == [1] * (new_tokens - 1), sampled


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
