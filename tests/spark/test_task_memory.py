"""A batch many times the task's buffer (`task_batch_rows`), run by Python workers under a
real memory cap (``spark.executor.pyspark.memory``: RLIMIT_AS), in a driver process of
its own (tests/support/capped_driver.py): holding a partition fails under that cap, the
streaming task completes with exact results, per key and for one hot key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.capped_driver import PAYLOAD
from tests.support.paths import ROOT, python_path

pytestmark = [pytest.mark.spark]

CAP_MB = 1024
KEYS = 1000
ROWS_PER_KEY = 100  # 100,000 rows of 8 kB: 0.8 GB, 0.4 GB per task
HOT_ROWS = 60_000  # one key with 0.48 GB of rows


def test_batch_larger_than_the_cap_streams_with_exact_results(tmp_path: Path) -> None:
    from tests.support.infra import provision

    provision.require("java")
    env = {**os.environ, "PYTHONPATH": python_path([ROOT])}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.capped_driver", str(tmp_path), str(CAP_MB),
         str(ROWS_PER_KEY), str(KEYS), str(HOT_ROWS)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200,
    )
    results = {
        r["name"]: r
        for r in (json.loads(line[7:]) for line in proc.stdout.splitlines()
                  if line.startswith("RESULT "))
    }
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the cap is real: a task holding its partition in Python runs out of memory
    control = results["control"]
    assert control["failed"] and control["memory_error"], control
    function = results["function"]
    assert function["rows_in"] == KEYS * ROWS_PER_KEY and function["keys"] == KEYS
    assert function["out"] == {f"k{i:05d}": [ROWS_PER_KEY, ROWS_PER_KEY * PAYLOAD]
                               for i in range(KEYS)}
    hot = results["hot"]
    assert hot["rows_in"] == KEYS * 2 + HOT_ROWS and hot["keys"] == KEYS + 1
    n, size, chunks = hot["out"].pop("hot")
    assert (n, size) == (HOT_ROWS, HOT_ROWS * PAYLOAD)
    assert chunks >= HOT_ROWS // 500  # handed over in chunks of at most task_batch_rows
    # a small key's two rows come in one chunk, or two where an input batch ends between
    assert {k: v[:2] for k, v in hot["out"].items()} == {f"k{i:05d}": [2, 2 * PAYLOAD]
                                                         for i in range(KEYS)}
    assert {v[2] for v in hot["out"].values()} <= {1, 2}
