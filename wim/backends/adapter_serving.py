"""LoRA adapters served by the policy's vLLM server (`http.adapter_serving: vllm`).

After a round's training the run registers the new adapter with every base URL
(`POST /v1/load_lora_adapter`, vLLM started with `--enable-lora` and
VLLM_ALLOW_RUNTIME_LORA_UPDATING=True); requests with `"model": <name>` then use it. The name
holds a hash of the run folder, the round and the first bytes of the adapter's sha256, so two
runs on one server never share a name, and a round trained again gets a new name rather than
the old weights. Registering a name the server already holds ("has already been loaded": a
resumed run) is fine.

The server reads the adapter folder itself: `http.server_paths` maps this machine's paths to
the server's view of them (a shared mount).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from pathlib import Path

from wim.errors import WimError

logger = logging.getLogger(__name__)

_TIMEOUT_S = 120.0  # loading an adapter reads its weights from disk on the server


class AdapterServingError(WimError):
    """The server could not register an adapter (or is not a vLLM with runtime LoRA)."""


def adapter_name(adapter_dir: str | Path) -> str:
    """The served name of an adapter folder: `wim-r<round>-<folder hash>-<weights hash>` for a
    round's adapter (`.../rounds/<r>/train/adapter`), `wim-<folder hash>-<weights hash>` else.
    The folder's absolute path names the run and round; the weights, what was trained."""
    folder = Path(adapter_dir).resolve()
    where = hashlib.sha256(str(folder).encode()).hexdigest()[:8]
    weights = folder / "adapter_model.safetensors"
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()[:8] if weights.is_file() else "0"
    parts = folder.parts
    label = (f"r{parts[-3]}-" if len(parts) >= 4 and parts[-4] == "rounds"
             and parts[-2:] == ("train", "adapter") else "")
    return f"wim-{label}{where}-{digest}"


def serve_adapter(http, adapter_dir: str | Path) -> str:
    """Register `adapter_dir` with every base URL of `http` (each replica needs it); its name."""
    name = adapter_name(adapter_dir)
    for url in http.base_urls:
        register_adapter(url, name, adapter_dir, http.server_paths, http.api_key_env)
    return name


def served_http(http, adapter_dir: str | Path | None):
    """`http` (an HTTPConfig) with `model` the served name of `adapter_dir`, registered now;
    `http` itself without an adapter or with adapters not served."""
    if adapter_dir is None or http.adapter_serving != "vllm":
        return http
    return dataclasses.replace(http, model=serve_adapter(http, adapter_dir))


def server_path(local: str | Path, server_paths: dict[str, str]) -> str:
    """`local` as the server sees it: the longest matching local prefix replaced."""
    path = str(Path(local).resolve())
    for prefix in sorted(server_paths, key=len, reverse=True):
        root = str(Path(prefix).resolve())
        if path == root or path.startswith(root.rstrip("/") + "/"):
            return server_paths[prefix].rstrip("/") + path[len(root.rstrip("/")):]
    return path


def register_adapter(base_url: str, name: str, local_path: str | Path,
                     server_paths: dict[str, str] | None = None,
                     api_key_env: str = "WIM_API_KEY") -> str:
    """Register the adapter folder `local_path` as `name`; returns the path sent. Raises
    AdapterServingError naming the path and what to set when the server refuses it. One POST
    through the same HTTPClient as every request (its key header), sent once: a refusal is
    read here, not retried."""
    from wim.backends.http_client import Failure, HTTPClient

    path = server_path(local_path, server_paths or {})
    url = base_url.rstrip("/") + "/load_lora_adapter"
    client = HTTPClient(base_url, api_key_env=api_key_env, concurrency=1, timeout_s=_TIMEOUT_S,
                        max_retries=0)
    try:
        reply = client.post_json("/load_lora_adapter", {"lora_name": name, "lora_path": path},
                                 parse=lambda status, body, _: (status, body.decode(
                                     "utf-8", errors="replace")))
    finally:
        client.close()
    if isinstance(reply, Failure):  # it never reached the server
        raise AdapterServingError(f"could not reach {url} to register adapter {name!r}: "
                                  f"{reply.reason}")
    status, text = reply
    text = text[:600]
    if status == 200:
        logger.info("adapter %s registered with %s (%s)", name, base_url, path)
        return path
    if status == 400 and "already been loaded" in text:
        logger.info("adapter %s already registered with %s", name, base_url)
        return path
    hint = (f"The server must be able to read the folder {path!r} (this machine's "
            f"{str(local_path)!r}); if it sees this machine's files under another path (a "
            "shared mount), set http.server_paths, e.g. {'/local/runs': '/mnt/runs'}.")
    if status in (404, 405) and "adapter" not in text.lower():  # no such route
        hint = ("the server has no runtime LoRA loading: start vLLM with --enable-lora "
                "(and --max-lora-rank >= lora.r) and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, "
                "or set http.adapter_serving: none")
    raise AdapterServingError(f"{url} refused adapter {name!r} at {path!r} (HTTP "
                              f"{status}: {text}). {hint}")
