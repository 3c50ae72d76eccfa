"""The peak of Python's allocations during a call, measured in a fresh interpreter.

tracemalloc counts every thread's allocations, and a long pytest process has threads of
other tests' still running (a job's lease renewal, a ZooKeeper client reconnecting, the
moto server answering them): in the suite they added ~10 MB to a read's peak. A child
interpreter has only the call being measured."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from tests.support.paths import ROOT, SRC

_CHILD = """
import importlib, json, sys, tracemalloc
module, name = sys.argv[1].split(":")
fn = getattr(importlib.import_module(module), name)
calls = json.loads(sys.argv[2])
fn(*calls[0])  # imports and caches warmed before tracing
peaks = []
for args in calls[1:]:
    tracemalloc.start()
    try:
        fn(*args)
        peaks.append(tracemalloc.get_traced_memory()[1])
    finally:
        tracemalloc.stop()
print(json.dumps(peaks))
"""


def traced_peaks(target: str, warm: list[Any], *calls: list[Any]) -> list[int]:
    """Bytes at the peak of each call of `target` ("module:function") with each argument
    list of `calls`, after one untraced call with `warm`."""
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, target, json.dumps([warm, *calls])],
        capture_output=True, text=True, timeout=900,
        env={"PYTHONPATH": f"{SRC}:{ROOT}", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    peaks: list[int] = json.loads(done.stdout.strip().splitlines()[-1])
    return peaks


def read_state_rows(uri: str, rows: int) -> None:
    """Every row of batch 0 read offline, 1000 per record batch, counted, not kept."""
    from statehold.spark_checkpoints import open_spark_checkpoint

    seen = sum(b.num_rows for b in open_spark_checkpoint(uri).read_state(0, batch_rows=1000))
    assert seen == rows, (seen, rows)


def state_command_jsonl(uri: str, out: str) -> None:
    """``statehold state URI --out OUT --format jsonl``, in process."""
    from typer.testing import CliRunner

    from statehold.cli.app import app

    result = CliRunner().invoke(app, ["state", uri, "--out", out, "--format", "jsonl"])
    assert result.exit_code == 0, result.output
