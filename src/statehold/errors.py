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


class MissingExtraError(StateholdError, ImportError):
    """A feature needs a package of an extra that is not installed (executors install
    only the core; the driver's extras are named in pyproject.toml)."""


def missing_extra(exc: ModuleNotFoundError, extra: str, what: str) -> MissingExtraError:
    """The one-line error for `what`, whose import failed with `exc`: which package is
    missing and the ``pip install`` that brings it."""
    package = (exc.name or "").split(".")[0] or "a package"
    return MissingExtraError(
        f"{what} needs {package}, which is not installed: "
        f"pip install 'statehold[{extra}]'"
    )


#: The packages of each extra (pyproject.toml), as imported: a ModuleNotFoundError naming
#: one of them is a missing extra; any other is a real error and propagates.
EXTRA_MODULES: dict[str, frozenset[str]] = {
    "cli": frozenset({"typer", "rich", "click"}),
    "metrics": frozenset({"prometheus_client"}),
    "zookeeper": frozenset({"kazoo"}),
}


def is_missing_extra(exc: ModuleNotFoundError, extra: str) -> bool:
    """Whether `exc` is a package of `extra` missing (its top-level name)."""
    return (exc.name or "").split(".")[0] in EXTRA_MODULES[extra]


__all__ = [
    "EXTRA_MODULES",
    "CheckpointError",
    "InvalidArgumentError",
    "MissingExtraError",
    "StateholdError",
    "is_missing_extra",
    "missing_extra",
]
