"""WIM judges: read (prompt, response), write what is missing and a 1-10 rating.

One abstract method, `Judge.judge`. `BackendJudge` drives any `Backend` (local transformers,
llama.cpp, or an OpenAI-compatible server). Roles:
- fixed:    the frozen reference (the base policy, any LoRA adapter disabled; no second copy);
- changing: the policy being trained, so the judge moves with training;
- external: any other model.

A server is asked for the format as JSON, `{"missing": ..., "rating": N}` (it falls back to
plain text where the server refuses a schema). A backend that can prefill the assistant turn is
walked through the format field by field: small models keep the format far more often that
way. Either way the parser (wim/parsing.py) still checks every value.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import KW_ONLY, dataclass
from typing import NamedTuple

from wim.backends import Backend, Completion, SamplingParams
from wim.backends.base import Usage
from wim.context import fit_text, token_budget
from wim.judge_prompts import (
    MISSING_PREFILL,
    RATING_PREFILL,
    build_judge_instructions,
    build_judge_messages,
    guided_max_tokens,
    judge_json_schema,
)
from wim.parsing import ECHOED_RUBRIC, parse_judgement
from wim.reasoning import apart, budget_exhausted, exhausted_message
from wim.retry import ask_until_parsed

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Judgement:
    critique: str | None
    """What is missing; "" when nothing is; None in numeric mode or when none was found (an
    echoed rubric is not a critique)."""
    rating: int | None
    """1..10, None when no valid rating was found (never replaced by a neutral value). A valid
    rating is kept when only the critique failed; `parse_ok` says whether the whole parse did."""
    raw: str
    """The judge's text of the last attempt, kept for audit."""
    parse_ok: bool
    error: str | None
    attempts: int
    echoed_attempts: int
    """Attempts whose "critique" echoed the rubric (each was a parse failure, then re-asked)."""
    prompt_tokens: int
    completion_tokens: int
    backend_failed: bool = False
    """The backend failed (timeout, 5xx, connection, ...): no verdict at all. Not a result to
    record; the stage leaves it out so that running the same command again retries it."""
    usage: Usage = Usage()
    """The tokens of every attempt by kind, as the backend counted them (wim/pricing.py)."""
    reasoning: str | None = None
    """A reasoning judge's thinking of the last attempt (wim/reasoning.py), never parsed;
    None when it gave none."""
    budget_exhausted: bool = False
    """The reply ended at judge.max_new_tokens before any answer (a reasoning judge that spent
    the budget thinking): no verdict, not retried at the same budget, not recorded."""


class Reply(NamedTuple):
    """One judge request's outcome, before parsing."""

    text: str
    error: str | None
    usage: Usage
    reasoning: str | None = None
    exhausted: bool = False


class Judge(ABC):
    """Judges a batch of (prompt, response) pairs: one `Judgement` per item, in input order.
    Output that fails to parse is retried up to `max_retries` times, then returned with
    `parse_ok=False` and `rating=None`; a backend failure is not retried here (the backend has
    its own retries) and comes back with `backend_failed=True`."""

    role: str = "external"
    model_name: str = ""
    #: Requests the judge's backend serves at once (`Backend.max_in_flight`); above 1, `judge`
    #: may be called from several threads at the same time (data_gen/flow.py).
    max_in_flight: int = 1

    @abstractmethod
    def judge(self, items: list[tuple[str, str]], seed: int = 0) -> list[Judgement]: ...

    def fit(self, items: list[tuple[str, str]], rule: str = "truncate",
            max_input_tokens: int | None = None) -> list[tuple[tuple[str, str] | None, bool]]:
        """Per item: ((prompt, response) to judge, or None to skip it; truncated?). This base
        judge knows no context limit."""
        return [(item, False) for item in items]


@dataclass(eq=False)  # a judge is itself, not equal to another with the same settings
class BackendJudge(Judge):
    backend: Backend
    _: KW_ONLY
    role: str
    model_name: str
    mode: str = "wim"
    prompt: str = "ours"
    criteria: str = ""
    instructions_in: str = "system"
    max_new_tokens: int = 64
    max_retries: int = 2
    retry_temperature: float = 0.7
    guided_json: bool = True

    def __post_init__(self) -> None:
        self.instructions = build_judge_instructions(self.criteria, self.mode, self.prompt)

    @property
    def max_in_flight(self) -> int:  # type: ignore[override]
        return self.backend.max_in_flight

    @property
    def served_model(self) -> str | None:
        """The model name a server judged by (an http backend; a served adapter's name for a
        changing judge), else None."""
        return self.backend.model if getattr(self.backend, "name", "") == "http" else None

    def judge(self, items: list[tuple[str, str]], seed: int = 0) -> list[Judgement]:
        results: list[Judgement | None] = [None] * len(items)
        spent = [Usage()] * len(items)
        echoed = [0] * len(items)

        def settle(i: int, reply: Reply, attempt: int) -> bool:
            raw, error = reply.text, reply.error
            spent[i] = spent[i] + reply.usage
            if reply.exhausted:
                error = exhausted_message("judge.max_new_tokens", self.max_new_tokens,
                                          reply.usage)
            parsed = parse_judgement(raw, self.mode, self.instructions) if error is None else None
            ok = parsed is not None and parsed.ok
            echoed[i] += parsed is not None and ECHOED_RUBRIC in (parsed.error or "")
            results[i] = Judgement(
                critique=parsed.critique if parsed else None,
                rating=parsed.rating if parsed else None,
                raw=raw,
                parse_ok=ok,
                error=None if ok else (error or parsed.error),
                attempts=attempt + 1,
                echoed_attempts=echoed[i],
                prompt_tokens=spent[i].prompt,
                completion_tokens=spent[i].completion,
                backend_failed=error is not None and not reply.exhausted,
                usage=spent[i],
                reasoning=reply.reasoning,
                budget_exhausted=reply.exhausted,
            )
            return parsed is not None and not ok  # only a parse failure is asked again

        ask_until_parsed(len(items), lambda todo, temperature, s: self._ask(
                             [items[i] for i in todo], temperature, s),
                         settle, seed=seed, max_retries=self.max_retries,
                         retry_temperature=self.retry_temperature)
        return results  # type: ignore[return-value]

    def fit(self, items, rule="truncate", max_input_tokens=None):
        """Fit each input into the judge's context (less max_new_tokens and the prefills):
        the prompt is cut from the middle (rule `truncate`) or the item skipped (`skip`); the
        response is never cut (wim/context.py)."""
        budget = token_budget(self.backend.context_tokens, self.max_new_tokens,
                              max_input_tokens, margin=8)
        out = []
        for prompt, response in items:
            def count(text: str, response: str = response) -> int:
                return self.backend.count_tokens(self._messages(text, response), MISSING_PREFILL)

            if budget is None or count(prompt) <= budget:
                out.append(((prompt, response), False))
                continue
            fitted = fit_text(prompt, budget, count) if rule == "truncate" else None
            out.append(((fitted, response), True) if fitted is not None else (None, False))
        return out

    def _messages(self, prompt: str, response: str) -> list[dict[str, str]]:
        return build_judge_messages(prompt, response, criteria=self.criteria, mode=self.mode,
                                    instructions_in=self.instructions_in, prompt_style=self.prompt)

    def _ask(self, items, temperature: float, seed: int) -> list[Reply]:
        """One `Reply` per item: the answer's text (a prefill included), without reasoning."""
        convs = [self._messages(p, r) for p, r in items]
        if not self.backend.supports_prefill:  # a server: JSON, where it takes a schema
            guided = (self.guided_json and self.prompt == "ours"
                      and self.backend.supports_json_schema)
            schema = judge_json_schema(self.mode, self.max_new_tokens) if guided else None
            limit = guided_max_tokens(self.mode, self.max_new_tokens) if guided \
                else self.max_new_tokens
            params = SamplingParams(limit, temperature, 1.0, json_schema=schema)
            head = ""
        elif self.prompt == "authors":
            return self._ask_authors(convs, temperature, seed)
        elif self.mode == "numeric":
            params, head = SamplingParams(4, temperature, 1.0, stop=("\n",)), RATING_PREFILL
        elif self.backend.supports_guide:
            # One call writes "Missing: <line>\nRating: <value>" (see wim/backends/guided.py).
            params = SamplingParams(self.max_new_tokens, temperature, 1.0,
                                    guide_label=RATING_PREFILL)
            head = MISSING_PREFILL
        else:
            steps = ask_in_two_steps(self.backend, convs, MISSING_PREFILL, RATING_PREFILL,
                                     self.max_new_tokens, temperature, seed)
            return [reply_of(text, crit, rate) for text, crit, rate in steps]
        outs = generate_one(self.backend, convs, params, seed, head or None)
        return [reply_of(head + o.text, o) for o in outs]

    def _ask_authors(self, convs, temperature: float, seed: int):
        """Explanation up to "[[", the rating up to "]]", then the critique up to "]]]"."""
        steps = [(SamplingParams(self.max_new_tokens, temperature, 1.0, stop=("[[",)), "\n[["),
                 (SamplingParams(4, temperature, 1.0, stop=("]]",)), "]]\n[[["),
                 (SamplingParams(self.max_new_tokens, temperature, 1.0, stop=("]]]",)), "]]]")]
        heads = [""] * len(convs)
        outs_of: list[list[Completion]] = [[] for _ in convs]
        for params, tail in steps:
            prefill = [h or None for h in heads] if any(heads) else None
            outs = generate_one(self.backend, convs, params, seed, prefill)
            for i, o in enumerate(outs):
                text = o.text.split("]")[0] if tail.startswith("]") else o.text.rstrip()
                heads[i] = heads[i] + text + tail
                outs_of[i].append(o)
        return [reply_of(h, *outs) for h, outs in zip(heads, outs_of, strict=True)]


def reply_of(text: str, *completions: Completion) -> Reply:
    """The `Reply` of the completions one judgement took (one, or one per step)."""
    thoughts = [c.reasoning for c in completions if c.reasoning]
    return Reply(text, next((c.failure for c in completions if c.failure), None),
                 sum((c.usage for c in completions), Usage()),
                 "\n\n".join(thoughts) if thoughts else None,
                 any(budget_exhausted(c) for c in completions))


def generate_one(backend: Backend, convs, params: SamplingParams, seed: int,
                 prefill: str | list[str] | None) -> list[Completion]:
    """One completion per conversation, its reasoning apart from its text (wim/reasoning.py)."""
    return [apart(c[0]) for c in backend.generate(convs, params, seed=seed, prefill=prefill)]


def ask_in_two_steps(backend: Backend, convs, prefill: str, label: str, max_new_tokens: int,
                     temperature: float, seed: int, top_logprobs: int = 0
                     ) -> list[tuple[str, Completion, Completion]]:
    """For a backend that prefills but cannot guide (llama.cpp): the text after `prefill` up to
    `label`, then `label` written for the model and its value on one line (with `top_logprobs`).
    Per conversation: (the whole text, the two completions)."""
    first = SamplingParams(max_new_tokens, temperature, 1.0, stop=(label.rstrip(":"),))
    reasons = generate_one(backend, convs, first, seed, prefill)
    heads = [prefill + o.text.rstrip() + "\n" + label for o in reasons]
    second = SamplingParams(4, temperature, 1.0, stop=("\n",), top_logprobs=top_logprobs)
    values = generate_one(backend, convs, second, seed, heads)
    return [(h + v.text, r, v) for h, r, v in zip(heads, reasons, values, strict=True)]


def configured_judge(j, backend: Backend, *, role: str, model_name: str,
                     mode: str | None = None) -> BackendJudge:
    """The judge that `j` (the config's `judge:` section) describes, on `backend`: the one
    place its settings become a BackendJudge (the pipeline, online DPO and `wim refine`)."""
    return BackendJudge(
        backend, role=role, model_name=model_name, mode=mode or j.mode, prompt=j.prompt,
        criteria=j.criteria, instructions_in=j.instructions_in,
        max_new_tokens=j.max_new_tokens, max_retries=j.max_retries,
        retry_temperature=j.retry_temperature, guided_json=j.guided_json,
    )
