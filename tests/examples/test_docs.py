"""Every code block of the docs that claims to run runs as written.

A block claims to run when its fence is ```` ```{.python .runs} ```` or
```` ```{.bash .runs} ```` (tests/support/docs_blocks.py). Each page's marked blocks run
in order, in one new folder; the pages run one after the other in one subprocess (a
module fixture), so that they share one Spark JVM, and each page passes or fails on its
own. The blocks carry their own checks (``assert``; a shell command that fails)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.docs_blocks import (
    BEGINS,
    MARKED,
    MENTIONS_RUNS,
    PASSED,
    marked_blocks,
)
from tests.support.paths import ROOT, python_path

DOCS = ROOT / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if marked_blocks(p.read_text()))
RUN_PAGE = "test_the_marked_blocks_of_a_page_run"


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


@dataclass(frozen=True)
class PagesRun:
    outputs: dict[Path, list[str]]  # per page, its stdout lines from its `begins` line on
    stderr: str


@pytest.fixture(scope="module")
def pages_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> PagesRun:
    """The selected pages run in one subprocess, one after the other."""
    pages = [item.callspec.params["page"] for item in request.session.items
             if getattr(item, "originalname", None) == RUN_PAGE
             and item.module is request.module]
    env = {**os.environ, "PYTHONPATH": python_path([ROOT / "src", ROOT])}
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.docs_blocks", *map(str, pages)],
        cwd=tmp_path_factory.mktemp("docs"), env=env, capture_output=True, text=True,
        timeout=540 * max(1, len(pages)),
    )
    outputs: dict[Path, list[str]] = {}
    current: list[str] = []
    for line in done.stdout.splitlines():
        for page in pages:
            if line == f"=== {page} {BEGINS}":
                current = outputs[page] = []
        current.append(line)
    return PagesRun(outputs, done.stderr)


@pytest.mark.parametrize("page", [_param(p) for p in PAGES])
def test_the_marked_blocks_of_a_page_run(page: Path, pages_run: PagesRun) -> None:
    said = pages_run.outputs.get(page, [])
    assert said and said[-1] == f"=== {page} {PASSED}", (said[-60:], pages_run.stderr[-3000:])
    # Every block ran: the driver announces each before running it.
    blocks = sum(line.startswith(f"--- {page.name}:") for line in said)
    assert blocks == len(marked_blocks(page.read_text()))
