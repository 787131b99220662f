"""WIM scores (wim/scoring.py) with the real bundled MiniLM embedder (wim/embedders.py)."""

from __future__ import annotations

import numpy as np
import pytest

from wim.embedders import Embedder
from wim.errors import InputError
from wim.scoring import (
    cosines_by,
    mix_scores,
    rating_norm,
    score_judgements,
    similarities,
    to_ten_point,
)

PAIRS = [
    # (response, critique, rating)
    ("Paris is the capital of France.",
     "It does not mention that Paris is also the largest city in France.", 8),
    ("Take ibuprofen for the headache.",
     "No dosage, no warning about stomach bleeding or interactions with blood thinners.", 3),
    ("Photosynthesis turns light, water and carbon dioxide into glucose and oxygen.",
     "The role of chlorophyll and the light and dark reactions.", 7),
    ("Use a for loop.", "An actual code example in Python and an explanation of range().", 1),
    ("The French Revolution began in 1789 with the storming of the Bastille.",
     "Its causes: debt, bread prices and Enlightenment ideas.", 10),
]


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return Embedder("bundled:all-minilm-l6-v2")


@pytest.fixture
def encoded(embedder, monkeypatch) -> list[str]:
    """Every text the embedder's model really encodes (a spy on the model, not a counter in
    our code)."""
    seen: list[str] = []
    real = embedder.model.encode

    def spy(texts, *args, **kwargs):
        seen.extend(texts)
        return real(texts, *args, **kwargs)

    monkeypatch.setattr(embedder.model, "encode", spy)
    return seen


def _judgement(i: int, response: str, critique: str | None, rating: int | None,
               parse_ok: bool = True, prompt_id: str = "p0") -> dict:
    return {"prompt_id": prompt_id, "sample_idx": i, "prompt": "question?",
            "response": response, "critique": critique, "rating": rating, "parse_ok": parse_ok}


def _cosine(embedder: Embedder, a: str, b: str) -> float:
    va, vb = embedder.model.encode([a, b], convert_to_numpy=True).astype(np.float64)
    return float(va @ vb / (np.linalg.norm(va) * np.linalg.norm(vb)))


# --- rating_norm and mix_scores --------------------------------------------------------------


def test_rating_norm_ends_and_middle():
    assert rating_norm(1) == -0.8
    assert rating_norm(10) == 1.0
    assert rating_norm(5) == 0.0
    assert [rating_norm(n) for n in range(1, 11)] == [(n - 5) / 5 for n in range(1, 11)]


@pytest.mark.parametrize("bad", [0, 11, 7.5, True, False, "7", None, -3])
def test_rating_norm_rejects(bad):
    with pytest.raises(ValueError, match="integer in 1..10"):
        rating_norm(bad)


def test_mix_scores_formula_and_range():
    assert mix_scores(0.6, 0.2, 0.4) == pytest.approx(0.6 * 0.6 + 0.4 * 0.2)
    assert mix_scores(0.6, 0.2, 0.0) == 0.6
    assert mix_scores(0.6, 0.2, 1.0) == 0.2
    for zeta in (-0.1, 1.5):
        with pytest.raises(ValueError, match=r"zeta must lie in \[0, 1\]"):
            mix_scores(0.0, 0.0, zeta)


def test_to_ten_point():
    assert to_ten_point(-0.8) == 1.0
    assert to_ten_point(1.0) == 10.0
    assert to_ten_point(0.0) == 5.0


# --- score_judgements with the real embedder -------------------------------------------------


@pytest.mark.parametrize("zeta", [0.4, 0.7])
def test_scores_match_the_formula(embedder, zeta):
    judgements = [_judgement(i, r, c, n) for i, (r, c, n) in enumerate(PAIRS)]
    records = score_judgements(judgements, embedder, zeta)
    assert len(records) == len(PAIRS)
    for record, (response, critique, n) in zip(records, PAIRS, strict=True):
        cos = _cosine(embedder, response, critique)
        assert -1.0 < cos < 1.0
        expected = (1 - zeta) * (n - 5) / 5 + zeta * cos
        assert record["similarity"] == pytest.approx(cos, abs=1e-6)
        assert record["score"] == pytest.approx(expected, abs=1e-6)
        assert record["rating_norm"] == (n - 5) / 5
        assert record["zeta"] == zeta
        assert record["embedder"] == "bundled:all-minilm-l6-v2"
        # The judgement's own fields are carried over unchanged.
        assert record["critique"] == critique and record["rating"] == n


def test_related_critique_is_more_similar_than_unrelated(embedder):
    response = "Paris is the capital of France."
    related = "It does not say that Paris is the largest city of France."
    unrelated = "The quadratic formula and how to complete the square."
    related_sim, unrelated_sim = similarities([response, response], [related, unrelated],
                                                cosines_by(embedder))
    assert related_sim > unrelated_sim


def test_input_records_are_not_mutated(embedder):
    judgements = [_judgement(0, *PAIRS[0])]
    before = dict(judgements[0])
    score_judgements(judgements, embedder, 0.4)
    assert judgements[0] == before


@pytest.mark.parametrize("critique", ["", "   ", "\n"])
def test_empty_critique_gives_similarity_one(embedder, critique):
    records = score_judgements([_judgement(0, "Some answer.", critique, 6)], embedder, 0.4)
    assert records[0]["similarity"] == 1.0
    assert records[0]["score"] == pytest.approx(0.6 * 0.2 + 0.4 * 1.0, abs=1e-12)


@pytest.mark.parametrize("critique", ["", "None.", "Nothing is missing"])
def test_nothing_missing_critique_is_not_embedded(embedder, encoded, critique):
    assert similarities(["An answer never embedded before 123."], [critique],
                        cosines_by(embedder)) == [1.0]
    assert encoded == []


def test_zeta_zero_is_pure_numeric_and_one_is_pure_wim(embedder):
    judgements = [_judgement(i, r, c, n) for i, (r, c, n) in enumerate(PAIRS)]
    judgements.append(_judgement(len(PAIRS), "Complete answer.", "", 4))
    for record in score_judgements(judgements, embedder, 0.0):
        assert record["score"] == record["rating_norm"]
    for record in score_judgements(judgements, embedder, 1.0):
        assert record["score"] == record["similarity"]


def test_failed_judgement_gets_no_score(embedder):
    judgements = [
        _judgement(0, *PAIRS[0]),
        _judgement(1, "An answer.", None, None, parse_ok=False),
    ]
    ok, failed = score_judgements(judgements, embedder, 0.4)
    assert ok["score"] is not None
    assert failed["score"] is None
    assert failed["rating_norm"] is None
    assert failed["similarity"] is None
    assert failed["parse_ok"] is False
    assert failed["zeta"] == 0.4


def test_same_sample_idx_in_two_prompts_keeps_its_own_similarity(embedder):
    (r0, c0, n0), (r1, c1, n1) = PAIRS[0], PAIRS[1]
    records = score_judgements(
        [_judgement(0, r0, c0, n0, prompt_id="a"), _judgement(0, r1, c1, n1, prompt_id="b")],
        embedder, 1.0,
    )
    assert records[0]["similarity"] == pytest.approx(_cosine(embedder, r0, c0), abs=1e-6)
    assert records[1]["similarity"] == pytest.approx(_cosine(embedder, r1, c1), abs=1e-6)


@pytest.mark.parametrize("zeta", [0.4, 1.0, 1e-6])
def test_numeric_judgements_need_zeta_zero(embedder, zeta):
    judgements = [_judgement(0, "An answer.", None, 7), _judgement(1, "Another.", None, 2)]
    with pytest.raises(InputError, match="zeta"):
        score_judgements(judgements, embedder, zeta)


def test_numeric_judgements_at_zeta_zero(embedder):
    judgements = [_judgement(0, "An answer.", None, 7), _judgement(1, "Another.", None, 2)]
    for emb in (embedder, None):
        records = score_judgements(judgements, emb, 0.0)
        assert [r["score"] for r in records] == [rating_norm(7), rating_norm(2)]
        assert [r["similarity"] for r in records] == [None, None]


def test_wim_judgements_without_embedder_fail():
    with pytest.raises(InputError, match="embedder"):
        score_judgements([_judgement(0, *PAIRS[0])], None, 0.4)


def test_out_of_range_rating_in_a_judgement_raises(embedder):
    with pytest.raises(ValueError, match="1..10"):
        score_judgements([_judgement(0, "An answer.", "", 11)], embedder, 0.4)


# --- the embedder ----------------------------------------------------------------------------


def test_embeddings_are_unit_length_and_match_the_model(embedder):
    texts = ["A sentence about cats.", "Eine deutsche Zeile.", "x"]
    vectors = embedder.embed(texts)
    raw = embedder.model.encode(texts, convert_to_numpy=True)
    assert vectors.shape == raw.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    raw = raw / np.linalg.norm(raw, axis=1, keepdims=True)
    np.testing.assert_allclose(vectors, raw, atol=1e-5)


def test_cache_does_not_embed_twice(embedder, encoded):
    texts = ["cache test one", "cache test two", "cache test one"]
    first = embedder.embed(texts)
    assert sorted(encoded) == ["cache test one", "cache test two"]  # the duplicate once
    second = embedder.embed(list(reversed(texts)))
    assert len(encoded) == 2
    np.testing.assert_array_equal(second, first[::-1])
    np.testing.assert_array_equal(first[0], first[2])


def test_rescoring_at_another_zeta_embeds_nothing_new(embedder, encoded):
    judgements = [_judgement(i, r, c, n) for i, (r, c, n) in enumerate(PAIRS)]
    score_judgements(judgements, embedder, 0.4)
    count = len(encoded)
    score_judgements(judgements, embedder, 1.0)
    assert len(encoded) == count


def test_embed_nothing(embedder):
    out = embedder.embed([])
    assert out.shape == (0, 384)
