"""Generation with llama-cpp-python: a GGUF model on the CPU, the fast local choice.

We render the chat prompt ourselves with the model's own chat template (the GGUF metadata
`tokenizer.chat_template`, rendered by jinja2 the way transformers does) so that a prefill can
be appended to the assistant turn, then call `create_completion` on the tokens. Each sample gets
its own seed derived from (seed, conversation index, sample index), so a text does not depend on
which other conversations were in the same call.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from wim.backends.base import Backend, Completion, Conversation, SamplingParams, sample_seed
from wim.backends.prefix_cache import shared_prefix_length
from wim.models import BUNDLED_POLICY, ModelNotFoundError, bundled_gguf_path

logger = logging.getLogger(__name__)


def _import_llama_cpp():
    try:
        import llama_cpp
        import llama_cpp.llama_chat_format
    except ImportError as exc:
        raise ImportError(
            "the llama_cpp backend needs llama-cpp-python, which is not installed. "
            "Install it with: pip install 'wim[llama]' (or: pip install llama-cpp-python)"
        ) from exc
    return llama_cpp


def resolve_gguf(name: str) -> Path:
    """The GGUF file for `name`: the bundled policy, or a path ending in `.gguf`."""
    if name == BUNDLED_POLICY:
        return bundled_gguf_path()
    if name.lower().endswith(".gguf"):
        path = Path(name).expanduser()
        if not path.is_file():
            raise ModelNotFoundError(f"GGUF file not found: {path}")
        return path
    raise ModelNotFoundError(
        f"the llama_cpp backend needs a GGUF file: got '{name}'. Pass a path ending in .gguf "
        f"or '{BUNDLED_POLICY}' (a transformers folder or hub id needs the transformers backend)"
    )


class LlamaCppBackend(Backend):
    """Sequential generation with a llama.cpp model, one sample at a time."""

    name = "llama_cpp"
    supports_prefill = True

    def __init__(self, llama, label: str = "", chat_template: str | None = None,
                 reuse_prefix: bool = True) -> None:
        llama_cpp = _import_llama_cpp()
        self.llama = llama
        self.reuse_prefix = reuse_prefix
        self._prefix: tuple[tuple[int, ...], object] | None = None  # (tokens, saved state)
        self.label = label
        template = chat_template or llama.metadata.get("tokenizer.chat_template")
        if not template:
            raise ValueError(
                f"the GGUF model '{label}' has no tokenizer.chat_template in its metadata; "
                "pass chat_template= explicitly"
            )

        def token_text(token_id: int) -> str:
            if token_id < 0:
                return ""
            return llama.detokenize([token_id], special=True).decode("utf-8", errors="replace")

        # Jinja2ChatFormatter is llama-cpp-python's renderer of HF chat templates (sandboxed
        # jinja2, trim_blocks, tojson, raise_exception), the same one its server uses.
        self._formatter = llama_cpp.llama_chat_format.Jinja2ChatFormatter(
            template=template,
            eos_token=token_text(llama.token_eos()),
            bos_token=token_text(llama.token_bos()),
            add_generation_prompt=True,
        )

    @classmethod
    def load(cls, name: str, n_ctx: int = 2048, n_threads: int | None = None) -> LlamaCppBackend:
        """Load `bundled:smollm2-135m-instruct` or a `.gguf` file."""
        path = resolve_gguf(name)
        llama_cpp = _import_llama_cpp()
        # llama.cpp's default is half the cores for decoding but all of them for the prompt;
        # all cores crawl (threads wait on each other) when other processes share them.
        n_threads = n_threads or max(1, (os.cpu_count() or 2) // 2)
        llama = llama_cpp.Llama(
            model_path=str(path),
            n_ctx=n_ctx,
            n_threads=n_threads,
            n_threads_batch=n_threads,
            verbose=False,
        )
        return cls(llama, label=name)

    @property
    def context_tokens(self) -> int:
        return int(self.llama.n_ctx())

    def count_tokens(self, conversation: Conversation, prefill: str | None = None) -> int:
        text = self.render(conversation, prefill)
        return len(self.llama.tokenize(text.encode("utf-8"), add_bos=False, special=True))

    def render(self, conversation: Conversation, prefill: str | None = None) -> str:
        """The prompt text: chat template with the generation prompt, then the prefill."""
        return self._formatter(messages=conversation).prompt + (prefill or "")

    def generate(self, conversations: list[Conversation], params: SamplingParams, *, n: int = 1,
                 seed: int = 0, prefill: str | list[str] | None = None) -> list[list[Completion]]:
        prefills = prefill if isinstance(prefill, list) else [prefill] * len(conversations)
        rendered: list[list[int] | str] = []
        for conversation, head in zip(conversations, prefills, strict=True):
            try:
                # Tokens, not text: the template already wrote any BOS it wants, as with
                # transformers' `add_special_tokens=False`.
                text = self.render(conversation, head)
                rendered.append(self.llama.tokenize(text.encode("utf-8"), add_bos=False,
                                                    special=True))
            except Exception as exc:  # e.g. the template refuses the roles: fail this one only
                rendered.append(f"llama.cpp: cannot render the prompt: {exc}")
        split = shared_prefix_length([r for r in rendered if not isinstance(r, str)])
        self._prefix = None  # per call: the weights or the template may differ next time
        seeds = [[sample_seed(seed, i, j) for j in range(n)] for i in range(len(rendered))]
        return [_failed(n, 0, tokens) if isinstance(tokens, str)
                else self._generate_one(tokens, params, s, split)
                for tokens, s in zip(rendered, seeds, strict=True)]

    def _generate_one(self, tokens: list[int], params: SamplingParams, seeds: list[int],
                      split: int) -> list[Completion]:
        n_ctx = self.llama.n_ctx()
        if len(tokens) >= n_ctx:
            error = f"llama.cpp: prompt of {len(tokens)} tokens exceeds n_ctx={n_ctx}"
            return _failed(len(seeds), len(tokens), error)
        # The logits of a prompt depend slightly on how its tokens were batched, and
        # llama-cpp-python's prefix cache batches a repeated prompt differently (it replays only
        # the last token). So every sample takes the same path: the prompt but its last token
        # is evaluated fresh once per conversation (in two pieces when the call's prompts share
        # a prefix), and each sample evaluates the last token. Texts then depend only on
        # (prompt, params, seed), never on earlier calls.
        try:
            self.llama.reset()
            self._eval_prefix(tokens[:split])
            self.llama.eval(tokens[split:-1])
        except Exception as exc:
            return _failed(len(seeds), len(tokens), f"llama.cpp: prompt evaluation failed: {exc}")
        return [self._sample(tokens, params, s) for s in seeds]

    def _eval_prefix(self, prefix: list[int]) -> None:
        """Evaluate the shared prefix, or restore the state saved after it in this call."""
        if not prefix:
            return
        key = tuple(prefix)
        if self.reuse_prefix and self._prefix is not None and self._prefix[0] == key:
            self.llama.load_state(self._prefix[1])
            return
        self.llama.eval(prefix)
        if self.reuse_prefix:
            self._prefix = (key, self.llama.save_state())

    def _sample(self, tokens: list[int], params: SamplingParams, seed: int) -> Completion:
        try:
            out = self.llama.create_completion(
                prompt=tokens,
                max_tokens=params.max_new_tokens,
                temperature=params.temperature,
                top_p=params.top_p,
                # llama.cpp would add top_k=40 and min_p=0.05 by default; sample exactly what
                # SamplingParams says, like the other backends.
                top_k=0,
                min_p=0.0,
                stop=list(params.stop) or None,
                seed=seed,
            )
        except Exception as exc:  # one bad prompt must not end the run
            return _failed(1, len(tokens), f"llama.cpp: completion failed: {exc}")[0]
        usage = out.get("usage") or {}
        return Completion(
            out["choices"][0]["text"],
            prompt_tokens=int(usage.get("prompt_tokens", len(tokens))),
            completion_tokens=int(usage.get("completion_tokens", 0)),
        )

    def close(self) -> None:
        self.llama.close()


def _failed(n: int, prompt_tokens: int, error: str) -> list[Completion]:
    logger.warning("%s", error)
    return [Completion("", prompt_tokens, 0, ok=False, error=error) for _ in range(n)]
