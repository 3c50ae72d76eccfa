"""A real query's driver killed (kill -9) between its file source's log write and its
offsets write, then the location saved, rolled back and restarted with exact output; and
that rollback killed at every step of its plan, each finished by a second run.

Spark's file source writes ``sources/0/K`` inside ``latestOffset``, before ``offsets/N``:
a driver that dies between the two leaves the log an entry ahead, the restart writes the
next entry for the same batch, and from then on ``offsets/N`` records a logOffset above
N. The window is opened by the test's own source (`tests.support.spark_locations.pause_source`),
read in union with the file source, which pauses right after the file source's write.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from itertools import count
from pathlib import Path

import pytest

from statehold.spark_checkpoints import open_spark_checkpoint
from statehold.spark_checkpoints.reports import verify
from statehold.spark_checkpoints.rollback import rollback
from statehold.spark_checkpoints.savepoint import savepoint
from tests.support.spark_locations.disk_trees import copy_tree, newest_log
from tests.support.spark_locations.queries import (
    SPARK_4,
    driver_cmd,
    driver_env,
    read_output,
    run_query,
    write_inputs,
)

pytestmark = [
    pytest.mark.spark,
    pytest.mark.crash,
    pytest.mark.skipif(not SPARK_4, reason="the pausing source is a Python data source (Spark 4)"),
]

QUERY, PROVIDER = "pandas_state", "rocksdb_changelog"


def _wait(done: Callable[[], bool], seconds: float, driver: subprocess.Popen[bytes], log: Path,
          what: str) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        if driver.poll() is not None:
            pytest.fail(f"the driver exited ({driver.returncode}) before {what}:\n"
                        f"{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} after {seconds} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.05)


def _sizes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def _log_offset(ckpt: Path, batch: int) -> int:
    return int(json.loads((ckpt / "offsets" / str(batch)).read_text().splitlines()[2])["logOffset"])


def _entries(ckpt: Path) -> list[int]:
    return sorted(int(p.name) for p in (ckpt / "sources" / "0").iterdir() if p.name.isdigit())


def _killed_in_the_window(tmp_path: Path, inputs: Path, ckpt: Path) -> None:
    """Batches 0-2 run by a driver of their own, then file 3 arrives and the driver is
    killed after the file source logged it and before ``offsets/3`` is written."""
    arm, log = tmp_path / "arm", tmp_path / "driver.log"
    with log.open("wb") as out:
        driver = subprocess.Popen(
            driver_cmd("--query", QUERY, "--provider", PROVIDER, "--checkpoint", str(ckpt),
                       "--input", str(inputs), "--output", str(tmp_path / "out-killed"),
                       "--until-batch", "99", "--timeout", "600", "--pause-source", str(arm)),
            env=driver_env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        _wait(lambda: (ckpt / "commits" / "2").exists(), 300, driver, log, "batch 2")
        arm.write_text("")
        write_inputs(inputs, 3, 1)
        _wait(lambda: Path(f"{arm}.paused").exists(), 120, driver, log, "the pause")
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()


def test_a_driver_killed_between_a_source_log_and_its_offsets(spark, tmp_path: Path) -> None:
    inputs, ckpt = tmp_path / "in", tmp_path / "ckpt"
    unarmed = tmp_path / "unarmed"  # the same plan, never paused
    write_inputs(inputs, 0, 3)
    _killed_in_the_window(tmp_path, inputs, ckpt)
    assert _entries(ckpt) == [0, 1, 2, 3] and newest_log(ckpt, "offsets") == 2

    # restarted with one more file: batch 3 reads the stray entry 3 and the new entry 4
    write_inputs(inputs, 4, 1)
    run_query(spark, QUERY, PROVIDER, str(ckpt), inputs, tmp_path / "out-3", 3, pause=unarmed)
    assert newest_log(ckpt, "commits") == 3 and _log_offset(ckpt, 3) == 4
    template = copy_tree(ckpt, tmp_path / "template")

    # a savepoint holds entry 4 (above the batch number) and restarts as the location does
    saved = savepoint(open_spark_checkpoint(str(ckpt)), str(tmp_path / "sp"))
    assert saved.batch == 3 and _entries(tmp_path / "sp") == [0, 1, 2, 3, 4]
    write_inputs(inputs, 5, 2)
    run_query(spark, QUERY, PROVIDER, str(ckpt), inputs, tmp_path / "out-ref", 5, pause=unarmed)
    run_query(spark, QUERY, PROVIDER, str(tmp_path / "sp"), inputs, tmp_path / "out-sp", 5,
              pause=unarmed)
    reference = read_output(tmp_path / "out-ref")
    assert sorted(reference) == [4, 5] and reference[4]
    assert read_output(tmp_path / "out-sp") == reference

    # a rollback to batch 2, killed before each of its deletes and finished by a second run,
    # leaves what an uninterrupted one leaves
    whole = copy_tree(template, tmp_path / "whole")
    uninterrupted = rollback(open_spark_checkpoint(str(whole)), 2, force=True,
                             keep=str(tmp_path / "whole-kept"))
    assert "sources/0/4" in uninterrupted.deleted and "sources/0/3" in uninterrupted.deleted
    expected = _sizes(whole)
    rollbacks = subprocess.Popen(
        [sys.executable, "-m", "tests.support.spark_locations.paused_rollback"], env=driver_env(),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True,
    )
    assert rollbacks.stdin and rollbacks.stdout
    try:
        for step in count():
            root = copy_tree(template, tmp_path / f"at-{step}")
            mark = tmp_path / f"at-{step}.paused"
            rollbacks.stdin.write(f"{root} 2 {tmp_path / f'kept-{step}'} {step} {mark}\n")
            rollbacks.stdin.flush()
            while not mark.exists():
                assert rollbacks.poll() is None, "the rollbacks' process ended"
                time.sleep(0.01)
            said = mark.read_text().split()
            if said == ["done"]:
                assert rollbacks.stdout.readline().strip() == "ended 0"
                assert step == len(uninterrupted.deleted) + 1  # every delete, and the mark's
                break
            os.kill(int(said[1]), signal.SIGKILL)  # the paused rollback: kill -9
            assert rollbacks.stdout.readline().strip() == f"ended {signal.SIGKILL}"
            assert not verify(open_spark_checkpoint(str(root))).ok, step

            again = rollback(open_spark_checkpoint(str(root)), 2, force=True)

            assert again.finished_interrupted and again.kept == f"file://{tmp_path}/kept-{step}"
            assert _sizes(root) == expected, step
            assert verify(open_spark_checkpoint(str(root))).ok
    finally:
        os.killpg(rollbacks.pid, signal.SIGKILL)
        rollbacks.wait()
    assert step > 10

    # the rolled back location reruns batches 3 on as a run that never crashed wrote them
    run_query(spark, QUERY, PROVIDER, str(tmp_path / "at-0"), inputs, tmp_path / "out-rb", 6,
              pause=unarmed)
    run_query(spark, QUERY, PROVIDER, str(tmp_path / "fresh"), inputs, tmp_path / "out-fresh",
              6, pause=unarmed)
    rerun = read_output(tmp_path / "out-rb")
    assert sorted(rerun) == [3, 4, 5, 6]
    assert rerun == {b: rows for b, rows in read_output(tmp_path / "out-fresh").items() if b > 2}
    # and what the rollback kept restarts as the location before it would have
    run_query(spark, QUERY, PROVIDER, str(tmp_path / "kept-0"), inputs, tmp_path / "out-kept",
              5, pause=unarmed)
    assert read_output(tmp_path / "out-kept") == reference
