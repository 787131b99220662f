"""Guided judge format for local transformers judges, in one generate call.

The judge's assistant turn starts with "Missing:" (prefill). `FormatGuide` lets each row write
one line of critique (which may not start with a newline or a number: a critique that starts
"10 = ..." copies the rating scale), then forces the tokens of "Rating:" and allows a few digit
tokens for the number (as a server's JSON schema asks for an integer). Without it, the rating
would need a second call that re-reads the whole prompt, and on a CPU reading the prompt costs
more than writing the answer. The guide only decides *where* the rating goes and that it is
written in digits; which number is the model's choice, and the parser still checks it (0 or
11 still fail).

With `choices` (the blind evaluator's "A", "B", "tie"), the value is restricted to those strings:
the model's most likely valid choice is taken. With `record=True` that step's log-softmax over
the allowed first tokens is kept, which the backend returns as `Completion.top_logprobs`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import LogitsProcessor, StoppingCriteria


@dataclass
class _Row:
    phase: int = 0  # 0 critique, 1 forcing the label, 2 the rating value, 3 done
    forced: list[int] = field(default_factory=list)
    count: int = 0  # tokens written in the current phase
    seen_text: bool = False
    value: list[int] = field(default_factory=list)  # tokens of the value (phase 2)
    value_top: dict[str, float] = field(default_factory=dict)  # with `record`: at value_position
    value_position: int = -1
    steps: int = 0  # tokens this row has generated so far


class FormatGuide(LogitsProcessor):
    """A logits processor; `stopper()` is the matching per-row stopping criterion."""

    def __init__(self, tokenizer, prompt_len: int, batch: int, label: str,
                 max_critique_tokens: int, choices: tuple[str, ...], end_ids: list[int],
                 record: bool) -> None:
        self.prompt_len = prompt_len
        self.tokenizer = tokenizer
        self.record = record
        self.label_ids = tokenizer.encode(label, add_special_tokens=False)
        self.newline_label_ids = tokenizer.encode("\n" + label, add_special_tokens=False)
        self.max_critique_tokens = max_critique_tokens
        self.end_ids = sorted(set(end_ids))  # the tokens that end the turn
        self.newline_ids, self.text_ids, number_ids, digit_ids = _token_classes(tokenizer)
        self.newline_list = sorted(self.newline_ids)
        self.number_list = sorted(number_ids)
        # The value: digits only (as a server's JSON schema asks for an integer); after the
        # first digit, also the end of the line or of the turn.
        self.digit_list = sorted(digit_ids)
        self.digit_or_end = sorted({*digit_ids, *self.newline_ids, *self.end_ids})
        self.rows = [_Row() for _ in range(batch)]
        self.choices = [tokenizer.encode(prefix + c, add_special_tokens=False)
                        for c in choices for prefix in ("", " ")]
        self.max_value_tokens = max(len(c) for c in self.choices) + 1 if self.choices else 3

    def _allowed(self, value: list[int]) -> list[int]:
        """Tokens that continue `value` towards a choice (+ a newline once one is complete)."""
        n = len(value)
        nxt = {c[n] for c in self.choices if len(c) > n and c[:n] == value}
        if value in self.choices:
            nxt.add(self.newline_list[0])
        return sorted(nxt)

    def _value_ends(self, value: list[int]) -> bool:
        """The value is complete: its last token ends the line or the turn, it has
        `max_value_tokens`, or it is a choice that no other choice extends."""
        last = value[-1]
        if last in self.newline_ids or last in self.end_ids or len(value) >= self.max_value_tokens:
            return True
        return bool(self.choices) and value in self.choices and not any(
            len(c) > len(value) and c[:len(value)] == value for c in self.choices)

    def stopper(self) -> StoppingCriteria:
        guide = self

        class _Done(StoppingCriteria):
            def __call__(self, input_ids, scores, **kwargs):
                return guide.done(input_ids, scores)

        return _Done()

    def _advance(self, row: _Row, token: int) -> None:
        row.steps += 1
        if row.phase == 0:
            row.count += 1
            if token in self.newline_ids and row.seen_text:
                row.phase, row.forced = 1, list(self.label_ids)
            elif row.count >= self.max_critique_tokens:
                row.phase, row.forced = 1, list(self.newline_label_ids)
            row.seen_text = row.seen_text or token in self.text_ids
        elif row.phase == 1:
            row.forced.pop(0)
            if not row.forced:
                row.phase, row.count = 2, 0
        elif row.phase == 2:
            row.count += 1
            row.value.append(token)
            if self._value_ends(row.value):
                row.phase = 3

    def __call__(self, input_ids, scores):
        """Logits processor: update each row's phase from its last token, then mask."""
        generated = input_ids.shape[1] - self.prompt_len
        for i, row in enumerate(self.rows):
            if generated > 0:
                self._advance(row, int(input_ids[i, -1]))
            if row.phase == 1:
                # 0, not the model's logit: a top-p filter before us may have set it to -inf.
                scores[i, :] = float("-inf")
                scores[i, row.forced[0]] = 0.0
            elif row.phase == 2:
                allowed = (self._allowed(row.value) if self.choices
                           else self.digit_list if row.count == 0 else self.digit_or_end)
                kept = scores[i, allowed].clone()
                if torch.isinf(kept).all():  # a filter before us masked them all
                    kept.zero_()
                if self.record and self.choices and row.count == 0:
                    logp = torch.log_softmax(kept.float(), dim=-1).tolist()
                    row.value_top = {self.tokenizer.decode([t]): lp
                                     for t, lp in zip(allowed, logp, strict=True)}
                    row.value_position = row.steps
                scores[i, :] = float("-inf")
                scores[i, allowed] = kept
            elif row.phase == 0:
                # The critique may not end the turn: the rating has to follow it.
                scores[i, self.end_ids] = float("-inf")
                if not row.seen_text:
                    # Nor start with a newline, or with a number: a critique names what is
                    # missing, while a small judge that starts with "10 = ..." copies the
                    # rating scale (an echoed rubric, asked again at a cost).
                    scores[i, self.newline_list] = float("-inf")
                    scores[i, self.number_list] = float("-inf")
        return scores

    def done(self, input_ids, scores) -> torch.Tensor:
        """A row is done once its value is written (the last token, not yet seen, may end it)."""
        generated = input_ids.shape[1] - self.prompt_len
        rows = [self._value_ends([*row.value, int(input_ids[i, -1])]) and generated > 0
                if row.phase == 2 else row.phase == 3 for i, row in enumerate(self.rows)]
        return torch.tensor(rows, dtype=torch.bool, device=input_ids.device)


_CLASSES: dict[int, tuple[frozenset[int], ...]] = {}


def _token_classes(tokenizer) -> tuple[frozenset[int], ...]:
    """(newline, letter, number, digits): the ids whose text holds a newline, holds a letter,
    starts with a digit or "=" after spaces, or is digits after an optional space; cached."""
    key = id(tokenizer)
    if key not in _CLASSES:
        pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        texts = [tokenizer.convert_tokens_to_string([p]) if p is not None else "" for p in pieces]
        newline = frozenset(i for i, t in enumerate(texts) if "\n" in t)
        text = frozenset(i for i, t in enumerate(texts) if any(c.isalpha() for c in t))
        number = frozenset(i for i, t in enumerate(texts)
                           if t.strip() and (t.strip()[0].isdigit() or t.strip()[0] == "="))
        digits = frozenset(i for i, t in enumerate(texts) if t.lstrip(" ").isdigit())
        _CLASSES[key] = (newline, text, number, digits)
    return _CLASSES[key]
