"""Registering adapters with a server (`http.adapter_serving: vllm`): names, path mapping, and
the server's answers (a small stand-in on 127.0.0.1 answering as vLLM 0.32 does; the real
server is in test_vllm_server.py and tests/test_vllm_rounds.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import QUICKSTART, free_port
from recording_server import JSONServer, chat_completion

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


class LoraServer(JSONServer):
    """POST /v1/load_lora_adapter: 200 the first time a name comes, then vLLM's 400 "already
    been loaded"; 404 for a path that does not exist here; `runtime=False`: no such route."""

    def __init__(self, runtime: bool = True) -> None:
        self.runtime = runtime
        super().__init__()

    def respond(self, path: str, body: dict) -> tuple[int, dict | bytes]:
        with self.lock:
            names = [b["lora_name"] for b in self.bodies[:-1]]
        if not self.runtime or path != "/v1/load_lora_adapter":
            return 404, {"detail": "Not Found"}
        if not Path(body["lora_path"]).is_dir():
            return 404, NO_FOLDER
        if body["lora_name"] in names:
            return 400, ALREADY
        return 200, b"Success"


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
    assert [b["lora_name"] for b in server.bodies] == ["x", "x"]


def test_registration_sends_the_key_as_every_request_does(lora_server, tmp_path: Path,
                                                          monkeypatch) -> None:
    """One HTTP transport: the key header comes from HTTPClient, as for chat completions."""
    monkeypatch.setenv("MY_KEY", "sk-123")
    server = lora_server()
    register_adapter(server.url, "x", _adapter(tmp_path, 1), api_key_env="MY_KEY")
    assert server.requests == [("/v1/load_lora_adapter", "Bearer sk-123")]


def test_a_folder_the_server_cannot_read_names_path_and_setting(lora_server,
                                                                tmp_path: Path) -> None:
    server = lora_server()
    folder = _adapter(tmp_path, 1)
    with pytest.raises(AdapterServingError) as info:
        register_adapter(server.url, "x", folder, {str(tmp_path): "/mnt/elsewhere"})
    message = str(info.value)
    assert "/mnt/elsewhere/rounds/1/train/adapter" in message  # the path it was sent
    assert str(folder) in message and "http.server_paths" in message


def test_a_server_that_does_not_answer_is_named(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    with pytest.raises(AdapterServingError, match=f"could not reach {url}/load_lora_adapter "
                       "to register adapter 'x': Client"):
        register_adapter(url, "x", _adapter(tmp_path, 1))


def test_a_server_without_runtime_lora_says_how_to_start_it(lora_server,
                                                            tmp_path: Path) -> None:
    server = lora_server(runtime=False)
    with pytest.raises(AdapterServingError, match="--enable-lora.*VLLM_ALLOW_RUNTIME_LORA"):
        register_adapter(server.url, "x", _adapter(tmp_path, 1))


def test_any_other_400_is_an_error_not_already_loaded(lora_server, tmp_path: Path) -> None:
    """Only vLLM's "already been loaded" 400 means the name is held; a refused rank (or any
    other 400) is an error, so nothing is sampled by a name the server does not hold."""

    class RankServer(LoraServer):
        def respond(self, path: str, body: dict) -> tuple[int, dict | bytes]:
            return 400, {"error": {"message": "LoRA rank 32 is greater than max_lora_rank 16.",
                                   "code": 400}}

    server = RankServer()
    try:
        with pytest.raises(AdapterServingError, match="HTTP 400.*max_lora_rank"):
            register_adapter(server.url, "x", _adapter(tmp_path, 1))
    finally:
        server.close()


class ServedPolicy(LoraServer):
    """A vLLM stand-in that also answers chat completions with a guided WIM judgement."""

    def respond(self, path: str, body: dict) -> tuple[int, dict | bytes]:
        if path == "/v1/chat/completions":
            text = json.dumps({"missing": "Nothing else.", "rating": 7})
            return 200, chat_completion(text, 11, 5)
        return super().respond(path, body)


def _served_config(server, adapter: Path, role: str, mount: Path):
    from wim.config import load_config

    return load_config(QUICKSTART, [
        "policy.backend=http", f"http.base_urls=[{server.url}]", "http.model=base-served",
        "http.adapter_serving=vllm", f"policy.adapter={adapter}", f"judge.role={role}",
        "http.api_key_env=WIM_TEST_SERVING_KEY", "http.max_retries=0",
        f"http.server_paths={{{adapter.parents[3]}: {mount}}}"])


@pytest.mark.parametrize("role", ["fixed", "changing"])
def test_served_adapter_wiring_per_judge_role(role: str, tmp_path: Path, monkeypatch) -> None:
    """An HTTP policy with `policy.adapter`: building the policy (also on a resumed run)
    registers the adapter with the server under its name, at the path the server sees
    (`http.server_paths`), with the key; the policy samples by the adapter's name; the fixed
    judge judges by the base name, the changing judge by the adapter's."""
    from data_gen.pipeline import Resources

    monkeypatch.setenv("WIM_TEST_SERVING_KEY", "sk-serving")
    adapter = _adapter(tmp_path / "run", 1)
    mount = tmp_path / "mnt"
    mount.symlink_to(tmp_path / "run")  # the server's view of this machine's run folder
    server = ServedPolicy()
    try:
        resources = Resources(_served_config(server, adapter, role, mount))
        policy = resources.policy()
        judge = resources.judge()
        judge.judge([("Name a colour.", "Blue.")], seed=1)
        resources.close()
    finally:
        server.close()
    name = adapter_name(adapter)
    loads = [(b, r) for b, r in zip(server.bodies, server.requests, strict=True)
             if r[0] == "/v1/load_lora_adapter"]
    assert [(b["lora_name"], b["lora_path"], r[1]) for b, r in loads] == [
        (name, str(mount / "rounds" / "1" / "train" / "adapter"), "Bearer sk-serving")]
    assert policy.model == name
    judged_by = {b["model"] for b, r in zip(server.bodies, server.requests, strict=True)
                 if r[0] == "/v1/chat/completions"}
    assert judged_by == ({"base-served"} if role == "fixed" else {name})


def test_refine_policy_samples_a_served_adapter_by_its_name(tmp_path: Path, monkeypatch) -> None:
    """`wim refine` builds its policy the one way (`open_backend`), so a served
    `policy.adapter` is registered and sampled by its name, not by the base's."""
    from wim.refine.runner import open_models

    monkeypatch.setenv("WIM_TEST_SERVING_KEY", "sk-serving")
    adapter = _adapter(tmp_path / "run", 1)
    server = ServedPolicy()
    try:
        policy, evaluator, _ = open_models(_served_config(server, adapter, "fixed",
                                                          tmp_path / "run"))
        policy.close()
    finally:
        server.close()
    assert policy.model == adapter_name(adapter)
    assert [b["lora_name"] for b in server.bodies] == [adapter_name(adapter)]


def test_eval_answers_each_system_by_its_served_name(tmp_path: Path, monkeypatch) -> None:
    """`wim eval` on a served policy: the trained system is sampled (and recorded) by its
    adapter's served name, the base by `http.model`."""
    from training.evaluate import System, generate_answers
    from wim.prompts import Prompt

    monkeypatch.setenv("WIM_TEST_SERVING_KEY", "sk-serving")
    adapter = _adapter(tmp_path / "run", 1)
    server = ServedPolicy()
    try:
        cfg = _served_config(server, adapter, "fixed", tmp_path / "run")
        systems = [System("trained", cfg.policy.model, str(adapter)),
                   System("base", cfg.policy.model)]
        prompt = Prompt("p0", "", ({"role": "user", "content": "Name a colour."},))
        out = generate_answers(cfg, systems, [prompt], progress=False)
    finally:
        server.close()
    name = adapter_name(adapter)
    sent = [b["model"] for b, r in zip(server.bodies, server.requests, strict=True)
            if r[0] == "/v1/chat/completions"]
    assert sent == [name, "base-served"]
    assert [out[s][0]["served_model"] for s in ("trained", "base")] == [name, "base-served"]
