"""The documentation site builds strictly: every page in the nav, no broken link or anchor,
the CLI reference generated from the command itself and the API reference from the
docstrings without a warning (mkdocs.yml; CI runs the same build in .ci/run)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from statehold.cli.reference import command
from tests.support.paths import ROOT, python_path


def test_the_docs_site_builds_strictly(tmp_path: Path) -> None:
    site = tmp_path / "site"
    env = {**os.environ, "PYTHONPATH": python_path([ROOT / "src", ROOT]),
           "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    # The generated parts are there, not just pages that happen to build empty:
    cli = (site / "reference" / "cli" / "index.html").read_text()
    names = sorted(command.commands)  # type: ignore[attr-defined]
    assert len(names) > 10
    for name in names:
        assert f'id="statehold-{name}"' in cli, name
    api = (site / "reference" / "api" / "spark" / "index.html").read_text()
    assert 'id="statehold.spark.StatefulJob.savepoint"' in api
    changelog = (site / "changelog" / "index.html").read_text()
    # CHANGELOG.md is included whole (its one source): its first release heading is there.
    release = next(line for line in (ROOT / "CHANGELOG.md").read_text().splitlines()
                   if line.startswith("## "))
    assert release.removeprefix("## ") in changelog
    assert (site / "benchmarks" / "index.html").is_file()
