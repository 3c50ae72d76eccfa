"""The runnable example in docs/usage.md runs as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT

pytestmark = pytest.mark.spark
DOCS = ROOT / "docs" / "usage.md"


def test_the_usage_example_runs(tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOCS.read_text(), re.S)
    assert len(blocks) == 1, "docs/usage.md has exactly one runnable python block"
    script = tmp_path / "example.py"
    script.write_text(blocks[0])
    checkpoints = tmp_path / "ckpt"
    first = subprocess.run([sys.executable, str(script), str(checkpoints)],
                           capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "checkpoint 1:" in first.stdout
    assert (checkpoints / "clicks" / "chk-1" / "_metadata").is_file()
