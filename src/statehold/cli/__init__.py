"""The ``statehold`` command line (`app`, `main`) and the web view.

typer and rich are the ``cli`` extra (``pip install 'statehold[cli]'``), which executors do
not install: `main`, the console script, imports them only when it runs and says in one
line how to install them when they are missing; `app` is imported on first use."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from statehold.errors import is_missing_extra, missing_extra

if TYPE_CHECKING:
    from statehold.cli.app import app


def main() -> None:
    """The ``statehold`` console script."""
    try:
        from statehold.cli.app import main as run
    except ModuleNotFoundError as exc:
        if not is_missing_extra(exc, "cli"):
            raise
        error = missing_extra(exc, "cli", "the statehold command")
        sys.stderr.write(f"statehold: error: {error}\n")
        sys.exit(1)
    run()


def __getattr__(name: str) -> Any:
    if name == "app":
        from statehold.cli.app import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["app", "main"]
