"""``statehold savepoint JOB NAME`` and ``statehold stop JOB`` against real drivers: a
streaming query (tests/support/operated_stream.py, ``job.foreach_batch`` over Spark's
``rate-micro-batch`` source or a folder, no request handling in its code) and the
running-totals example (its own ``run_batch`` loop, waiting for files), each operated by
the CLI as its own process, busy and idle, and killed with SIGKILL with a request pending.

Exactly once is checked on the state itself: the source's values are contiguous from 0,
so per key the count must be that of every value up to the largest seen. After every
run the job directory is listed: no orphan (the policy's reconcile finds none), no
request document left behind but the answers nobody collected, and every savepoint
either complete (it verifies) or absent.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from statehold import tools
from statehold.checkpoint.requests import read_answer, submit
from statehold.cleanup.reconcile import plan
from statehold.examples.common import output_sink
from statehold.examples.running_totals import check_rows, generate_demo, read_files
from statehold.examples.totals import totals_batch
from statehold.format import requests as fmt
from statehold.format.requests import Action, Outcome
from statehold.job.directory import open_job
from statehold.spark import StatefulJob, iter_state
from statehold.spark.job import JobStoppedError
from statehold.storage import Storage, open_storage
from tests.support.cli_process import Run, statehold_cli
from tests.support.driver_process import Driver
from tests.support.example_runs import (
    example_cmd,
    final_state,
    read_output,
    reference,
    reference_state,
)
from tests.support.infra.object_store_servers import S3Server
from tests.support.operated_stream import KEYS, OUTPUT_SCHEMA, count
from tests.support.paths import SUPPORT

pytestmark = [pytest.mark.spark, pytest.mark.crash]


def operated(tmp: Path, job_id: str, *files: str) -> Driver:
    """The operated stream of job `job_id` as a process (reading the folder `files[0]`
    if given)."""
    return Driver(tmp, job_id, [sys.executable, str(SUPPORT / "operated_stream.py"),
                                str(tmp / "checkpoints"), job_id,
                                str(tmp / f"output-{job_id}"), *files])


def exactly_once(state: dict[Any, dict[str, Any]]) -> int:
    """Every value 0..top counted once per key; returns top."""
    top = max(int(s["top"]) for s in state.values())
    assert {int(k): int(s["n"]) for k, s in state.items()} == {
        k: len(range(k, top + 1, KEYS)) for k in range(KEYS)
    }
    return top


def request_files(job_dir: Path) -> list[str]:
    folder = job_dir / fmt.REQUESTS_DIR
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def no_orphans(job_dir: Path) -> None:
    leftovers = plan(open_job(str(job_dir)), None)
    assert leftovers.orphans == [], [f.key for f in leftovers.orphans]


def one_line_error(run: Run, *words: str) -> None:
    assert run.code == 1 and len(run.err) == 1, run.err
    for word in words:
        assert word in run.err[0], run.err


@pytest.mark.timeout(1200)  # two Spark drivers; minutes on a busy shared machine
def test_a_driver_killed_with_a_request_pending_then_the_next_serves_savepoint_and_stop(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A request left pending for a killed driver is refused by the next attempt, which
    goes on; that busy driver then serves a savepoint and a stop with a savepoint, and the
    savepoint restores exactly. (One driver serves both cases: a driver start less.)"""
    job_dir = tmp_path / "checkpoints" / "killed"
    first = operated(tmp_path, "killed")
    first.wait_batches(2)
    first.kill()  # its lease still looks alive for a while
    timed_out = statehold_cli("savepoint", str(job_dir), "late", "--wait", "--timeout", "2")
    one_line_error(timed_out, "timed out after 2s", "did not answer", "withdrawn")
    assert request_files(job_dir) == []  # withdrawn: nothing left behind
    asked = statehold_cli("stop", str(job_dir))  # no --wait: left pending for the dead one
    assert asked.code == 0, asked.err
    [pending] = request_files(job_dir)
    request_id = pending.removesuffix(".json")

    second = operated(tmp_path, "killed")  # a new attempt, a higher epoch
    second.wait_batches(3)  # it did not stop: the request was not for it
    answer = read_answer(open_storage(str(job_dir)), request_id)
    assert answer is not None and answer.outcome is Outcome.REFUSED, answer
    assert "which is gone" in answer.message
    uncollected = [f"{request_id}.answer.json"]
    assert request_files(job_dir) == uncollected  # the request went

    # the running driver serves a savepoint, then a stop with a savepoint
    saved = statehold_cli("savepoint", str(job_dir), "sp1", "--wait", "--timeout", "120")
    assert saved.code == 0, saved.err
    assert "savepoints/sp1 of checkpoint" in saved.out[0]
    stopped = statehold_cli("stop", str(job_dir), "--savepoint", "final", "--wait",
                            "--timeout", "120")
    assert stopped.code == 0, stopped.err
    assert second.exited() == 0, second.log.read_text()[-3000:]
    assert second.lines[-1].startswith("ended stopped after checkpoint"), second.lines[-3:]

    assert not (job_dir / "savepoints" / "late").exists()  # never taken, never half
    listing = tools.list_checkpoints(str(job_dir))
    assert sorted(s.path for s in listing.savepoints) == ["savepoints/final", "savepoints/sp1"]
    for name in ("sp1", "final"):
        assert tools.verify(str(job_dir / "savepoints" / name)).ok
    sp1 = {k: v for k, v in iter_state(str(job_dir / "savepoints" / "sp1"))}
    final = {k: v for k, v in iter_state(str(job_dir / "savepoints" / "final"))}
    assert exactly_once(sp1) <= exactly_once(final)
    exactly_once(dict(iter_state(str(job_dir))))  # through the kill: exactly once
    assert request_files(job_dir) == uncollected  # sp1's and the stop's collected by --wait
    assert open_job(str(job_dir)).ha.read().latest is not None  # ended keeping the newest
    no_orphans(job_dir)
    assert statehold_cli("status", str(job_dir)).out[-1].startswith("ended finished")
    none = statehold_cli("savepoint", str(job_dir), "after", "--wait")
    one_line_error(none, "no running driver")
    assert request_files(job_dir) == uncollected

    # the savepoint restores into a new job: one more batch, exact over everything
    top = exactly_once(final)
    job = StatefulJob(spark, str(tmp_path / "checkpoints"), "restored", max_parallelism=8,
                      parallelism=2, restore_from=str(job_dir / "savepoints" / "final"))
    more = spark.createDataFrame([(v % KEYS, v) for v in range(top + 1, top + 21)],
                                 "key long, value long")
    job.run_batch(more, count, OUTPUT_SCHEMA)
    job.close()
    assert exactly_once(dict(iter_state(str(tmp_path / "checkpoints" / "restored")))) == top + 20


@pytest.mark.timeout(1200)  # two Spark drivers; minutes on a busy shared machine
def test_an_idle_query_serves_a_savepoint_and_a_stop_with_savepoint(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A query without new input runs no micro-batch: its driver's job answers both while
    idle, the stop stops the query with no batch in flight, and the savepoint restores."""
    job_dir = tmp_path / "checkpoints" / "idle"
    inp = tmp_path / "input"
    inp.mkdir()
    values = iter(range(1000))

    def add_file(name: str) -> None:
        (inp / f".{name}").write_text("".join(f'{{"value": {next(values)}}}\n' for _ in range(7)))
        (inp / f".{name}").rename(inp / name)  # whole, or Spark may read half of it

    add_file("a.json")
    add_file("b.json")
    driver = operated(tmp_path, "idle", str(inp))
    driver.wait_batches(2)  # then no new input: no batch, no boundary
    saved = statehold_cli("savepoint", str(job_dir), "while-idle", "--wait", "--timeout", "10")
    assert saved.code == 0, saved.err  # served by the idle driver
    assert "savepoints/while-idle of checkpoint 1" in saved.out[0]
    stopped = statehold_cli("stop", str(job_dir), "--savepoint", "final", "--wait",
                            "--timeout", "10")
    assert stopped.code == 0, stopped.err
    assert "stopped after checkpoint 1; savepoint savepoints/final" in stopped.out[0]
    assert driver.exited() == 0, driver.log.read_text()[-3000:]
    assert driver.batches() == 2, driver.lines  # stopped with no batch of its own
    assert driver.lines[-1] == "ended stopped after checkpoint 1; savepoint savepoints/final"
    assert open_job(str(job_dir)).ha.read().latest is not None  # ended keeping the newest
    assert request_files(job_dir) == [] and "Traceback" not in driver.log.read_text()
    no_orphans(job_dir)
    for name in ("while-idle", "final"):
        assert tools.verify(str(job_dir / "savepoints" / name)).ok
    assert exactly_once(dict(iter_state(str(job_dir / "savepoints" / "final")))) == 13

    # a restart with nothing new runs no micro-batch (the stop left Spark's checkpoint
    # with its batches committed) and is stopped before its first, found by its location
    again = operated(tmp_path, "idle", str(inp))
    again.wait_line("started")
    stopped = statehold_cli("stop", str(job_dir), "--wait", "--timeout", "10")
    assert stopped.code == 0, stopped.err
    assert again.exited() == 0, again.log.read_text()[-3000:]
    assert again.batches() == 0 and again.lines[-1] == "ended stopped after checkpoint 1"
    assert exactly_once(dict(iter_state(str(job_dir)))) == 13

    # the savepoint restores into a new job: one more batch, exact over everything
    job = StatefulJob(spark, str(tmp_path / "checkpoints"), "from-final", max_parallelism=8,
                      parallelism=2, restore_from=str(job_dir / "savepoints" / "final"))
    more = spark.createDataFrame([(v % KEYS, v) for v in range(14, 30)], "key long, value long")
    job.run_batch(more, count, OUTPUT_SCHEMA)
    job.close()
    restored = dict(iter_state(str(tmp_path / "checkpoints" / "from-final")))
    assert exactly_once(restored) == 29


@pytest.mark.timeout(1200)  # up to two Spark drivers; minutes on a busy shared machine
@pytest.mark.parametrize("where", ["local", "s3"])
def test_the_idle_example_serves_a_savepoint_and_a_stop_then_restores_exactly(
    spark: SparkSession, tmp_path: Path, where: str, request: pytest.FixtureRequest
) -> None:
    """The README's pipeline waiting for files (``--keep-running``): it answers a savepoint
    while idle; on S3 a kill -9 then leaves a request timing out with nothing behind, and
    the next run goes on; idle again, it answers a stop with a savepoint by exiting 0 with
    one line; the savepoint restores exactly."""
    env: dict[str, str] = {}
    options: dict[str, object] = {}
    root = str(tmp_path / "checkpoints")
    if where == "s3":
        s3: S3Server = request.getfixturevalue("s3_server")
        env, options = s3.env, s3.options
        root = f"s3://{s3.bucket}/idle-{os.getpid()}-{tmp_path.name}"
    job_uri = f"{root}/running-totals"
    storage = open_storage(job_uri, **options)
    inp, out = tmp_path / "input", tmp_path / "output"
    generate_demo(inp, files=4, rows=50, keys=8)
    later, last = [f.rename(tmp_path / f.name) for f in sorted(inp.glob("*.jsonl"))[2:]]
    cmd = example_cmd("--input", str(inp), "--output", str(out), "--checkpoints", root,
                      "--max-parallelism", "8", "--parallelism", "2", "--keep-running",
                      "--poll-seconds", "0.5")

    waiting = f"waiting for new files in {inp}"
    driver = Driver(tmp_path, "example", cmd, env)
    driver.wait_line(waiting)  # after two batches
    saved = statehold_cli("savepoint", job_uri, "sp", "--wait", "--timeout", "10", env=env)
    assert saved.code == 0, saved.err
    assert "savepoints/sp of checkpoint 1" in saved.out[0]
    if where == "s3":  # (one driver start less on local disk, where the stream's test kills)
        driver.kill()  # idle; its lease still looks alive for a while
        late = statehold_cli("savepoint", job_uri, "late", "--wait", "--timeout", "2", env=env)
        one_line_error(late, "timed out after 2s", "did not answer", "withdrawn")
        assert keys(storage, fmt.REQUESTS_DIR) == []  # withdrawn: nothing left behind
        assert {k.split("/")[1] for k in keys(storage, "savepoints")} == {"sp"}
        later.rename(inp / later.name)
        driver = Driver(tmp_path, "example", cmd, env)
        driver.wait_line(waiting)  # after the file added while it was down
    else:
        later.rename(inp / later.name)
        driver.wait_line(waiting, 2)  # after the file added meanwhile
    assert driver.batches() == (1 if where == "s3" else 3)
    stopped = statehold_cli("stop", job_uri, "--savepoint", "final", "--wait", "--timeout",
                            "10", env=env)
    assert stopped.code == 0, stopped.err
    assert driver.exited() == 0, driver.log.read_text()[-3000:]
    assert driver.lines[-1] == (
        "stopped from outside after checkpoint 2; savepoint savepoints/final"
    ), driver.lines[-3:]
    said = driver.log.read_text()
    assert "Traceback" not in said and "error:" not in said, said[-3000:]  # stderr
    assert read_output(out) == reference(inp)
    assert keys(storage, fmt.REQUESTS_DIR) == []  # both collected by --wait
    assert plan(open_job(storage), None).orphans == []
    assert tools.verify(f"{job_uri}/savepoints/final", **options).ok

    # the savepoint starts a new job: the next file, exact over everything
    last.rename(inp / last.name)
    job = StatefulJob(spark, root, "copy", max_parallelism=8, parallelism=2,
                      storage_options=options, restore_from=f"{job_uri}/savepoints/final")
    sink = output_sink(argparse.Namespace(output=out))
    result = totals_batch(job, read_files(spark, inp, [last.name]), check_rows, sink, 3,
                          ["_file", "_line"], {"last_file": last.name}, None)
    job.close()
    assert result.checkpoint_id == 3
    assert read_output(out) == reference(inp)
    copy = open_storage(f"{root}/copy", **options)
    assert final_state(copy, tmp_path / "reader", 8) == reference_state(inp)


def keys(storage: Storage, prefix: str) -> list[str]:
    """Every key under `prefix` in `storage`, listed."""
    return sorted(info.key for info in storage.list(prefix.rstrip("/") + "/"))


def test_a_run_batch_loop_sees_stop_requested(spark: SparkSession, tmp_path: Path) -> None:
    """A driver looping over run_batch itself: `serve_requests` while it waits for input
    takes a savepoint without a batch; the stop lands after the batch it asked during,
    `stop_requested` ends the loop, and run_batch refuses afterwards."""
    job = StatefulJob(spark, str(tmp_path), "looped", max_parallelism=8, parallelism=2)
    storage = open_storage(str(tmp_path / "looped"))
    batches = 0
    while not job.stop_requested:
        rows = spark.createDataFrame([(v % KEYS, v) for v in range(batches * 5, batches * 5 + 5)],
                                     "key long, value long")
        if batches == 1:  # asked from outside while the driver runs
            sent = submit(storage, job.coordinator.ha, "looped", Action.STOP, "at-stop")
        job.run_batch(rows, count, OUTPUT_SCHEMA)
        batches += 1
        if batches == 1:  # waiting for input: served without a batch
            idle = submit(storage, job.coordinator.ha, "looped", Action.SAVEPOINT, "idle")
            job.serve_requests()
            done = read_answer(storage, idle.id)
            assert done is not None and done.outcome is Outcome.DONE, done
            assert done.checkpoint_id == 0 and not job.stop_requested
        assert batches < 10, "the stop was never served"
    assert batches == 2 and job.stopped is not None
    answer = read_answer(storage, sent.id)
    assert answer is not None and answer.outcome is Outcome.DONE and answer.checkpoint_id == 1
    with pytest.raises(JobStoppedError, match="stopped from outside"):
        job.run_batch(rows, count, OUTPUT_SCHEMA)
    assert job.end() is True  # the stop's end: no second attempt
    assert exactly_once(dict(iter_state(str(tmp_path / "looped" / "savepoints" / "at-stop")))) == 9
    assert exactly_once(dict(iter_state(str(tmp_path / "looped" / "savepoints" / "idle")))) == 4
