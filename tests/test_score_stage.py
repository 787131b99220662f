"""The score stage (data_gen/score.py): streamed in batches, each similarity computed once
and stored (DIR/similarities.sqlite), re-scores bit for bit, exact resume, flat memory; with the
real bundled MiniLM and the real CLI where users take that path."""

from __future__ import annotations

import dataclasses
import json
import tracemalloc
from pathlib import Path

import pytest
from conftest import QUICKSTART, run_wim, sets

from wim.config import load_config
from wim.records import read_records
from wim.rundir import RunDir

TOPICS = ["the sky", "tides", "rainbows", "volcanoes", "bread", "vaccines", "bridges", "tea"]
CRITIQUES = ["No mention of the physics behind it.", "It lacks a concrete example.",
             "None", "The history is missing.", "No safety caveats.",
             "It lacks a concrete example."]  # repeated: one critique in many judgements


def _judgements(n: int, long: int = 0) -> list[dict]:
    out = []
    for i in range(n):
        topic = TOPICS[i % len(TOPICS)]
        response = f"An answer about {topic}, number {i % 5}." + " filler" * long
        out.append({"prompt_id": f"p{i // 4}", "sample_idx": i % 4, "domain": "science",
                    "prompt": f"Tell me about {topic}.", "response": response,
                    "judge_role": "external", "judge_model": "another-tool",
                    "critique": CRITIQUES[i % len(CRITIQUES)], "rating": 1 + i % 10,
                    "parse_ok": True})
    return out


def _run_with(tmp_path: Path, judgements: list[dict], name: str = "run") -> Path:
    out = tmp_path / name
    RunDir(out).claim(load_config(QUICKSTART))
    (out / "judgements.jsonl").write_text("".join(json.dumps(j) + "\n" for j in judgements))
    return out


def _stats(out: Path) -> dict:
    return json.loads((out / "stats" / "score.json").read_text())


def test_rescore_at_another_zeta_reuses_every_similarity_bit_for_bit(tmp_path: Path) -> None:
    out = _run_with(tmp_path, _judgements(24))
    run_wim(["score", str(out), *sets(["scoring.zeta=0.4", "scoring.batch_size=5"])])
    first = read_records(out / "scores.jsonl")
    assert _stats(out)["score/similarities_computed"] > 0
    for zeta in (1.0, 0.0):
        run_wim(["score", str(out), "--set", f"scoring.zeta={zeta}"])
        again = read_records(out / "scores.jsonl")
        stats = _stats(out)
        assert stats["score/similarities_computed"] == 0 and stats["score/embedded_texts"] == 0
        assert "dtype/score" not in stats  # no embedder was opened
        assert [r["similarity"] for r in again] == [r["similarity"] for r in first]
        for r in again:
            assert r["score"] == (1 - zeta) * r["rating_norm"] + zeta * r["similarity"]


def test_validity_scores_a_judgement_set_exactly_as_the_score_stage(tmp_path: Path) -> None:
    """One similarity function: the same judgements (nothing-missing critiques among them: "None"
    and "") through `wim score` and through `wim validity`'s scoring give identical values."""
    from data_gen.validity import score_gold

    judgements = _judgements(30)
    judgements[3]["critique"] = ""
    judgements[7]["critique"] = "Nothing is missing."
    out = _run_with(tmp_path, judgements)
    settings = ["scoring.zeta=0.4", "scoring.batch_size=8"]
    run_wim(["score", str(out), *sets(settings)])
    stage = read_records(out / "scores.jsonl")
    gold = score_gold(load_config(QUICKSTART, settings), judgements)
    assert [r["similarity"] for r in gold] == [r["similarity"] for r in stage]
    assert [r["score"] for r in gold] == [r["score"] for r in stage]
    nothing_missing = [r["similarity"] for r in stage if r["critique"] in ("", "None")]
    assert len(nothing_missing) >= 5 and set(nothing_missing) == {1.0}
    assert len({r["similarity"] for r in stage}) > 4  # real cosines beside them


def test_zeta_zero_loads_no_embedder(tmp_path: Path) -> None:
    out = _run_with(tmp_path, _judgements(8))
    run_wim(["score", str(out), *sets(["scoring.zeta=0.0",
                                    "scoring.embedder=/no/such/embedder"])])
    scores = read_records(out / "scores.jsonl")
    assert [r["score"] for r in scores] == [r["rating_norm"] for r in scores]
    proc = run_wim(["score", str(out), *sets(["scoring.zeta=0.5",
                                           "scoring.embedder=/no/such/embedder"])], check=False)
    assert proc.returncode != 0 and "/no/such/embedder" in proc.stderr  # it would have loaded


def test_another_dtype_or_embedder_recomputes_and_never_mixes(tmp_path: Path) -> None:
    from wim.models import resolve_embedder

    out = _run_with(tmp_path, _judgements(12))
    run_wim(["score", str(out), "--set", "scoring.dtype=float32"])
    f32 = [r["similarity"] for r in read_records(out / "scores.jsonl")]
    n = _stats(out)["score/similarities_computed"]
    run_wim(["score", str(out), "--set", "scoring.dtype=bfloat16"])
    bf16 = [r["similarity"] for r in read_records(out / "scores.jsonl")]
    assert _stats(out)["score/similarities_computed"] == n
    assert _stats(out)["dtype/score"] == "bfloat16"
    assert bf16 != f32 and max(abs(a - b) for a, b in zip(bf16, f32, strict=True)) < 0.05
    # The same model under another name is another embedder: computed afresh as well.
    folder = resolve_embedder("bundled:all-minilm-l6-v2")
    run_wim(["score", str(out), *sets(["scoring.dtype=float32", f"scoring.embedder={folder}"])])
    assert _stats(out)["score/similarities_computed"] == n
    # Back (`wim score DIR` starts from the run's saved config): every value stored.
    run_wim(["score", str(out), *sets(["scoring.dtype=float32",
                                       "scoring.embedder=bundled:all-minilm-l6-v2"])])
    assert _stats(out)["score/similarities_computed"] == 0
    assert [r["similarity"] for r in read_records(out / "scores.jsonl")] == f32


class Counting:
    """The real embedder, counting the texts it is asked to embed; `fail_after`: raise on that
    call, as a server that dies mid-run would."""

    def __init__(self, embedder, fail_after: int | None = None) -> None:
        self.inner, self.fail_after, self.calls, self.texts = embedder, fail_after, 0, []
        self.identity, self.name, self.dtype = embedder.identity, embedder.name, embedder.dtype

    def embed(self, texts):
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise RuntimeError("the embedder died")
        self.texts.extend(texts)
        self.inner.forget()  # nothing cached between calls: every text really is embedded
        return self.inner.embed(texts)

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def minilm():
    from wim.embedders import Embedder

    return Embedder("bundled:all-minilm-l6-v2")


def test_killed_pass_keeps_its_scores_and_the_rerun_is_exact(tmp_path: Path, minilm) -> None:
    from data_gen.score import score_run

    cfg = load_config(QUICKSTART)
    cfg = dataclasses.replace(cfg, scoring=dataclasses.replace(cfg.scoring, batch_size=3))
    judgements = _judgements(30)
    whole = RunDir(_run_with(tmp_path, judgements, "whole"))
    score_run(cfg, whole, Counting(minilm))
    cut = RunDir(_run_with(tmp_path, judgements, "cut"))
    dying = Counting(minilm, fail_after=4)
    with pytest.raises(RuntimeError, match="died"):
        score_run(cfg, cut, dying)
    written = read_records(cut.scores)
    assert 0 < len(written) < len(judgements)
    assert written == read_records(whole.scores)[: len(written)]  # what was written is kept
    again = Counting(minilm)
    score_run(cfg, cut, again)
    assert cut.scores.read_bytes() == whole.scores.read_bytes()
    # Only the texts of batches never finished were embedded again.
    assert not set(again.texts) & set(dying.texts)


def test_identical_texts_are_embedded_once_per_run(tmp_path: Path, minilm) -> None:
    from data_gen.score import score_run

    cfg = load_config(QUICKSTART)
    cfg = dataclasses.replace(cfg, scoring=dataclasses.replace(cfg.scoring, batch_size=4))
    judgements = _judgements(40)  # 5 responses per topic, 5 critiques, in batches of 4
    counting = Counting(minilm)
    score_run(cfg, RunDir(_run_with(tmp_path, judgements)), counting)
    assert len(counting.texts) == len(set(counting.texts)) > 0
    wanted = {j["response"] for j in judgements if j["critique"] != "None"}
    assert set(counting.texts) == wanted | (set(CRITIQUES) - {"None"})


def test_memory_holds_one_batch_whatever_the_run_size(tmp_path: Path) -> None:
    """Critiques that say nothing is missing need no embedder, so this measures the pass
    itself: 10x the judgements, about the same peak."""
    from data_gen.score import score_run

    cfg = load_config(QUICKSTART)
    peaks = []
    for n in (300, 3000):
        judgements = [{**j, "critique": "None"} for j in _judgements(n, long=300)]
        run = RunDir(_run_with(tmp_path, judgements, f"run{n}"))
        tracemalloc.start()
        score_run(cfg, run)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert len(read_records(run.scores)) == n
    size = len(json.dumps(_judgements(1, long=300)[0]))
    assert peaks[1] < peaks[0] + 50 * size  # holding every record would add 2,700 of them


def test_compare_embeds_each_judgement_once_for_all_its_arms(tmp_path: Path, minilm,
                                                             monkeypatch) -> None:
    """`wim compare`'s scoring path: the shared store filled once, then every arm (numeric,
    wim, mixed, random) scored and paired by the real stage runner from its copy."""
    import wim.embedders
    from data_gen.pipeline import run_stages
    from training import compare

    counting = Counting(minilm)
    monkeypatch.setattr(wim.embedders, "open_embedder", lambda cfg: counting)
    cfg = compare.prepare_config(load_config(QUICKSTART))
    judgements = _judgements(24)
    shared = RunDir(_run_with(tmp_path, judgements, "shared"))
    compare.store_similarities(cfg, shared)
    embedded = list(counting.texts)
    for name, zeta in compare.arms_of(cfg):
        arm_cfg = dataclasses.replace(cfg, scoring=dataclasses.replace(cfg.scoring, zeta=zeta))
        run = RunDir(tmp_path / "arms" / name)
        run.claim(arm_cfg)
        compare._copy_shared(shared, run)
        run_stages(arm_cfg, run, ("score",), progress=False)
        assert all(r["similarity"] is not None for r in read_records(run.scores))
    assert counting.texts == embedded and len(embedded) == len(set(embedded)) > 0
