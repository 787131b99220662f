"""Judge output parsing (wim/parsing.py) and judge prompt building (wim/judge_prompts.py)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wim.judge_prompts import (
    MISSING_PREFILL,
    RATING_PREFILL,
    build_judge_messages,
    load_template,
)
from wim.parsing import (
    NOTHING_MISSING,
    ParsedJudgement,
    is_nothing_missing,
    normalize_critique,
    parse_judgement,
)

CRITERIA = "accuracy and the dosage caveats a pharmacist would add"
QUESTION = "Why is the sky blue?"
ANSWER = "Because of the way sunlight interacts with air."
STRICT_FORMAT = (
    'Missing: <one or two sentences naming what the answer left out, or "None">\n'
    "Rating: <one integer from 1 to 10>"
)


# --- exact cases -------------------------------------------------------------------------------


def test_clean_format() -> None:
    text = "Missing: The answer does not mention Rayleigh scattering.\nRating: 4"
    assert parse_judgement(text) == ParsedJudgement(
        critique="The answer does not mention Rayleigh scattering.", rating=4, ok=True, error=None
    )


def test_prefill_pieces_joined_by_the_caller() -> None:
    text = MISSING_PREFILL + " The year it was signed." + "\n" + RATING_PREFILL + " 6"
    assert parse_judgement(text) == ParsedJudgement("The year it was signed.", 6, True, None)


@pytest.mark.parametrize(
    "text",
    [
        "**Missing:** The treaty date.\n**Rating:** 7",
        "**Missing**: The treaty date.\n**Rating**: 7",
        "__Missing__: The treaty date.\n__Rating__ = **7**",
        "## Missing:\nThe treaty date.\n\n## Rating: 7",
        "- **Missing:** The treaty\ndate.\n- **Rating:** 7/10",
        "missing - The treaty date.\nrating - 7",
        "MISSING: The treaty date.\nRATING (1-10): 7.",
        "Missing: `The treaty date.`\nRating: `7`",
        "```\nMissing: The treaty date.\nRating: 7\n```",
        '{"missing": "The treaty date.", "rating": 7}',
        "Missing: **The treaty date.**\nRating: 7 out of 10",
        "Missing: Missing: The treaty date.\nRating: 7",
    ],
)
def test_markdown_and_wrappers(text: str) -> None:
    assert parse_judgement(text) == ParsedJudgement("The treaty date.", 7, True, None)


def test_noise_before_and_after() -> None:
    text = (
        "Sure! Here is my assessment of the answer.\n\n"
        "Missing: It never names the 1648 Peace of Westphalia.\n"
        "Rating: 5\n\n"
        "The answer is otherwise accurate, but this omission matters because 3 of 4 sources..."
    )
    result = parse_judgement(text)
    assert (result.critique, result.rating, result.ok) == (
        "It never names the 1648 Peace of Westphalia.",
        5,
        True,
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [("7", 7), ("7/10", 7), ("7 / 10", 7), ("**7**", 7), ("7.", 7), ("10", 10), ("1", 1)],
)
def test_valid_rating_forms(value: str, expected: int) -> None:
    result = parse_judgement(f"Missing: x\nRating: {value}")
    assert (result.rating, result.ok) == (expected, True)


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("0", "rating 0 outside 1..10"),
        ("11", "rating 11 outside 1..10"),
        ("-3", "rating -3 outside 1..10"),
        ("7.5", "rating 7.5 is not an integer"),
        ("7,5", "rating 7,5 is not an integer"),
        ("7-8", "rating 7-8 is a range, not one integer"),
        ("4/5", "rating 4/5 is not on the 1..10 scale"),
        ("seven", "rating 'seven' is not a number"),
        ("", "rating label without a value"),
    ],
)
def test_invalid_ratings_rejected(value: str, error: str) -> None:
    result = parse_judgement(f"Missing: The date.\nRating: {value}")
    assert result == ParsedJudgement("The date.", None, False, error)
    numeric = parse_judgement(f"Rating: {value}", mode="numeric")
    assert numeric == ParsedJudgement(None, None, False, error)


def test_huge_number_is_out_of_range_not_a_crash() -> None:
    result = parse_judgement("Missing: x\nRating: " + "9" * 10_000)
    assert (result.ok, result.rating) == (False, None)
    assert result.error is not None and result.error.endswith("outside 1..10")


def test_echoed_instructions_use_the_last_numeric_rating() -> None:
    text = f"{STRICT_FORMAT}\n\nMissing: The recommended adult dose.\nRating: 6"
    assert parse_judgement(text) == ParsedJudgement("The recommended adult dose.", 6, True, None)


def test_echoed_instructions_after_the_answer_do_not_hide_it() -> None:
    text = "Missing: The dose.\nRating: 6\n\n(Format was: Rating: <one integer from 1 to 10>)"
    assert parse_judgement(text) == ParsedJudgement("The dose.", 6, True, None)


def test_last_numeric_rating_wins_and_an_invalid_one_is_not_skipped() -> None:
    assert parse_judgement("Missing: x\nRating: 3\nRating: 8").rating == 8
    result = parse_judgement("Missing: x\nRating: 7\nRating: 11")
    assert result == ParsedJudgement("x", None, False, "rating 11 outside 1..10")


def test_bare_number_is_not_guessed() -> None:
    result = parse_judgement("Missing: The date.\nI would give it 7.")
    assert result == ParsedJudgement("The date. I would give it 7.", None, False, "no rating found")
    assert parse_judgement("7", mode="numeric").error == "no rating found"
    assert parse_judgement("My rating is 7", mode="numeric").error == "no rating found"


@pytest.mark.parametrize(
    "critique",
    [
        "",
        "None",
        "none.",
        "NONE",
        '"None"',
        "N/A",
        "n/a.",
        "Nothing",
        "Nothing is missing.",
        "nothing important is missing",
        "No missing content.",
        "The answer is complete.",
        "-",
        "**None**",
    ],
)
def test_nothing_missing_forms_give_empty_critique(critique: str) -> None:
    result = parse_judgement(f"Missing: {critique}\nRating: 10")
    assert result == ParsedJudgement("", 10, True, None)


def test_missing_field_required_in_wim_mode_only() -> None:
    text = "The answer is fine.\nRating: 7"
    assert parse_judgement(text) == ParsedJudgement(None, 7, False, "no 'Missing:' field")
    assert parse_judgement(text, mode="numeric") == ParsedJudgement(None, 7, True, None)


def test_numeric_mode_ignores_the_critique() -> None:
    result = parse_judgement("Missing: The date.\nRating: 3", mode="numeric")
    assert result == ParsedJudgement(None, 3, True, None)


def test_both_failures_are_reported() -> None:
    assert parse_judgement("").error == "no rating found; no 'Missing:' field"


def test_critique_keeps_inner_labels_and_identifiers() -> None:
    text = "Missing: The answer is missing: the `__init__.py` rating-scale step.\nRating: 5"
    assert parse_judgement(text).critique == (
        "The answer is missing: the __init__.py rating-scale step."
    )


def test_unknown_mode_raises() -> None:
    with pytest.raises(ValueError, match="judge mode"):
        parse_judgement("Rating: 5", mode="stars")


def test_huge_and_odd_inputs_do_not_raise() -> None:
    odd = [
        "\x00\x01\ufffd\u202e Rating: \u0667",
        "rating: missing: " * 50_000,
        "Missing: x" + " *" * 50_000 + " y\nRating: 2",
        "Rating (" * 50_000,
        "'\"" * 50_000,
    ]
    for text in odd:
        for mode in ("wim", "numeric"):
            assert isinstance(parse_judgement(text, mode), ParsedJudgement)
    assert parse_judgement("Missing: x" + " *" * 50_000 + " y\nRating: 2").rating == 2


def test_nothing_missing_helpers() -> None:
    assert all(is_nothing_missing(form) for form in NOTHING_MISSING)
    assert is_nothing_missing("  Nothing   IS missing!  ")
    assert not is_nothing_missing("None of the side effects.")
    assert normalize_critique("  N/A. ") == ""
    assert normalize_critique("  The side effects.\n") == "The side effects."


# --- properties --------------------------------------------------------------------------------

_LABEL_WORDS = re.compile("rating|missing", re.IGNORECASE)
noise = st.text(max_size=200).filter(lambda s: _LABEL_WORDS.search(s) is None)


@settings(deadline=None)
@given(st.text())
def test_never_raises_on_any_text(text: str) -> None:
    for mode in ("wim", "numeric"):
        result = parse_judgement(text, mode)
        assert result.ok == (result.error is None)
        assert result.rating is None or 1 <= result.rating <= 10


@settings(deadline=None)
@given(st.integers(min_value=1, max_value=10), noise, noise)
def test_valid_rating_found_in_any_noise(rating: int, prefix: str, suffix: str) -> None:
    result = parse_judgement(f"{prefix}\nMissing: the x\nRating: {rating}\n{suffix}")
    assert result == ParsedJudgement("the x", rating, True, None)
    numeric = parse_judgement(f"{prefix}\nRating: {rating}\n{suffix}", mode="numeric")
    assert (numeric.rating, numeric.ok) == (rating, True)


@settings(deadline=None)
@given(st.sampled_from(["0", "11", "7.5"]), noise, noise)
def test_invalid_rating_rejected_in_any_noise(value: str, prefix: str, suffix: str) -> None:
    for mode in ("wim", "numeric"):
        result = parse_judgement(f"{prefix}\nMissing: the x\nRating: {value}\n{suffix}", mode)
        assert (result.ok, result.rating) == (False, None)


# --- judge prompts -----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["wim", "numeric"])
@pytest.mark.parametrize("instructions_in", ["system", "user"])
def test_build_judge_messages(mode: str, instructions_in: str) -> None:
    messages = build_judge_messages(
        QUESTION, ANSWER, criteria=CRITERIA, mode=mode, instructions_in=instructions_in
    )
    roles = [m["role"] for m in messages]
    assert roles == (["system", "user"] if instructions_in == "system" else ["user"])
    instructions, user = messages[0]["content"], messages[-1]["content"]
    assert CRITERIA in instructions
    assert user.endswith(f"Question:\n{QUESTION}\n\nAnswer:\n{ANSWER}")
    assert "{criteria}" not in instructions
    assert "Rating: <one integer from 1 to 10>" in instructions
    assert (STRICT_FORMAT in instructions) == (mode == "wim")
    assert ("Missing:" in instructions) == (mode == "wim")
    if instructions_in == "system":
        assert CRITERIA not in user and QUESTION not in instructions


def test_question_and_answer_are_not_formatted() -> None:
    messages = build_judge_messages("Use {x} in f'{y}'?", "{criteria} }{", criteria="c")
    assert messages[1]["content"] == "Question:\nUse {x} in f'{y}'?\n\nAnswer:\n{criteria} }{"


def test_empty_answer_is_shown_as_such() -> None:
    content = build_judge_messages(QUESTION, "  \n", criteria="c")[1]["content"]
    assert content.endswith("Answer:\n(empty answer)")


def test_templates_have_only_the_criteria_field() -> None:
    for mode in ("wim", "numeric"):
        fields = re.findall(r"{([^{}]*)}", load_template(mode))
        assert fields == ["criteria"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"mode": "stars"}, "judge mode"), ({"instructions_in": "assistant"}, "instructions_in")],
)
def test_build_judge_messages_rejects_unknown_options(kwargs: dict[str, str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build_judge_messages(QUESTION, ANSWER, criteria="c", **kwargs)


# --- the authors' format and echoed rubrics --------------------------------------------------


@pytest.mark.parametrize("text, rating, critique", [
    ("Accurate but thin.\n[[6]]\n[[[It never says when it was signed.]]]", 6,
     "It never says when it was signed."),
    ("Complete and correct. [[10]] [[[]]]", 10, ""),
    ("Fine. [[ 8 ]]\n[[[None]]]", 8, ""),
    ("First I thought [[3]], but on reflection [[7]].\n[[[a]]] then [[[The dosage.]]]", 7,
     "The dosage."),
])
def test_authors_format(text: str, rating: int, critique: str) -> None:
    parsed = parse_judgement(text)
    assert parsed.ok and parsed.rating == rating and parsed.critique == critique


@pytest.mark.parametrize("text, error", [
    ("Good answer. [[8]]", "no '[[[...]]]' field"),
    ("Hmm. [[7.5]] [[[x]]]", "rating 7.5 is not an integer"),
    ("Hmm. [[eleven]] [[[x]]]", "is not a number"),
    ("Hmm. [[11]] [[[x]]]", "outside 1..10"),
])
def test_authors_format_failures(text: str, error: str) -> None:
    parsed = parse_judgement(text)
    assert not parsed.ok and error in parsed.error


def test_authors_format_in_numeric_mode_needs_no_critique() -> None:
    parsed = parse_judgement("Good. [[9]]", mode="numeric")
    assert parsed.ok and parsed.rating == 9 and parsed.critique is None


# Real critiques the bundled SmolLM2 judge wrote in the quickstart (the scale echoed back).
ECHOES = [
    "10 = nothing, 7-9 = minor points missing, 4-6 = a point that matters is missing, 1-3 = most",
    "10 = nothing is missing, 7-9 = a point that matters is missing",
    "10 = nothing about the answer is missing.",
    "10 = nothing, 10 = nothing, 10 = nothing",
]


@pytest.mark.parametrize("critique", ECHOES)
def test_echoed_scale_is_a_failure_with_its_own_reason(critique: str) -> None:
    parsed = parse_judgement(f"Missing: {critique}\nRating: 10")
    assert not parsed.ok and parsed.error == "echoed rubric"
    assert parsed.critique is None and parsed.rating == 10  # the rating is still reported


def test_copied_instructions_are_an_echo_only_against_those_instructions() -> None:
    from wim.judge_prompts import build_judge_instructions

    instructions = build_judge_instructions("accuracy")
    text = ("Missing: specific content a careful, complete answer would include but this one "
            "leaves out\nRating: 5")
    assert parse_judgement(text, instructions=instructions).error == "echoed rubric"
    assert parse_judgement(text).ok  # without the instructions there is nothing to compare


@pytest.mark.parametrize("critique", [
    "It does not give the dosage or warn about stomach bleeding.",
    "The year, 1789, and the storming of the Bastille.",
    "Step 3 of the proof, where x = 2 is substituted.",
])
def test_real_critiques_are_not_echoes(critique: str) -> None:
    from wim.judge_prompts import build_judge_instructions

    parsed = parse_judgement(f"Missing: {critique}\nRating: 6",
                             instructions=build_judge_instructions("accuracy"))
    assert parsed.ok and parsed.critique == critique


def test_authors_prompt_asks_for_their_structure_in_the_system_turn() -> None:
    messages = build_judge_messages(QUESTION, ANSWER, criteria=CRITERIA, prompt_style="authors")
    assert [m["role"] for m in messages] == ["system", "user"]
    instructions = messages[0]["content"]
    assert "[[" in instructions and "[[[]]]" in instructions and CRITERIA in instructions
    for word in ("knowledge", "depth", "creativity", "detail"):
        assert word in instructions
    assert "Missing:" not in instructions  # not our format
    with pytest.raises(ValueError, match="mode 'wim'"):
        build_judge_messages(QUESTION, ANSWER, criteria="c", mode="numeric",
                             prompt_style="authors")


@pytest.mark.parametrize("mode", ["wim", "numeric"])
def test_instructions_without_criteria_leave_out_the_sentence_naming_them(mode: str) -> None:
    from wim.judge_prompts import build_judge_instructions

    assert "Weigh accuracy." in build_judge_instructions("accuracy", mode)
    empty = build_judge_instructions("  ", mode)
    assert "Weigh" not in empty and " ." not in empty
    assert empty.startswith(build_judge_instructions("accuracy", mode).split(" Weigh")[0])


@pytest.mark.parametrize("critique", ["It lacks the date. Rating: 0", "It lacks [[3]] the date.",
                                      "Rating: 11 is not what it says.", "[[[the date]]]"])
def test_guided_json_keeps_its_own_rating_and_critique(critique: str) -> None:
    """A server's guided JSON is read by its keys: a critique that mentions a rating, or the
    authors' [[N]] / [[[...]]] markup, neither replaces the JSON's rating nor is cut short."""
    import json

    text = json.dumps({"missing": critique, "rating": 7})
    assert parse_judgement(text) == ParsedJudgement(critique, 7, True, None)
    assert parse_judgement(text, "numeric") == ParsedJudgement(None, 7, True, None)


@pytest.mark.parametrize(("rating", "error"), [(0, "rating 0 outside 1..10"),
                                               (7.5, "rating 7.5 is not an integer"),
                                               ("seven", "rating 'seven' is not a number")])
def test_guided_json_ratings_follow_the_text_rules(rating, error: str) -> None:
    import json

    result = parse_judgement(json.dumps({"missing": "The date.", "rating": rating}))
    assert (result.rating, result.ok, result.error) == (None, False, error)
