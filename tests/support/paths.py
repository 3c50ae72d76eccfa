"""Where the repository's parts are, for the tests that start other processes.

A subprocess imports `tests.support` modules (a driver run as a script, a phase hook that
Spark's Python workers unpickle by reference) when the repository's root is on its
PYTHONPATH, and the functions a test module defines (also pickled by reference) when that
module's folder is: pytest imports a test module by its file name from its own folder.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
TESTS = ROOT / "tests"
SUPPORT = TESTS / "support"


def module_dirs() -> list[Path]:
    """The folders holding test modules (tests/ and one per package under it)."""
    return sorted({path.parent for path in TESTS.rglob("test_*.py")})


def python_path(first: Iterable[Path | str], rest: str | None = None) -> str:
    """A PYTHONPATH value: `first`, then the entries of `rest` (by default this process's
    PYTHONPATH) not already named."""
    paths = [str(p) for p in first]
    if rest is None:
        rest = os.environ.get("PYTHONPATH", "")
    paths += [p for p in rest.split(os.pathsep) if p and p not in paths]
    return os.pathsep.join(paths)
