"""The blind outcome evaluator: which answer to a question is better, seen without context.

It sees only the question and the answer(s): its public methods take nothing else, and the
text it sends to its backend is one fixed template (wim/data/blind_*.txt) plus those texts (a
test records what a real server receives). It never sees the run, the round, the judge, the
scores or the config, so the training signal cannot game it.

- `pairwise`: each pair is judged in both orders (A/B, then B/A) to cancel position bias; a
  winner counts only when both orders name the same answer, anything else that parsed is a tie.
  Two identical answers are a tie without a call (both orders would be the same prompt).
- `pointwise`: one 1-10 score N per answer, mapped to [0, 1] as (N - 1) / 9.
- Weighted verdicts (`verdict="weighted"`, the default, as AlpacaEval's weighted annotators):
  each order also gives the probabilities of A, B and tie at the verdict token, and per prompt
  the preference for a is p = (P_ab(a better) + P_ba(a better)) / 2, a tie's probability split
  in half, so position bias cancels by construction. An order without probabilities counts its
  hard verdict as probability 1 (source `hard`), and the caller counts and reports those.
  `verdict="hard"`: the text alone.
  docs/design.md, "Blind outcome evaluation", says where each backend's probabilities come from
  and how local backends are walked through the format.
- A verdict that does not parse, or whose reason copies a placeholder of the template ("<one
  short sentence>": the format filled in, not an opinion), is re-asked (sampling at
  `retry_temperature`, new seed) up to `max_retries` times, then recorded as a failure with
  its reason and the raw texts: never a win for either side, never a neutral score. A backend
  failure is a failure too (`failure` starts with "backend failed").
"""

from __future__ import annotations

import logging
import re
from functools import cache
from importlib import resources

from wim.backends import Backend, Completion, SamplingParams
from wim.blind_verdicts import (
    PairVerdict,
    PointVerdict,
    combine_orders,
    order_verdicts,
    verdict_probabilities,
    verdict_schema,
)
from wim.judge_prompts import EMPTY_ANSWER, format_question_answer, guided_max_tokens
from wim.judges import ask_in_two_steps, generate_one
from wim.reasoning import budget_exhausted, exhausted_message
from wim.retry import ask_until_parsed

logger = logging.getLogger(__name__)

REASON_PREFILL = "Reason:"
VERDICT_LABEL = "Verdict:"
SCORE_LABEL = "Score:"
MODES = ("pairwise", "pointwise")
VERDICTS = ("weighted", "hard")
TOP_LOGPROBS = 8
"""Most likely tokens asked for per position (vLLM's default cap is 20)."""
NO_LOGPROBS = "hard verdicts: the evaluator gives no token probabilities"

# The last "Verdict" label counts (a model that restates the format writes "Verdict: <A if ...>"
# first). A and B must be capitals, so "Verdict: a tie" is read as a tie, not as A.
_VERDICT = re.compile(r"(?i:verdict)[\s*_\"']*[:=\-][\s*_\"'\[(]*(?P<v>[^\s*_\"'\])]*)"
                      r"(?:[ \t]+(?P<w>\w+))?")
_SCORE = re.compile(r"(?i:score)[\s*_\"']*[:=\-][\s*_\"'\[(]*(?P<v>[^\s*_\"'\])]*)")
# The values a local guided backend may write after each label.
_CHOICES = {"Verdict:": ("A", "B", "tie"), "Score:": tuple(str(n) for n in range(1, 11))}
_TIE_WORDS = {"tie", "tied", "equal", "draw", "same", "both", "neither"}


@cache
def load_blind_template(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"blind evaluator mode must be one of {MODES}, got {mode!r}")
    return resources.files("wim").joinpath("data", f"blind_{mode}.txt").read_text().strip()


def _answer(text: str) -> str:
    return text.strip() or EMPTY_ANSWER


def build_pair_messages(question: str, first: str, second: str) -> list[dict[str, str]]:
    """The template (system turn), then the question and the two answers as A and B."""
    user = (f"Question:\n{question.strip()}\n\nAnswer A:\n{_answer(first)}\n\n"
            f"Answer B:\n{_answer(second)}")
    return [{"role": "system", "content": load_blind_template("pairwise")},
            {"role": "user", "content": user}]


def build_point_messages(question: str, answer: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": load_blind_template("pointwise")},
            {"role": "user", "content": format_question_answer(question, answer)}]


@cache
def placeholders(mode: str) -> tuple[str, ...]:
    """The `<...>` placeholders of a template, as a model copies them."""
    return tuple(m.lower() for m in re.findall(r"<[^<>\n]+>", load_blind_template(mode)))


def copied_placeholder(text: str, mode: str) -> str | None:
    """The template placeholder the text copies (case-insensitive), if any."""
    return next((p for p in placeholders(mode) if p in text.lower()), None)


def _last_label(text: str, mode: str, pattern: re.Pattern, label: str):
    """(the last match of the label, None) or (None, reason: no label, a copied placeholder)."""
    copied = copied_placeholder(text, mode)
    if copied:
        return None, f"copied the template placeholder {copied!r}"
    found = list(pattern.finditer(text))
    return (found[-1], None) if found else (None, f"no '{label}' line")


def parse_verdict(text: str) -> tuple[str | None, str | None]:
    """("A" | "B" | "tie", None) or (None, reason) from the last "Verdict" label."""
    found, failure = _last_label(text, "pairwise", _VERDICT, VERDICT_LABEL)
    if failure:
        return None, failure
    value = found.group("v").rstrip(".,;:!")
    if value.lower() in ("a", "an") and (found.group("w") or "").lower() in _TIE_WORDS:
        value = "tie"  # "Verdict: a tie"
    if value in ("A", "B"):
        return value, None
    if value.lower() in _TIE_WORDS:
        return "tie", None
    return None, f"verdict {value[:20]!r} is not A, B or tie"


def parse_score(text: str) -> tuple[int | None, str | None]:
    """(N in 1..10, None) or (None, reason) from the last "Score" label (`7` or `7/10`)."""
    found, failure = _last_label(text, "pointwise", _SCORE, SCORE_LABEL)
    if failure:
        return None, failure
    value = found.group("v").rstrip(".,;:!")
    value = value[:-3] if value.endswith("/10") else value
    if not value.isdigit() or not 1 <= int(value) <= 10:
        return None, f"score {value[:20]!r} is not an integer from 1 to 10"
    return int(value), None


class BlindEvaluator:
    """Judges answers by question and answer only (see the module docstring)."""

    def __init__(self, backend: Backend, *, max_retries: int = 2, max_new_tokens: int = 48,
                 seed: int = 0, retry_temperature: float = 0.7, model_name: str = "",
                 verdict: str = "weighted") -> None:
        if verdict not in VERDICTS:
            raise ValueError(f"blind verdict must be one of {VERDICTS}, got {verdict!r}")
        self.verdict = verdict
        self.verdict_note: str | None = None  # why the verdicts are hard when weighted was asked
        self.backend = backend
        self.max_retries = max_retries
        self.max_new_tokens = max_new_tokens
        self.seed = seed
        self.retry_temperature = retry_temperature
        self.model_name = model_name or getattr(backend, "label", "") or backend.name

    def pairwise(self, questions: list[str], answers_a: list[str],
                 answers_b: list[str]) -> list[PairVerdict]:
        """One verdict per question: is answer a or b better? Both orders are asked."""
        if not len(questions) == len(answers_a) == len(answers_b):
            raise ValueError("pairwise needs as many answers_a and answers_b as questions")
        ask = [i for i, (a, b) in enumerate(zip(answers_a, answers_b, strict=True))
               if a.strip() != b.strip()]
        convs = [build_pair_messages(questions[i], answers_a[i], answers_b[i]) for i in ask]
        convs += [build_pair_messages(questions[i], answers_b[i], answers_a[i]) for i in ask]
        results = self._ask_all(convs, VERDICT_LABEL, parse_verdict)
        out = [PairVerdict("tie", None, [], 0, identical=True) for _ in questions]
        for k, i in enumerate(ask):
            (v1, f1, raw1, t1, p1), (v2, f2, raw2, t2, p2) = results[k], results[len(ask) + k]
            failed = (("a/b", f1), ("b/a", f2))
            failure = "; ".join(f"order {o}: {f}" for o, f in failed if f) or None
            out[i] = PairVerdict(None if failure else combine_orders(v1, v2), failure,
                                 raw1 + raw2, t1 + t2, orders=order_verdicts(v1, v2),
                                 probs=(None, None) if failure else (p1, p2),
                                 path="guided" if self.backend.supports_guide else "top_logprobs")
        return out

    def pointwise(self, questions: list[str], answers: list[str]) -> list[PointVerdict]:
        """One score in [0, 1] per (question, answer)."""
        if len(questions) != len(answers):
            raise ValueError("pointwise needs one answer per question")
        convs = [build_point_messages(q, a) for q, a in zip(questions, answers, strict=True)]
        return [PointVerdict(None if f else (v - 1) / 9, f, raw, t)
                for v, f, raw, t, _ in self._ask_all(convs, SCORE_LABEL, parse_score)]

    def _ask_all(self, convs, label: str, parse):
        """Per conversation: (value, failure, raw texts, tokens, verdict probabilities or None).
        Parse failures are retried; a backend failure is final (the backend has its own)."""
        values: list = [None] * len(convs)
        probs: list = [None] * len(convs)
        failures: list[str | None] = [None] * len(convs)
        raws: list[list[str]] = [[] for _ in convs]
        tokens = [0] * len(convs)

        def ask(todo: list[int], temperature: float, seed: int):
            outs = self._ask([convs[i] for i in todo], label, temperature, seed)
            self._check_logprobs()
            return outs

        def settle(i: int, out, attempt: int) -> bool:
            text, error, spent, top = out
            raws[i].append(text)
            tokens[i] += spent
            if error is not None:
                failures[i] = error
                return False
            values[i], failures[i] = parse(text)
            if failures[i] is not None:
                return True
            if self._weighted(label):
                probs[i] = verdict_probabilities(top, values[i])
            return False

        for i in ask_until_parsed(len(convs), ask, settle, seed=self.seed,
                                  max_retries=self.max_retries,
                                  retry_temperature=self.retry_temperature):
            failures[i] = f"{failures[i]} (after {self.max_retries + 1} attempts)"
        return list(zip(values, failures, raws, tokens, probs, strict=True))

    def _check_logprobs(self) -> None:
        """Weighted verdicts turn hard, both orders as before, once the server has refused
        `logprobs` (wim/backends/http_fields.py): no probability is made up."""
        if self.verdict == "weighted" and not getattr(self.backend, "gives_logprobs", True):
            self.verdict, self.verdict_note = "hard", NO_LOGPROBS
            logger.warning("the blind evaluator's server refused logprobs: %s", NO_LOGPROBS)

    def _weighted(self, label: str) -> bool:
        return self.verdict == "weighted" and label == VERDICT_LABEL

    def _ask(self, convs, label: str, temperature: float, seed: int):
        """(text, backend error or None, tokens, top_logprobs of the value) per conversation."""
        if not convs:
            return []
        b = self.backend
        top = TOP_LOGPROBS if self._weighted(label) else 0
        head = ""
        if b.supports_prefill and b.supports_guide:
            params = SamplingParams(self.max_new_tokens, temperature, 1.0, guide_label=label,
                                    guide_choices=_CHOICES[label], top_logprobs=top)
            head = REASON_PREFILL
        elif b.supports_prefill:  # llama.cpp: the reason, then the label is written for it
            steps = ask_in_two_steps(b, convs, REASON_PREFILL, label, self.max_new_tokens,
                                     temperature, seed, top)
            return [(text, o1.failure or o2.failure, _tokens(o1) + _tokens(o2), o2.top_logprobs)
                    for text, o1, o2 in steps]
        elif top and b.supports_json_schema:  # the verdict as an enum (verdict_schema)
            limit = guided_max_tokens("wim", self.max_new_tokens)  # a reason sized as a critique
            params = SamplingParams(limit, temperature, 1.0, top_logprobs=top,
                                    json_schema=verdict_schema(self.max_new_tokens))
        else:
            params = SamplingParams(self.max_new_tokens, temperature, 1.0, top_logprobs=top)
        outs = generate_one(b, convs, params, seed, head or None)
        return [(head + o.text, o.failure or self._exhausted(o), _tokens(o), o.top_logprobs)
                for o in outs]

    def _exhausted(self, o: Completion) -> str | None:
        """The failure of a reply that spent blind.max_new_tokens before any verdict (a
        reasoning evaluator): not retried, since the same budget would end the same way."""
        if not budget_exhausted(o):
            return None
        return exhausted_message("blind.max_new_tokens", self.max_new_tokens, o.usage)

    def close(self) -> None:
        self.backend.close()


def _tokens(completion: Completion) -> int:
    return completion.prompt_tokens + completion.completion_tokens


def open_blind_evaluator(cfg, backend: Backend | None = None) -> BlindEvaluator:
    """The evaluator of `cfg.blind` (`cfg` a Config; with `blind.backend: http`, its endpoint is
    `blind.http` over `http:`). `backend`: an already open one to share (wim refine passes its
    policy when `blind:` names the same local model), else opened from `blind:`."""
    from wim.backends import open_backend
    from wim.config import blind_http

    section = cfg.blind
    http = blind_http(cfg) if section.backend == "http" else None
    model = http.model if http else section.model
    if backend is None:
        backend = open_backend(section.backend, model, http,
                               batch_size=section.batch_size or 8, dtype=section.dtype)
    return BlindEvaluator(backend, max_retries=section.max_retries,
                          max_new_tokens=section.max_new_tokens, seed=section.seed,
                          retry_temperature=section.retry_temperature, model_name=model,
                          verdict=section.verdict)
