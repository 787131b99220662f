"""Judge prompts: the chat messages that ask a judge what is missing from an answer.

Prompt building is kept apart from output parsing (wim/parsing.py); both are pure. The
instruction templates are package data (wim/data/judge_prompt*.txt) with one str.format field,
`{criteria}`. A caller that prefills starts the assistant turn with `MISSING_PREFILL`
(`RATING_PREFILL` in numeric mode) and later appends "\n" + `RATING_PREFILL`; the parser expects
the full assistant text, prefills included. `prompt="authors"` (wim mode only) asks for the WIM
authors' structure in our own words (judge_prompt_authors.txt): an explanation, `[[N]]`, then
`[[[what is missing]]]`.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

MISSING_PREFILL = "Missing:"
RATING_PREFILL = "Rating:"

MODES = ("wim", "numeric")
PROMPTS = ("ours", "authors")
INSTRUCTIONS_IN = ("system", "user")
_TEMPLATE_FILES = {"wim": "judge_prompt.txt", "numeric": "judge_prompt_numeric.txt",
                   "authors": "judge_prompt_authors.txt"}
# Shown instead of a blank answer, so that a small judge does not read the next line as the answer.
EMPTY_ANSWER = "(empty answer)"


# The guided JSON's critique is bounded so that the rating always fits after it in the judge's
# token budget (a critique that runs into judge.max_new_tokens leaves no rating: "no rating
# found"). The JSON around the critique, `{"missing": "` and `", "rating": 10}`, plus the
# whitespace a server's grammar may allow between the keys, stays under JSON_OVERHEAD_TOKENS;
# English text averages about 4 characters a token, CHARS_PER_TOKEN leaves room for rarer words.
JSON_OVERHEAD_TOKENS = 24
CHARS_PER_TOKEN = 2
DEFAULT_CRITIQUE_CHARS = 300  # no token budget given


def critique_max_chars(max_new_tokens: int | None) -> int:
    """The critique's `maxLength` in the guided JSON, from the judge's token budget."""
    if max_new_tokens is None:
        return DEFAULT_CRITIQUE_CHARS
    return max(8, CHARS_PER_TOKEN * (max_new_tokens - JSON_OVERHEAD_TOKENS))


def guided_max_tokens(mode: str, max_new_tokens: int) -> int:
    """The token limit of a guided judge request: judge.max_new_tokens, raised so that a
    critique of `maxLength` characters at one token each (digits, braces: the bundled judge
    wrote "10 out of 20 {is 10} {is 3}/...") still leaves room for the rating. The schema bounds
    characters, not tokens; without this, such a critique ended the JSON before its rating."""
    if mode != "wim":
        return max_new_tokens
    return max(max_new_tokens, critique_max_chars(max_new_tokens) + JSON_OVERHEAD_TOKENS)


def judge_json_schema(mode: str = "wim", max_new_tokens: int | None = None) -> dict:
    """The JSON a server is asked for (`judge.guided_json`): `{"missing": "...", "rating": N}`
    (numeric mode: only the rating). The parser reads it like the two-line format and checks
    every value itself."""
    if mode not in MODES:
        raise ValueError(f"judge mode must be one of {MODES}, got {mode!r}")
    # An enum rather than minimum/maximum: llama.cpp's schema-to-grammar ignores the bounds
    # (the bundled judge wrote "rating": 1000000000000000), and every server takes an enum.
    properties: dict = {"rating": {"type": "integer", "enum": list(range(1, 11))}}
    if mode == "wim":
        properties = {"missing": {"type": "string",
                                  "maxLength": critique_max_chars(max_new_tokens)},
                      **properties}
    return {"type": "object", "properties": properties, "required": list(properties),
            "additionalProperties": False}


@cache
def load_template(mode: str, prompt: str = "ours") -> str:
    """The raw instruction template for `mode` and `prompt`, read once."""
    if mode not in MODES:
        raise ValueError(f"judge mode must be one of {MODES}, got {mode!r}")
    if prompt not in PROMPTS:
        raise ValueError(f"judge prompt must be one of {PROMPTS}, got {prompt!r}")
    if prompt == "authors" and mode != "wim":
        raise ValueError("the authors' judge prompt asks for a critique: use mode 'wim'")
    name = _TEMPLATE_FILES["authors" if prompt == "authors" else mode]
    return resources.files("wim").joinpath("data", name).read_text(encoding="utf-8").strip()


def build_judge_instructions(criteria: str, mode: str = "wim", prompt: str = "ours") -> str:
    """The judge instructions with `criteria` (what the judge weighs) filled in; without
    criteria the sentence that names them is left out (not "Weigh .")."""
    template = load_template(mode, prompt)
    if not criteria.strip():
        template = template.replace(" Weigh {criteria}.", "")
    return template.format(criteria=criteria.strip())


def format_question_answer(prompt: str, response: str) -> str:
    """The question and the answer under their own labels, separated by a blank line."""
    answer = response.strip() or EMPTY_ANSWER
    return f"Question:\n{prompt.strip()}\n\nAnswer:\n{answer}"


def build_judge_messages(prompt: str, response: str, *, criteria: str, mode: str = "wim",
                         instructions_in: str = "system",
                         prompt_style: str = "ours") -> list[dict[str, str]]:
    """Chat messages for the judge, without the assistant prefill (the backend adds it).
    instructions_in 'user': everything in one user message (chat templates without a system
    role)."""
    if instructions_in not in INSTRUCTIONS_IN:
        raise ValueError(
            f"instructions_in must be one of {INSTRUCTIONS_IN}, got {instructions_in!r}"
        )
    instructions = build_judge_instructions(criteria, mode, prompt_style)
    question_answer = format_question_answer(prompt, response)
    if instructions_in == "system":
        return [
            {"role": "system", "content": instructions},
            {"role": "user", "content": question_answer},
        ]
    return [{"role": "user", "content": f"{instructions}\n\n{question_answer}"}]
