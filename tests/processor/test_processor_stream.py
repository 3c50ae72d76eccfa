"""A stateful processor straight from Structured Streaming (``job.foreach_batch(processor,
...)``, tests/support/processor_stream.py in a subprocess): a file source read one file
per micro-batch with ``trigger(availableNow=True)``, the sessions processor with
event-time timers, compared with the sessions example's plain-Python reference
(tests/support/sessions_reference.py). The driver is killed with kill -9 once, then
restarted to the end: locally after a checkpoint completed but before Spark committed its
batch (Spark replays the batch; its input must not count twice), on S3 while a batch's
output is written but its checkpoint is not (the retry replaces it). Every closed session
is written once, the open ones are in the state with one timer each, the retained
checkpoints are intact and no orphan is left. Local storage and S3 (moto)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from statehold.storage import open_storage
from tests.support.processor_stream_runs import scenario

pytestmark = [pytest.mark.spark, pytest.mark.crash]


@pytest.mark.timeout(1800)  # two Spark drivers; slow on a shared machine
def test_processor_stream_exact_after_kill(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    kills = [("after-complete:2", 2)]
    scenario(tmp_path, str(ckpt), open_storage(str(ckpt / "sessions")), kills)


@pytest.mark.timeout(1800)
def test_processor_stream_on_s3(tmp_path: Path, s3_server: Any) -> None:
    """The job directory on S3 (moto); Spark's own checkpoint stays local (no S3A)."""
    uri = f"s3://{s3_server.bucket}/stream-{os.getpid()}-{tmp_path.name}"
    job = open_storage(f"{uri}/sessions", **s3_server.options)
    scenario(tmp_path, uri, job, [("after-sink:1", 0)], s3_server.env,
             tmp_path / "spark-checkpoint")
