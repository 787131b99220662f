"""Registering adapters with a server (`http.adapter_serving: vllm`): names, path mapping, and
the server's answers (a small stand-in on 127.0.0.1 answering as vLLM 0.32 does; the real
server is in test_vllm_server.py and tests/test_vllm_rounds.py)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from wim.backends.adapter_serving import (
    AdapterServingError,
    adapter_name,
    register_adapter,
    server_path,
)

ALREADY = {"error": {"message": "The lora adapter 'x' has already been loaded. If you want to "
                     "load the adapter in place, set 'load_inplace' to True.", "code": 400}}
NO_FOLDER = {"error": {"message": "Loading lora x failed: No adapter found for /p",
                       "type": "NotFoundError", "code": 404}}


class LoraServer:
    """POST /v1/load_lora_adapter: 200 the first time a name comes, then vLLM's 400 "already
    been loaded"; 404 for a path that does not exist here; `runtime=False`: no such route."""

    def __init__(self, runtime: bool = True) -> None:
        self.seen: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.seen.append(body)
                names = [b["lora_name"] for b in server.seen[:-1]]
                if not runtime or self.path != "/v1/load_lora_adapter":
                    status, reply = 404, {"detail": "Not Found"}
                elif not Path(body["lora_path"]).is_dir():
                    status, reply = 404, NO_FOLDER
                elif body["lora_name"] in names:
                    status, reply = 400, ALREADY
                else:
                    status, reply = 200, None
                data = json.dumps(reply).encode() if reply else b"Success"
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def lora_server():
    made: list[LoraServer] = []

    def make(**kw) -> LoraServer:
        made.append(LoraServer(**kw))
        return made[-1]

    yield make
    for server in made:
        server.close()


def _adapter(root: Path, r: int, weights: bytes = b"w") -> Path:
    folder = root / "rounds" / str(r) / "train" / "adapter"
    folder.mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(weights)
    return folder


def test_names_are_unique_to_run_round_and_weights(tmp_path: Path) -> None:
    a1, a2 = _adapter(tmp_path / "a", 1), _adapter(tmp_path / "a", 2)
    b1 = _adapter(tmp_path / "b", 1)
    names = [adapter_name(p) for p in (a1, a2, b1)]
    assert names[0].startswith("wim-r1-") and names[1].startswith("wim-r2-")
    assert len(set(names)) == 3
    assert adapter_name(a1) == names[0]  # stable
    (a1 / "adapter_model.safetensors").write_bytes(b"retrained")
    assert adapter_name(a1) != names[0]  # a retrained round gets a new name


def test_server_paths_map_the_longest_prefix(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    mapping = {str(tmp_path): "/srv", str(runs): "/mnt/runs"}
    assert server_path(runs / "x" / "adapter", mapping) == "/mnt/runs/x/adapter"
    assert server_path(tmp_path / "other", mapping) == "/srv/other"
    assert server_path("/elsewhere/a", mapping) == "/elsewhere/a"
    assert server_path(str(runs) + "2/a", mapping) == "/srv/runs2/a"  # a prefix, not a folder


def test_registering_again_is_fine(lora_server, tmp_path: Path) -> None:
    server = lora_server()
    folder = _adapter(tmp_path, 1)
    assert register_adapter(server.url, "x", folder) == str(folder.resolve())
    register_adapter(server.url, "x", folder)  # a resumed run: "already been loaded"
    assert [b["lora_name"] for b in server.seen] == ["x", "x"]


def test_a_folder_the_server_cannot_read_names_path_and_setting(lora_server,
                                                                tmp_path: Path) -> None:
    server = lora_server()
    folder = _adapter(tmp_path, 1)
    with pytest.raises(AdapterServingError) as info:
        register_adapter(server.url, "x", folder, {str(tmp_path): "/mnt/elsewhere"})
    message = str(info.value)
    assert "/mnt/elsewhere/rounds/1/train/adapter" in message  # the path it was sent
    assert str(folder) in message and "http.server_paths" in message


def test_a_server_without_runtime_lora_says_how_to_start_it(lora_server,
                                                            tmp_path: Path) -> None:
    server = lora_server(runtime=False)
    with pytest.raises(AdapterServingError, match="--enable-lora.*VLLM_ALLOW_RUNTIME_LORA"):
        register_adapter(server.url, "x", _adapter(tmp_path, 1))
