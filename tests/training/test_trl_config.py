"""training/trl_config.py as both modes use it: every `dpo:` key reaches trl.DPOConfig
(offline, training.train._dpo_args) and OnlineDPOConfig (online, `online_dpo_config`) or
is refused by name; `dpo.extra` is checked against the class of the mode; nothing is dropped."""

from __future__ import annotations

import dataclasses
import os

import pytest
from conftest import QUICKSTART

from training.train import _dpo_args
from training.trl_config import online_dpo_config
from wim.config import ConfigError, load_config
from wim.config.dpo import DPOSection

ONLINE = ["training.mode=online"]
PAIRS = 48  # the quickstart's 30 steps x 4 see 48 pairs more than once: `auto` precomputes
REFUSED = "refused"

# For every DPOSection field: a value that is neither its default nor the quickstart's, and
# (attribute of TRL's config, expected value) or REFUSED.
CHANGED = {
    "offline": {
        "learning_rate": ("1e-3", "learning_rate", 1e-3),
        "beta": ("0.3", "beta", 0.3),
        "max_steps": ("11", "max_steps", 11),
        "per_device_train_batch_size": ("3", "per_device_train_batch_size", 3),
        "gradient_accumulation_steps": ("2", "gradient_accumulation_steps", 2),
        "max_length": ("77", "max_length", 77),
        "logging_steps": ("2", "logging_steps", 2),
        "save_steps": ("7", "save_steps", 7),
        "reference_pass": ("per_step", "precompute_ref_log_probs", False),
        "extra": ("{weight_decay: 0.01}", "weight_decay", 0.01),
    },
    "online": {
        "learning_rate": ("1e-3", "learning_rate", 1e-3),
        "beta": ("0.3", "beta", 0.3),  # a list [0.3] in, one number after __post_init__
        "max_steps": ("11", "max_steps", 11),
        "per_device_train_batch_size": ("3", "per_device_train_batch_size", 3),
        "gradient_accumulation_steps": ("2", "gradient_accumulation_steps", 2),
        "max_length": ("77", "max_length", 77),
        "logging_steps": ("2", "logging_steps", 2),
        "save_steps": ("7", REFUSED, None),
        "reference_pass": ("precompute", REFUSED, None),
        "extra": ("{weight_decay: 0.01}", "weight_decay", 0.01),
    },
}


def trl_args(mode: str, overrides: list[str], tmp_path):
    """TRL's config as the run builds it, from the quickstart with `overrides` (--set)."""
    if mode == "online":
        return online_dpo_config(load_config(QUICKSTART, [*ONLINE, *overrides]), tmp_path, False)
    return _dpo_args(load_config(QUICKSTART, overrides), tmp_path, False, PAIRS)


@pytest.mark.parametrize("mode", ["offline", "online"])
@pytest.mark.parametrize("key", [f.name for f in dataclasses.fields(DPOSection)])
def test_every_dpo_key_reaches_trl_or_is_refused_by_name(mode, key, tmp_path) -> None:
    assert key in CHANGED[mode], f"dpo.{key} is new: add where it goes in {mode} mode to CHANGED"
    value, attribute, expected = CHANGED[mode][key]
    override = [f"dpo.{key}={value}"]
    cfg = load_config(QUICKSTART, override)
    assert getattr(cfg.dpo, key) != getattr(DPOSection(), key)  # set, not the default
    if attribute == REFUSED:
        with pytest.raises(ConfigError, match=f"dpo.{key}"):
            trl_args(mode, override, tmp_path)
        return
    assert getattr(trl_args(mode, [], tmp_path), attribute) != expected  # the change shows
    assert getattr(trl_args(mode, override, tmp_path), attribute) == expected


def test_online_takes_the_values_that_say_what_it_does(tmp_path) -> None:
    args = trl_args("online", ["dpo.save_steps=0", "dpo.reference_pass=per_step"], tmp_path)
    assert args.save_strategy == "no"


def test_extra_reaches_online_dpo_config(tmp_path) -> None:
    args = trl_args("online", ["dpo.extra={weight_decay: 0.01, warmup_steps: 2}"], tmp_path)
    assert (args.weight_decay, args.warmup_steps) == (0.01, 2)


@pytest.mark.parametrize(("mode", "target"), [("offline", "trl.DPOConfig"),
                                              ("online", "OnlineDPOConfig")])
def test_unknown_extra_key_is_refused_naming_it_and_the_class(mode, target, tmp_path) -> None:
    with pytest.raises(ConfigError, match=f"dpo.extra: 'warmup_ratioo' is not .*{target}"):
        trl_args(mode, ["dpo.extra={warmup_ratioo: 0.1}"], tmp_path)


def test_extra_key_of_the_other_mode_is_refused(tmp_path) -> None:
    """label_smoothing is a DPOConfig field that OnlineDPOConfig lacks."""
    assert trl_args("offline", ["dpo.extra={label_smoothing: 0.1}"], tmp_path
                    ).label_smoothing == 0.1
    with pytest.raises(ConfigError, match="'label_smoothing' is not .*OnlineDPOConfig"):
        trl_args("online", ["dpo.extra={label_smoothing: 0.1}"], tmp_path)


@pytest.mark.parametrize(("extra", "own_key"), [
    ("{beta: 0.3}", "dpo.beta"),
    ("{max_new_tokens: 9}", "training.online_max_new_tokens"),
    ("{temperature: 0.5}", "training.online_temperature"),
    ("{top_p: 0.5}", "generation.top_p"),
])
def test_online_extra_key_that_has_its_own_key_is_refused(extra, own_key, tmp_path) -> None:
    with pytest.raises(ConfigError, match=f"has its own key; set {own_key}"):
        trl_args("online", [f"dpo.extra={extra}"], tmp_path)


def test_online_sampling_settings_reach_online_dpo_config(tmp_path) -> None:
    args = trl_args("online", ["training.online_max_new_tokens=9",
                               "training.online_temperature=0.5", "generation.top_p=0.8"],
                    tmp_path)
    assert (args.max_new_tokens, args.temperature, args.top_p) == (9, 0.5, 0.8)
    assert (args.loss_type, args.save_strategy) == ("sigmoid", "no")


def test_both_modes_take_the_shared_settings_alike(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("WANDB_PROJECT", "restored after the test")
    shared = ["seed=5", "training.gradient_checkpointing=true", "wandb.enabled=true",
              "wandb.project=wim-shared"]
    built = {}
    for mode in ("offline", "online"):
        monkeypatch.delenv("WANDB_PROJECT")
        built[mode] = trl_args(mode, shared, tmp_path)
        assert os.environ["WANDB_PROJECT"] == "wim-shared"  # read by the wandb callback
    for attribute in ("output_dir", "seed", "use_cpu", "bf16", "activation_checkpointing",
                      "report_to", "disable_tqdm", "n_gpu"):
        assert getattr(built["offline"], attribute) == getattr(built["online"], attribute)
    assert (built["online"].seed, built["online"].report_to) == (5, ["wandb"])
    assert built["online"].activation_checkpointing and built["online"].disable_tqdm
