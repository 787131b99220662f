"""One endpoint rule (wim/config/endpoints.py `endpoint`): `judge.http`, `scoring.http` and
`blind.http` each take every null field from `http:`, walked through the objects that the
pipeline, the score stage and `wim eval` open (no server is contacted to build them)."""

from __future__ import annotations

from conftest import QUICKSTART

from data_gen.judge import make_judge
from wim.blind import open_blind_evaluator
from wim.config import load_config
from wim.embedders import open_embedder

SHARED = ["judge.role=external", "judge.backend=http", "scoring.backend=http",
          "blind.backend=http", "http.base_urls=[http://shared:8000/v1]", "http.model=served",
          "http.timeout_s=7.5", "http.api_key_env=SHARED_KEY", "http.max_retries=1"]


def _clients(overrides: list[str]) -> dict:
    cfg = load_config(QUICKSTART, SHARED + overrides)
    judge = make_judge(cfg, policy=lambda: None)
    embedder = open_embedder(cfg)
    blind = open_blind_evaluator(cfg)
    return {"judge": judge.backend._client, "scoring": embedder.client,
            "blind": blind.backend._client, "names": (judge.backend.model, embedder.name,
                                                       blind.backend.model)}


def _field(clients: dict, name: str) -> dict:
    return {k: getattr(clients[k], name) for k in ("judge", "scoring", "blind")}


def test_a_field_set_only_in_http_reaches_the_judge_the_embedder_and_the_blind_evaluator():
    clients = _clients([])
    assert _field(clients, "base_urls") == dict.fromkeys(("judge", "scoring", "blind"),
                                                          ["http://shared:8000/v1"])
    assert _field(clients, "timeout_s") == {"judge": 7.5, "scoring": 7.5, "blind": 7.5}
    assert _field(clients, "api_key_env") == dict.fromkeys(("judge", "scoring", "blind"),
                                                            "SHARED_KEY")
    assert _field(clients, "max_retries") == {"judge": 1, "scoring": 1, "blind": 1}
    # The model name: the section's own, else the section's model (blind.model is always
    # set), else http.model.
    assert clients["names"] == ("served", "served", "bundled:smollm2-135m-instruct")


def test_a_field_set_in_one_section_overrides_only_that_section():
    for section in ("judge", "scoring", "blind"):
        clients = _clients([f"{section}.http.timeout_s=99", f"{section}.http.model=own"])
        others = {k: 7.5 for k in ("judge", "scoring", "blind") if k != section}
        assert _field(clients, "timeout_s") == {**others, section: 99}, section
        names = dict(zip(("judge", "scoring", "blind"), clients["names"], strict=True))
        assert names[section] == "own", section
    clients = _clients(["blind.http.base_urls=[http://evaluator:9000/v1]"])
    assert _field(clients, "base_urls") == {"judge": ["http://shared:8000/v1"],
                                            "scoring": ["http://shared:8000/v1"],
                                            "blind": ["http://evaluator:9000/v1"]}
