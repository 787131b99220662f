"""One base class for user errors, so the CLI can tell them from bugs.

A `WimError` is the user's to fix (a config value, an input file, a run directory, a model that
is not installed): the CLI prints its message as one paragraph and exits with code 2.
`StageIncomplete` is neither: nothing is wrong with the input, and the same command will finish
the work (exit 3). Any other exception, including a ValueError raised inside transformers or
TRL, is a bug or a library failure and keeps its traceback. This module imports nothing, so
every module can use it.
"""


class WimError(Exception):
    """A problem the user can fix; the message says what to change."""


class InputError(WimError):
    """A stage's input cannot be used (no pairs to train on, judgements that do not fit the
    scoring settings, a bad --shard)."""


class ConfigError(WimError):
    """A config problem, described in one paragraph that says what to change."""


class StageIncomplete(Exception):
    """A stage lost records to backend failures, or to replies that spent their token budget
    before answering (`exhausted`); the later stages must not build on it."""

    def __init__(self, stage: str, lost: int, stats: dict, exhausted: int = 0,
                 note: str = "") -> None:
        what = "samples" if stage == "generate" else "judgements"
        message = (
            f"{lost} {what} were lost to backend failures (server down, timeouts, 5xx; see "
            f"stats/{stage}.json) and were not recorded, so the stages after `{stage}` did not "
            "run. Run the same command again to retry them; finished records are kept."
        ) if lost else f"The stages after `{stage}` did not run."
        if exhausted:
            message += (
                f" {exhausted} {what} ran out of tokens before any answer and were not recorded "
                f"(the last: {note}). A reasoning model spends its budget thinking first: raise "
                "it (to thousands for a reasoning judge) and start again in "
                "a new --out folder (the judge's settings are part of the run's identity).")
        super().__init__(message)
        self.stage, self.lost, self.stats = stage, lost, stats
        self.exhausted = exhausted
