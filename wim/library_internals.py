"""Every private or deep name of torch, transformers, TRL and peft that wim relies on, in one
list: where it lives, the parameters we pass it, and who uses it.

These names carry no promise across releases. `tests/test_library_internals.py` imports each one
from the installed version and checks that it still takes what we pass, so an upgrade that
renames or reshapes one fails that fast test by name, not a number in a slow test (or, for an
override such as `_precompute_ref_logps`, nothing at all: TRL would silently stop calling it).
Adding a use of a library internal means adding it here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Internal:
    path: str
    """`module:attribute.chain`, importable as written."""
    params: tuple[str, ...] | None
    """Parameter names we pass (a callable must accept each); None: not called, only used."""
    used_by: str


INTERNALS: tuple[Internal, ...] = (
    # torch
    Internal("torch.cpu:_is_amx_tile_supported", (), "wim/precision.py"),
    Internal("torch.cpu:_is_avx512_bf16_supported", (), "wim/precision.py"),
    # transformers
    Internal("transformers:GenerationConfig._get_default_generation_params", (),
             "wim/backends/decode.py"),
    Internal("transformers:PretrainedConfig._attn_implementation", None,
             "training/cpu_attention.py (read on a model's config)"),
    Internal("transformers.generation.logits_process:TopPLogitsWarper", ("top_p",),
             "wim/backends/decode.py"),
    Internal("transformers.generation.logits_process:TemperatureLogitsWarper", ("temperature",),
             "wim/backends/decode.py"),
    Internal("transformers.masking_utils:AttentionMaskInterface.register", ("key", "value"),
             "wim/backends/decode_attention.py, training/cpu_attention.py"),
    Internal("transformers.masking_utils:sdpa_mask", None, "wim/backends/decode_attention.py"),
    Internal("transformers.masking_utils:eager_mask", None, "training/cpu_attention.py"),
    Internal("transformers.integrations.sdpa_attention:sdpa_attention_forward",
             ("module", "query", "key", "value", "attention_mask"),
             "wim/backends/decode_attention.py"),
    Internal("transformers.trainer_utils:get_last_checkpoint", ("folder",), "training/train.py"),
    Internal("transformers.integrations:is_deepspeed_zero3_enabled", (), "training/train.py"),
    # TRL
    Internal("trl:DPOTrainer._precompute_ref_logps", ("self", "dataset", "name", "batch_size"),
             "training/dpo_trainer.py (overridden: puts the compact head on first)"),
    Internal("trl.trainer.utils:add_fused_lm_head", ("model", "outputs"),
             "training/cpu_head.py (the forward it patches takes fused_lm_head=)"),
    Internal("trl.trainer.utils:FusedCausalLMOutput", ("loss", "log_probs", "entropy"),
             "training/cpu_head.py"),
    Internal("trl.kernels:ChunkedLogProbFunction", None,
             "training/cpu_logprobs.py (the quantity it reproduces)"),
    Internal("trl.experimental.online_dpo:OnlineDPOConfig", None, "training/online.py"),
    Internal("trl.experimental.online_dpo:OnlineDPOTrainer", None, "training/online_trainer.py"),
    Internal("trl.experimental.online_dpo:OnlineDPOTrainer._generate",
             ("self", "model", "prompts"), "training/online_trainer.py"),
    Internal("trl.experimental.online_dpo:OnlineDPOTrainer._forward",
             ("self", "model", "prompt_ids", "prompt_mask", "completion_ids", "completion_mask"),
             "training/online_trainer.py"),
    Internal("trl.experimental.online_dpo:OnlineDPOTrainer._calculate_rewards_from_functions",
             ("self", "prompts", "completions", "completion_ids_list"),
             "training/online_trainer.py"),
    Internal("trl.experimental.utils:empty_cache", (), "training/online_trainer.py"),
    Internal("trl.data_utils:is_conversational", ("example",), "training/online_trainer.py"),
    # peft
    Internal("peft.tuners.tuners_utils:BaseTunerLayer", None,
             "wim/backends/transformers_backend.py"),
    Internal("peft.helpers:disable_input_dtype_casting", ("model",), "training/train.py"),
)


def problems(internal: Internal) -> list[str]:
    """What no longer holds for one internal in the installed versions ([] when all holds)."""
    import inspect
    import pkgutil

    try:  # `module:attr.chain` is pkgutil's form; ImportError / AttributeError when it is gone
        obj = pkgutil.resolve_name(internal.path)
    except (ImportError, AttributeError) as exc:
        return [f"{internal.path} is gone ({type(exc).__name__}: {exc}); used by "
                f"{internal.used_by}"]
    if internal.params is None:
        return []
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return [f"{internal.path} has no signature to check; used by {internal.used_by}"]
    names = signature.parameters
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in names.values())
    missing = [p for p in internal.params if p not in names and not takes_kwargs]
    if missing:
        return [f"{internal.path}{signature} no longer takes {', '.join(missing)}; used by "
                f"{internal.used_by}"]
    return []
