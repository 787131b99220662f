"""`wim export DIR --merged OUT`: an ordinary transformers model that generates like base +
adapter."""

from __future__ import annotations

import shutil
from pathlib import Path

from conftest import QUICKSTART, run_wim

PROMPT = [{"role": "user", "content": "How many legs does a spider have?"}]


def _greedy(model, tokenizer) -> str:
    import torch

    ids = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, return_tensors="pt",
                                        return_dict=True)
    with torch.inference_mode():
        out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    return tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)


def test_export_merged_generates_like_base_plus_adapter(trained_adapter: Path,
                                                        tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from wim.config import load_config
    from wim.models import load_causal_lm
    from wim.rundir import RunDir

    run = RunDir(tmp_path / "run")
    run.claim(load_config(QUICKSTART))
    shutil.copytree(trained_adapter, run.path / "train" / "adapter")
    out = tmp_path / "merged"
    run_wim(["export", str(run.path), "--merged", str(out)])
    assert (out / "config.json").is_file() and not (out / "adapter_config.json").exists()

    merged = AutoModelForCausalLM.from_pretrained(out)  # no peft involved
    tokenizer = AutoTokenizer.from_pretrained(out)
    text = _greedy(merged, tokenizer)
    # float32 like the merged weights: the greedy texts of two paths are compared.
    base, base_tok = load_causal_lm("bundled:smollm2-135m-instruct", dtype="float32")
    assert text != _greedy(base, base_tok)  # the adapter is in the weights
    with_adapter = PeftModel.from_pretrained(base, str(trained_adapter))
    assert text == _greedy(with_adapter, base_tok)
    assert text.strip()

    again = run_wim(["export", str(run.path), "--merged", str(out)], check=False)
    assert again.returncode == 2 and "not empty" in again.stderr
