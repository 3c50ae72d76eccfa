"""statehold's one error family.

Every error statehold raises on purpose derives from `StateholdError`, so a caller (and
the CLI, which turns each into one line and exit status 1) catches one base. Errors that
have a natural builtin meaning keep it as a second base: a missing file is also a
`FileNotFoundError`, an unsafe path also a `ValueError`.
"""

from __future__ import annotations


class StateholdError(Exception):
    """Base of every error statehold raises on purpose; the message is one line that says
    what is wrong and, where there is one, what to do."""


class InvalidArgumentError(StateholdError, ValueError):
    """An argument (a name, a number, a URI) is not acceptable."""


class CheckpointError(StateholdError):
    """A checkpoint cannot be begun or completed as asked."""


__all__ = ["CheckpointError", "InvalidArgumentError", "StateholdError"]
