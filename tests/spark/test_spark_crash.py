"""Exactly once under kill -9 of the example's driver.

The example runs in a subprocess (tests/support/pause_hooks.py: the example with the
`pause_when_asked` phase hook) with ``STATEHOLD_TEST_PAUSE_AT=<phase>:<batch>``: it stops at that
point of that batch and says so in a marker file; the test then kills the driver with
SIGKILL (Spark's JVM and Python workers die with it) and starts it again on the same
input, job directory, output and task-local state directory. Phases: ``in-task`` (the
state step is running in the Spark tasks), ``after-tasks`` (tasks uploaded their state,
checkpoint not completed), ``after-sink`` (the batch's output is written, checkpoint not
completed), ``after-complete`` (checkpoint completed, next batch not begun), ``job-end``
(all input processed, the job not yet closed).

After every kill: the newest retained checkpoint is the one expected for that phase, and
every file any retained checkpoint references is present with its size and checksum
(`statehold.tools.verify`). At the end: every batch's output and the final state read
from the newest checkpoint equal a plain-Python computation (no batch lost or counted
twice), and the job directory holds no orphan.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

import pytest

from statehold.cleanup.reconcile import plan
from statehold.examples.running_totals import generate_demo
from statehold.format import layout
from statehold.job.directory import open_job
from statehold.storage import Storage, open_storage
from tests.support.example_runs import (
    check_retained_intact,
    example_cmd,
    example_env,
    final_state,
    latest_id,
    read_output,
    reference,
    reference_state,
    run_and_kill,
)

pytestmark = [pytest.mark.spark, pytest.mark.crash]

MAX_PARALLELISM = 16


def run_to_end(cwd: Path, args: list[str], env: Mapping[str, str] | None = None) -> str:
    done = subprocess.run(
        example_cmd(*args), cwd=cwd, env=example_env(cwd, env), capture_output=True,
        text=True, timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done.stdout




def crash_scenario(
    tmp: Path,
    checkpoints: str,
    job: Storage,
    kills: list[tuple[str, int | None]],
    files: int,
    env: Mapping[str, str] | None = None,
) -> None:
    """Kill at each (pause point, expected newest checkpoint afterwards), then add two
    files and run to the end; check everything against the plain-Python reference."""
    inp, out = tmp / "input", tmp / "output"
    generate_demo(inp, files=files + 2, rows=60, keys=30)
    late = sorted(inp.glob("*.jsonl"))[files:]
    for f in late:  # held back: a run after all the kills must pick them up
        f.rename(tmp / f.name)
    args = ["--input", str(inp), "--output", str(out), "--checkpoints", checkpoints,
            "--retain", "2", "--max-parallelism", str(MAX_PARALLELISM), "--parallelism", "2"]
    for pause_at, expected_latest in kills:
        run_and_kill(tmp, args, pause_at, env)
        assert latest_id(job) == expected_latest, pause_at
        if expected_latest is not None:
            check_retained_intact(job)
    for f in late:
        (tmp / f.name).rename(inp / f.name)
    stdout = run_to_end(tmp, args, env)
    assert f"checkpoint {files + 1}," in stdout

    assert latest_id(job) == files + 1
    assert read_output(out) == reference(inp)  # every batch once, replays replaced
    assert final_state(job, tmp / "reader", MAX_PARALLELISM) == reference_state(inp)
    check_retained_intact(job)
    leftovers = plan(open_job(job), None)
    assert leftovers.orphans == [], [f.key for f in leftovers.orphans]
    assert list(job.list(layout.SPARK_DIR)) == []  # no Spark streaming checkpoint used


def test_kill_driver_at_every_phase_then_exact_result(tmp_path: Path) -> None:
    """Five kills on one input (6 files, one per batch), then a clean run with 2 more.
    Each restart is the run the next kill stops, so every batch the kills need runs once
    (a driver start per kill, one for the end: the least for five kills)."""
    checkpoints = tmp_path / "checkpoints"
    job = open_storage(str(checkpoints / "running-totals"))
    kills: list[tuple[str, int | None]] = [
        ("in-task:1", 0),  # batch 0 completed, 1 interrupted inside the tasks
        ("after-sink:2", 1),  # batch 1 restored and completed; 2's output written, not
        ("after-complete:3", 3),  # batch 2 replayed (output replaced), 3 completed
        ("after-tasks:4", 3),  # batch 4's state uploaded, never completed
        ("job-end:5", 5),  # 4 restored from 3 and redone, all 6 files done, job not closed
    ]
    crash_scenario(tmp_path, str(checkpoints), job, kills, files=6)


def test_kill_driver_on_s3(tmp_path: Path, s3_server: object) -> None:
    """The job directory on S3 (moto): a kill after batch 1's tasks uploaded to S3 and its
    output was written (checkpoint 0 the newest), then a run to the end from the position
    kept in the S3 checkpoints (batch 1 restored from S3 and redone). Of the local test's
    phases only this one: what differs on S3 is the storage under the restore, which one
    kill and one restore cover."""
    from tests.support.infra.object_store_servers import S3Server

    assert isinstance(s3_server, S3Server)
    uri = f"s3://{s3_server.bucket}/crash-{os.getpid()}-{tmp_path.name}"
    job = open_storage(f"{uri}/running-totals", **s3_server.options)
    kills: list[tuple[str, int | None]] = [("after-sink:1", 0)]
    crash_scenario(tmp_path, uri, job, kills, files=2, env=s3_server.env)
