"""Every code block of the docs that claims to run runs as written.

A block claims to run when its fence is ```` ```{.python .runs} ```` or
```` ```{.bash .runs} ```` (tests/support/docs_blocks.py). Each page's marked blocks run
in order, in one new folder, in one subprocess: a page with Python blocks starts Spark
once. The blocks carry their own checks (``assert``; a shell command that fails)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.docs_blocks import MARKED, MENTIONS_RUNS, marked_blocks
from tests.support.paths import ROOT, python_path

DOCS = ROOT / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if marked_blocks(p.read_text()))


def _param(page: Path) -> object:
    needs_spark = any(b.lang == "python" for b in marked_blocks(page.read_text()))
    name = page.relative_to(DOCS).as_posix()
    return pytest.param(page, id=name, marks=[pytest.mark.spark] if needs_spark else [])


def test_the_pages_that_claim_to_run_are_found() -> None:
    # The tutorial and the savepoint how-to are runnable; a marker the pattern missed would
    # otherwise leave a page untested without a word.
    names = {p.relative_to(DOCS).as_posix() for p in PAGES}
    assert {"tutorial.md", "how-to/savepoint.md"} <= names
    for page in DOCS.rglob("*.md"):
        text = page.read_text()
        claims = len(MENTIONS_RUNS.findall(text))
        assert claims == len(MARKED.findall(text)), f"{page}: a fence says 'runs' unmarked"


@pytest.mark.parametrize("page", [_param(p) for p in PAGES])
def test_the_marked_blocks_of_a_page_run(page: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": python_path([ROOT / "src", ROOT])}
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.docs_blocks", str(page)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=540,
    )
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    # Every block ran: the driver announces each before running it.
    assert done.stdout.count(f"--- {page.name}:") == len(marked_blocks(page.read_text()))
