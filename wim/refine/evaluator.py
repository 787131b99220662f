"""The loop evaluator E_L and the verifier votes of the VRR policies.

E_L reads (question, answer) and returns, per answer:
- the WIM critique (what is missing) and its rating, from the project's judge (wim/judges.py);
- five criteria in [0, 1] (factuality, coherence, evidence support, depth of analysis,
  linguistic robustness), each written by the model as "N/10" after a prefilled label;
- an accept/reject verdict;
- diagnostic flags raised by fixed rules (`raise_flags`) on the answer and the critique, for
  the controller's penalty table.
A criterion or verdict that does not parse makes the whole evaluation fail; it is re-asked
(sampling, new seed) up to `max_retries` times, then returned with `scores=None` and counted:
never a neutral score. With `ensemble_n > 1` each answer is scored that many times (the first
greedy, the others sampled) and the parsed runs are averaged; the verdict is their majority
(a tie rejects).

Votes: M sampled yes/no answers to "is this answer correct and complete?"; an unparseable vote
is re-asked, and an answer whose M votes cannot be completed has `accepts=None` (counted).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from wim.backends import Backend, SamplingParams
from wim.judge_prompts import format_question_answer
from wim.judges import Judge
from wim.refine.controller import CRITERIA, Evaluation
from wim.retry import ask_until_parsed, attempt_seed

# What is prefilled before each value, one at a time: "Factuality:", ..., "Verdict:".
LABELS = {c: c.replace("_", " ").capitalize() + ":" for c in CRITERIA} | {"verdict": "Verdict:"}
VOTE_PREFILL = "Correct and complete (yes or no):"
# One worked example (an exchange before the real one) shows a small model the format; its
# numbers are written out, so a copy of them is at least a valid, if uninformative, answer.
EXAMPLE_QUESTION = "What is the boiling point of water at sea level?"
EXAMPLE_ANSWER = ("Water boils at 100 degrees Celsius (212 F) at sea level, because its vapour "
                  "pressure then equals the air pressure.")
EXAMPLE_SCORES = ("Factuality: 9/10\nCoherence: 8/10\nEvidence support: 6/10\n"
                  "Depth of analysis: 4/10\nLinguistic robustness: 8/10\nVerdict: accept")

INSTRUCTIONS = (
    "You evaluate an answer to a question. Rate it on five criteria, each from 0 to 10: "
    "factuality (are the statements true), coherence (is it logically organised), evidence "
    "support (are claims backed by reasons, facts or examples), depth of analysis, and "
    "linguistic robustness (clear, correct language). Write each as N/10 on its own line, then "
    "the verdict: accept if the answer is good enough to keep, reject otherwise."
)
STRICT = (" Be strict: give high marks only for what is clearly correct and complete, and "
          "reject unless the answer is clearly correct and complete.")
VOTE_INSTRUCTIONS = ("You check answers. Say yes if the answer to the question is correct and "
                     "complete, no otherwise.")

_NUMBER = re.compile(r"^\s*\**\s*(\d+(?:\.\d+)?)\s*(/\s*10)?")
_FLAG_RULES = {
    "unsupported_claim": re.compile(r"\b(unsupported|no evidence|without evidence|"
                                    r"unsubstantiated|not supported|no sources?)\b", re.I),
    "citation_mismatch": re.compile(r"\b(wrong|incorrect|mismatched|invalid|fake) "
                                    r"(citation|reference|source)s?\b|\bcitations? "
                                    r"(do(es)? not|don't) match", re.I),
    "contradiction": re.compile(r"\b(contradict\w*|inconsisten\w*)\b", re.I),
}


def parse_criterion(text: str) -> float | None:
    """'7/10', '7', ' 0.7' -> 0.7; anything else (or out of range) -> None."""
    m = _NUMBER.match(text)
    if not m:
        return None
    value = float(m.group(1))
    if m.group(2) or value > 1 or "." not in m.group(1):
        value = value / 10
    return value if 0.0 <= value <= 1.0 else None


_ACCEPT = ("accept", "accepted", "accepts", "keep", "yes")
_REJECT = ("reject", "rejected", "rejects", "no")
_VOTES = (dict.fromkeys(_ACCEPT + ("correct", "true", "right"), True)
          | dict.fromkeys(_REJECT + ("incorrect", "wrong", "false"), False))


def _first_word(text: str) -> str:
    return (re.sub(r"[^a-z]", " ", text.lower()).split() or [""])[0]


def parse_accept_reject(text: str) -> str | None:
    word = _first_word(text)
    return "accept" if word in _ACCEPT else "reject" if word in _REJECT else None


def parse_vote(text: str) -> bool | None:
    """yes/accept/correct/true -> True, no/reject/incorrect/wrong/false -> False, else None."""
    return _VOTES.get(_first_word(text))


def raise_flags(answer: str, critique: str | None) -> tuple[str, ...]:
    """The diagnostic flags of fixed rules (keys of the penalty table; config.FLAGS)."""
    flags = []
    if not answer.strip():
        flags.append("empty_answer")
    elif answer.rstrip()[-1] not in ".!?)\"'`*:;]":
        flags.append("truncated")  # no closing punctuation: most likely cut by the token cap
    flags += [flag for flag, rule in _FLAG_RULES.items() if critique and rule.search(critique)]
    return tuple(flags)


def _with_example(system: str, example_reply: str, content: str) -> list[dict[str, str]]:
    """The conversation: instructions, the worked example and its reply, the real exchange."""
    return [{"role": "system", "content": system},
            {"role": "user", "content": format_question_answer(EXAMPLE_QUESTION, EXAMPLE_ANSWER)},
            {"role": "assistant", "content": example_reply},
            {"role": "user", "content": content}]


@dataclass
class LoopEvaluation:
    evaluation: Evaluation
    critique: str | None
    wim_rating: int | None
    raw: list[str] = field(default_factory=list)
    failure: str | None = None
    attempts: int = 0
    tokens: int = 0


class LoopEvaluator:
    def __init__(self, backend: Backend, judge: Judge, *, strict: bool = False,
                 ensemble_n: int = 1, max_retries: int = 2,
                 retry_temperature: float = 0.7) -> None:
        self.backend, self.judge = backend, judge
        self.instructions = INSTRUCTIONS + (STRICT if strict else "")
        self.ensemble_n, self.max_retries = ensemble_n, max_retries
        self.retry_temperature = retry_temperature

    def evaluate(self, questions: list[str], answers: list[str],
                 seed: int = 0) -> list[LoopEvaluation]:
        judgements = self.judge.judge(list(zip(questions, answers, strict=True)), seed=seed)
        # Per answer, one run of each ensemble member: (values, failure, raw, tokens, attempts).
        runs = zip(*(self._score(questions, answers, judgements, seed + 104729 * e,
                                 greedy_first=e == 0) for e in range(self.ensemble_n)),
                   strict=True)
        out = []
        for answer, j, run in zip(answers, judgements, runs, strict=True):
            parsed = [r[0] for r in run if r[0] is not None]
            scores = verdict = None
            if parsed:
                scores = {c: sum(r[c] for r in parsed) / len(parsed) for c in CRITERIA}
                accepts = sum(r["verdict"] == "accept" for r in parsed)
                verdict = "accept" if accepts * 2 > len(parsed) else "reject"
            ev = Evaluation(scores, verdict, raise_flags(answer, j.critique))
            tokens = j.prompt_tokens + j.completion_tokens + sum(r[3] for r in run)
            out.append(LoopEvaluation(ev, j.critique, j.rating, [r[2] for r in run],
                                      None if parsed else run[-1][1], sum(r[4] for r in run),
                                      tokens))
        return out

    def _score(self, questions, answers, judgements, seed: int, greedy_first: bool):
        """Per item: (criteria + verdict or None, failure, raw text, tokens, attempts)."""
        results: list = [None] * len(answers)
        spent = [0] * len(answers)

        def ask(todo: list[int], temperature: float, seed: int):
            return self._ask([self._messages(questions[i], answers[i], judgements[i].critique)
                              for i in todo], temperature, seed)

        def settle(i: int, asked, attempt: int) -> bool:
            raw, values, failure, tokens = asked
            spent[i] += tokens
            results[i] = (values, failure, raw, spent[i], attempt + 1)
            return values is None  # a backend failure too is asked again here

        ask_until_parsed(len(answers), ask, settle, seed=seed, max_retries=self.max_retries,
                         retry_temperature=self.retry_temperature,
                         first_temperature=0.0 if greedy_first else self.retry_temperature)
        return results

    def _messages(self, question: str, answer: str, critique: str | None):
        note = f"\n\nA reviewer noted what is missing: {critique}" if critique else ""
        return _with_example(self.instructions, EXAMPLE_SCORES,
                             format_question_answer(question, answer) + note)

    def _ask(self, convs, temperature: float, seed: int):
        """Criteria one label at a time (prefilled), then the verdict."""
        heads = [""] * len(convs)
        values: list[dict | None] = [{} for _ in convs]
        failures: list[str | None] = [None] * len(convs)
        tokens = [0] * len(convs)
        for key, label in LABELS.items():
            heads = [h + ("\n" if h else "") + label for h in heads]
            params = SamplingParams(6, temperature, 1.0, stop=("\n",))
            outs = self.backend.generate(convs, params, seed=seed, prefill=list(heads))
            for i, [o] in enumerate(outs):
                tokens[i] += o.prompt_tokens + o.completion_tokens
                text = o.text.split("\n")[0]
                heads[i] += text
                if values[i] is None:
                    continue
                if not o.ok:
                    values[i], failures[i] = None, f"backend failed: {o.error}"
                    continue
                value = parse_accept_reject(text) if key == "verdict" else parse_criterion(text)
                if value is None:
                    values[i], failures[i] = None, f"{key} did not parse: {text.strip()!r}"
                else:
                    values[i][key] = value
        return list(zip(heads, values, failures, tokens, strict=True))

    def votes(self, questions: list[str], answers: list[str], m: int, temperature: float,
              seed: int = 0) -> list[tuple[int | None, int, int]]:
        """Per answer: (accepts of m votes or None, tokens, unparsed votes re-asked)."""
        convs = [_with_example(VOTE_INSTRUCTIONS, f"{VOTE_PREFILL} yes",
                               format_question_answer(q, a))
                 for q, a in zip(questions, answers, strict=True)]
        got: list[list[bool]] = [[] for _ in convs]
        tokens, redone = [0] * len(convs), [0] * len(convs)
        params = SamplingParams(2, temperature, 1.0, stop=("\n",))
        for attempt in range(self.max_retries + 1):
            need = {i: m - len(got[i]) for i in range(len(convs)) if len(got[i]) < m}
            if not need:
                break
            for n in sorted(set(need.values())):
                idx = [i for i, k in need.items() if k == n]
                outs = self.backend.generate([convs[i] for i in idx], params, n=n,
                                             seed=attempt_seed(seed, attempt) + n,
                                             prefill=VOTE_PREFILL)
                for i, samples in zip(idx, outs, strict=True):
                    votes = [parse_vote(o.text) if o.ok else None for o in samples]
                    got[i] += [vote for vote in votes if vote is not None]
                    redone[i] += votes.count(None)
                    tokens[i] += sum(o.completion_tokens for o in samples)
                    tokens[i] += samples[0].prompt_tokens if samples else 0
        return [(sum(g) if len(g) == m else None, t, r)
                for g, t, r in zip(got, tokens, redone, strict=True)]
