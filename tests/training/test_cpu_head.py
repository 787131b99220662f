"""training/cpu_head.py on the bundled SmolLM2-135M inside a real trl.DPOTrainer: the compact head
gives TRL's loss, gradients and logged metrics, while its kernel sees only completion tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import GOOD_VS_GARBAGE, QUICKSTART, write_pair_rows


def _trainer(tmp_path: Path, compact: bool):
    import torch
    from trl import DPOTrainer

    from training.cpu_head import use_compact_head
    from training.train import _dpo_args, _load_pairs, lora_config
    from wim.config import load_config
    from wim.models import load_causal_lm

    cfg = load_config(QUICKSTART, ["policy.dtype=float32", "dpo.max_steps=1",
                                   "dpo.save_steps=0", "dpo.per_device_train_batch_size=4",
                                   "dpo.reference_pass=per_step"])
    write_pair_rows(tmp_path / "pairs.jsonl", GOOD_VS_GARBAGE[:4])
    model, tokenizer = load_causal_lm(cfg.policy.model, dtype="float32")
    trainer = DPOTrainer(model=model, args=_dpo_args(cfg, tmp_path / f"t{compact}", False, 4),
                         train_dataset=_load_pairs(tmp_path / "pairs.jsonl"),
                         processing_class=tokenizer, peft_config=lora_config(cfg))
    # A fresh adapter's B is zero: the policy equals the reference, rewards are rounding noise
    # and A gets no gradient. The same seeded B in both trainers makes them differ.
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in trainer.model.named_parameters():
            if "lora_B" in name:
                param.copy_(0.05 * torch.randn(param.shape, generator=generator))
    if compact:
        assert use_compact_head(trainer)  # on this CPU: no Triton
    return trainer


def _step(trainer):
    """One batch through TRL's own loss (policy and reference pass), then backward."""
    batch = next(iter(trainer.get_train_dataloader()))
    trainer.model.train()
    loss = trainer.compute_loss(trainer.model, batch)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    return batch, float(loss), grads, metrics


def _count_kernel_rows(monkeypatch) -> list[int]:
    """From now on, the rows of hidden states our kernel is handed, one entry per call."""
    import training.cpu_logprobs

    rows: list[int] = []
    kernel = training.cpu_logprobs.completion_log_probs

    def counted(hidden, *args):
        rows.append(len(hidden))
        return kernel(hidden, *args)

    monkeypatch.setattr(training.cpu_logprobs, "completion_log_probs", counted)
    return rows


def test_compact_head_equals_trls_and_scores_only_completions(tmp_path, monkeypatch) -> None:
    _, loss, grads, metrics = _step(_trainer(tmp_path, compact=False))

    rows = _count_kernel_rows(monkeypatch)
    batch, compact_loss, compact_grads, compact_metrics = _step(_trainer(tmp_path, compact=True))

    assert compact_loss == pytest.approx(loss, abs=1e-6) and abs(loss - 0.6931) > 1e-3
    assert grads.keys() == compact_grads.keys() and grads  # the LoRA weights, A and B
    assert all(grad.abs().max() > 0 for grad in grads.values())
    for name, grad in grads.items():
        assert (compact_grads[name] - grad).abs().max() <= 1e-5 * grad.abs().max() + 1e-7, name
    assert compact_metrics.keys() == metrics.keys()
    for key, value in metrics.items():
        assert compact_metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    # Policy and reference pass each score exactly the completion tokens (the labels that
    # count), not the batch's batch x length positions.
    completion = int(batch["completion_mask"][:, 1:].sum())
    positions = batch["input_ids"][:, 1:].numel()
    assert sum(rows) == 2 * completion < 2 * positions


def test_a_batch_without_completion_tokens_still_has_a_graph(tmp_path) -> None:
    import torch

    trainer = _trainer(tmp_path, compact=True)
    model = trainer.model
    ids = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids),
                labels=torch.full_like(ids, -100), fused_lm_head=True)
    assert out.log_probs.shape == (2, 3) and not out.log_probs.any()
    out.loss.backward()  # zero, but connected to the weights


def test_models_that_scale_their_logits_keep_trls_head() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from training.cpu_head import score_completions_only

    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2)
    config.logit_scale = 0.5
    model = LlamaForCausalLM(config)
    forward = model.forward
    assert score_completions_only(model, ("log_probs",)) is False
    assert model.forward == forward


def test_the_precomputed_reference_comes_from_the_compact_head(tmp_path, monkeypatch) -> None:
    """TRL runs the reference pass inside DPOTrainer.__init__, before a caller can touch the
    trainer: WimDPOTrainer scores it with completion tokens only, to TRL's values."""
    import shutil

    import torch
    from torch.utils.data import DataLoader
    from trl import DPOTrainer

    from training.dpo_trainer import WimDPOTrainer
    from training.train import _dpo_args, _load_pairs, lora_config
    from wim.config import load_config
    from wim.models import load_causal_lm

    cfg = load_config(QUICKSTART, ["policy.dtype=float32", "dpo.save_steps=0",
                                   "dpo.reference_pass=precompute"])
    write_pair_rows(tmp_path / "pairs.jsonl", GOOD_VS_GARBAGE[:6])
    (tmp_path / "b").mkdir()  # a second file: TRL caches the pass by the dataset's fingerprint
    shutil.copy(tmp_path / "pairs.jsonl", tmp_path / "b" / "pairs.jsonl")
    rows = _count_kernel_rows(monkeypatch)  # TRL's own trainer never calls our kernel
    trainers = {}
    for name, cls, pairs in (("trl", DPOTrainer, tmp_path / "pairs.jsonl"),
                             ("ours", WimDPOTrainer, tmp_path / "b" / "pairs.jsonl")):
        model, tokenizer = load_causal_lm(cfg.policy.model, dtype="float32")
        trainers[name] = cls(model=model, args=_dpo_args(cfg, tmp_path / name, False, 6),
                             train_dataset=_load_pairs(pairs), processing_class=tokenizer,
                             peft_config=lora_config(cfg))
    ours, trl = trainers["ours"].train_dataset, trainers["trl"].train_dataset
    for column in ("ref_chosen_logps", "ref_rejected_logps"):
        torch.testing.assert_close(torch.tensor(ours[column]), torch.tensor(trl[column]),
                                   rtol=1e-5, atol=1e-4)
    loader = DataLoader(ours, batch_size=6, collate_fn=trainers["ours"].data_collator)
    completion = sum(int(batch["completion_mask"][:, 1:].sum()) for batch in loader)
    assert sum(rows) == completion > 0  # every chosen and rejected completion token, once
