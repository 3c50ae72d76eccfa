"""The ``statehold`` command line (`app`, `main`) and the web view."""

from statehold.cli.app import app, main

__all__ = ["app", "main"]
