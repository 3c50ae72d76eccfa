"""The ``statehold`` command line (`app`, `main`) and the web view.

typer and rich are the ``cli`` extra (``pip install 'statehold[cli]'``), which executors do
not install: without them this package still imports, `main` (the console script) says in
one line how to install them, and `app` raises that line as a MissingExtraError."""

from __future__ import annotations

import sys
from typing import Any

from statehold.errors import MissingExtraError, is_missing_extra, missing_extra

_missing: MissingExtraError | None = None
try:
    from statehold.cli.app import app
except ModuleNotFoundError as exc:
    if not is_missing_extra(exc, "cli"):
        raise
    _missing = missing_extra(exc, "cli", "the statehold command")


def main() -> None:
    """The ``statehold`` console script."""
    if _missing is not None:
        sys.stderr.write(f"statehold: error: {_missing}\n")
        sys.exit(1)
    from statehold.cli.app import main as run

    run()


def __getattr__(name: str) -> Any:
    # Reached only when the import of `app` above failed.
    if name == "app" and _missing is not None:
        raise _missing
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["app", "main"]
