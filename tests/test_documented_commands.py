"""Every `python tests/X.py` and `python bench/X.py` command the README and docs/ give runs as
written from the repository's root, as a new user types it: its `--help` exits 0. A script
that imports `tests.` or `bench.` modules without putting the root on its path fails here
with "No module named 'tests'" (issue 42)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support.paths import ROOT

COMMAND = re.compile(r"\bpython3? ((?:tests|bench)/[a-z_]+\.py)\b")


def documented_scripts() -> list[str]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return sorted({m.group(1) for page in pages for m in COMMAND.finditer(page.read_text())})


def test_each_documented_script_runs_as_written(tmp_path: Path) -> None:
    scripts = documented_scripts()
    assert "tests/simulate.py" in scripts and any(s.startswith("bench/") for s in scripts)
    # The installed package only: no PYTHONPATH, as after the README's install command.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYSPARK_PYTHON"] = sys.executable
    runs = {
        script: subprocess.Popen([sys.executable, script, "--help"], cwd=ROOT, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for script in scripts
    }  # side by side: each mostly waits for its imports
    failed = {}
    for script, proc in runs.items():
        out, _ = proc.communicate(timeout=300)
        if proc.returncode != 0 or "usage" not in out.lower():
            failed[script] = out[-1500:]
    assert not failed, failed
