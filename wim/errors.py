"""One base class for user errors, so the CLI can tell them from bugs.

A `WimError` is the user's to fix (a config value, an input file, a run directory, a model that
is not installed): the CLI prints its message as one paragraph and exits with code 2. Any other
exception, including a ValueError raised inside transformers or TRL, is a bug or a library
failure and keeps its traceback. This module imports nothing, so every module can use it.
"""


class WimError(Exception):
    """A problem the user can fix; the message says what to change."""


class InputError(WimError):
    """A stage's input cannot be used (no pairs to train on, judgements that do not fit the
    scoring settings, a bad --shard)."""


class ConfigError(WimError):
    """A config problem, described in one paragraph that says what to change."""
