"""LlamaCppBackend on the bundled SmolLM2 GGUF."""

from __future__ import annotations

import sys

import pytest

from wim.backends import SamplingParams
from wim.backends.llama_cpp_backend import LlamaCppBackend, resolve_gguf
from wim.models import BUNDLED_POLICY, ModelNotFoundError

CONVS = [
    [{"role": "user", "content": "Explain why ice floats on water."}],
    [{"role": "user", "content": "Name three colours."}],
]
PARAMS = SamplingParams(max_new_tokens=16, temperature=0.8)
GREEDY = SamplingParams(max_new_tokens=24, temperature=0.0)


@pytest.fixture(scope="module")
def backend():
    pytest.importorskip(
        "llama_cpp", reason="llama-cpp-python is not installed (pip install 'wim[llama]')"
    )
    backend = LlamaCppBackend.load(BUNDLED_POLICY, n_ctx=512)
    yield backend
    backend.close()


def _tokens(backend, text: str) -> int:
    return len(backend.llama.tokenize(text.encode("utf-8"), add_bos=False, special=False))


def test_n_completions_with_token_counts(backend):
    results = backend.generate(CONVS, PARAMS, n=2, seed=1)
    assert [len(row) for row in results] == [2, 2]
    for conv, row in zip(CONVS, results, strict=True):
        for c in row:
            assert c.ok and c.text.strip()
            # The model's own counts: the prompt as rendered, the text as it came back.
            assert c.prompt_tokens == backend.count_tokens(conv)
            assert c.completion_tokens == _tokens(backend, c.text)
    # An answer that ends (end token) before the cap is counted as written, not as the cap.
    [[short]] = backend.generate(CONVS[1:], SamplingParams(max_new_tokens=64, temperature=0.0))
    assert short.completion_tokens == _tokens(backend, short.text) < 64


def test_same_seed_same_text_whatever_came_before(backend):
    first = backend.generate(CONVS, PARAMS, n=2, seed=3)
    again = backend.generate(CONVS, PARAMS, n=2, seed=3)
    # Conversation 1 alone, straight after itself: a result depends only on its own index.
    alone = backend.generate(CONVS[1:], PARAMS, n=2, seed=3 + 1000)
    other = backend.generate(CONVS, PARAMS, n=2, seed=4)
    assert first == again
    assert alone[0] == first[1]
    assert first != other
    assert first[0][0].text != first[0][1].text  # each sample has its own seed


def test_prefill_is_honoured_and_excluded(backend):
    plain = backend.generate(CONVS[:1], GREEDY)[0][0].text
    prefill = " ".join(plain.split(" ")[:3])  # e.g. "The reason ice"
    assert backend.render(CONVS[0], prefill).endswith("<|im_start|>assistant\n" + prefill)
    continued = backend.generate(CONVS[:1], GREEDY, prefill=prefill)[0][0].text
    # Greedy decoding from the prefill follows the unprefilled text, minus the prefill.
    assert not continued.startswith(prefill)
    assert (prefill + continued)[:40] == plain[:40]


def test_stop_strings_cut_the_text(backend):
    [[c]] = backend.generate(CONVS[1:], SamplingParams(max_new_tokens=24, temperature=0.0))
    stop = next(w for w in c.text.split()[2:] if len(w) > 3)  # a word from the greedy text
    [[cut]] = backend.generate(
        CONVS[1:], SamplingParams(max_new_tokens=24, temperature=0.0, stop=(stop,))
    )
    assert stop not in cut.text and c.text.startswith(cut.text)


def test_too_long_prompt_is_a_failed_completion(backend):
    long = [[{"role": "user", "content": "word " * 600}]]
    [[c]] = backend.generate(long, PARAMS)
    assert not c.ok and "exceeds n_ctx=512" in c.error


def test_non_gguf_name_is_refused():
    with pytest.raises(ModelNotFoundError, match="needs a GGUF file"):
        resolve_gguf("HuggingFaceTB/SmolLM2-135M-Instruct")
    with pytest.raises(ModelNotFoundError, match="GGUF file not found"):
        resolve_gguf("/nowhere/model.gguf")


def test_missing_llama_cpp_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # makes `import llama_cpp` fail
    with pytest.raises(ImportError, match=r"pip install 'wim\[llama\]'"):
        LlamaCppBackend.load(BUNDLED_POLICY)
