"""statehold through Spark Connect (PySpark 4): a server started from PySpark's own jars
(tests/support/infra/connect_server.py), clients in processes of their own
(tests/support/connect_client.py).

The documented API with a ``SparkSession.builder.remote(...)`` session gives exactly the
plain-Python reference's results, and what cannot work there refuses in one line. A
Structured Streaming query through Connect (foreachBatch runs beside the server) survives
a kill -9 of the server, the Spark driver under Connect, in the middle of a batch: a new
server and a new client resume from the same checkpoint location, the output and state
are exact, every referenced file is there and no orphan is left."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from statehold.format import layout
from statehold.job.directory import open_job
from statehold.storage import open_storage
from tests.support.connect import (
    CLIENT_TIMEOUT,
    client_cmd,
    client_env,
    connect_server,
    run_api,
    run_client,
)
from tests.support.connect_client import write_inputs
from tests.support.infra.connect_server import ConnectServer
from tests.support.kafka_runs import check_retained_intact, latest_id
from tests.support.keyed_totals import Reference, make_batches, stored_state

pytestmark = [pytest.mark.spark, pytest.mark.matrix]
__all__ = ["connect_server"]  # the session fixture

BATCHES = 5
SEED = 21
PAUSE_AT = 2


@pytest.fixture(scope="module")
def api_run(
    connect_server: ConnectServer, tmp_path_factory: pytest.TempPathFactory
) -> tuple[dict[str, Any], Path]:
    """One run of the client's ``api`` scenario: what it gave, and its checkpoint root."""
    work = tmp_path_factory.mktemp("connect-api")
    return run_api(work, connect_server, work / "ckpt"), work / "ckpt"


def test_connect_api_exact(api_run: tuple[dict[str, Any], Path]) -> None:
    """run_batch, transform_with_state, read_state (typed and JSON) and savepoint through
    Connect, against the reference; the default parallelism without a SparkContext."""
    result, root = api_run
    assert result["parallelism"] == 2  # the server's local[2]
    assert len(result["batches"]) == 3
    assert result["batches"] == result["expected"]
    assert result["state"] == result["expected_state"]
    assert result["state_json"] == result["expected_state"]
    assert result["processor"] == result["processor_expected"]
    assert result["savepoint"] == 2
    savepoint = root / "api" / "savepoints" / "before-upgrade"
    assert savepoint.is_dir()


def test_connect_refuses_in_one_line(api_run: tuple[dict[str, Any], Path]) -> None:
    """What needs the JVM driver, or a live object of the client, says why at once."""
    refused: dict[str, Any] = api_run[0]["refused"]
    assert set(refused) == {"progress_listener", "gc_on_spark", "fire_due_timers",
                            "foreach_batch_with_metrics"}
    for what, line in refused.items():
        assert line is not None, f"{what} was not refused"
        assert line.startswith("ConnectUnsupportedError: "), line
        assert "does not work under Spark Connect: " in line, line
        assert "\n" not in line, line
    assert "statehold gc` without --spark" in refused["gc_on_spark"]
    assert refused["foreach_batch_with_metrics"].startswith(
        "ConnectUnsupportedError: metrics_port with foreach_batch ")


def test_connect_gc_spark_cli_refuses(
    connect_server: ConnectServer, api_run: tuple[dict[str, Any], Path]
) -> None:
    """``statehold gc --spark`` given a Connect session (SPARK_REMOTE): one line, no gc."""
    job_dir = api_run[1] / "api"
    before = sorted(str(p) for p in job_dir.rglob("*"))
    done = subprocess.run(
        [sys.executable, "-m", "statehold", "gc", "--spark", str(job_dir)],
        env={**client_env(), "SPARK_REMOTE": connect_server.url}, capture_output=True,
        text=True, timeout=CLIENT_TIMEOUT, stdin=subprocess.DEVNULL,
    )
    assert done.returncode != 0, done.stdout
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert "gc --spark does not work under Spark Connect" in lines[0]
    assert sorted(str(p) for p in job_dir.rglob("*")) == before


def _output(folder: Path) -> dict[int, dict[str, Any]]:
    """The sink's output: batch id -> key -> (count, sum, last) (replace_output, JSON)."""
    got: dict[int, dict[str, Any]] = {}
    for batch in sorted(folder.glob("batch-*")):
        rows = got.setdefault(int(batch.name.split("-")[1]), {})
        for part in sorted(batch.glob("part-*")):
            for line in part.read_text().splitlines():
                row = json.loads(line)
                assert row["key"] not in rows, f"{row['key']} twice in {batch.name}"
                rows[row["key"]] = [row["count"], row["sum"], row["last"]]
    return got


def _wait_for(mark: Path, client: subprocess.Popen[str], server: ConnectServer) -> None:
    deadline = time.monotonic() + CLIENT_TIMEOUT
    while not mark.exists():
        if client.poll() is not None:
            out, err = client.communicate()
            pytest.fail(f"the client ended before batch {PAUSE_AT} paused:\n{out}\n"
                        f"{err[-6000:]}\n{server.tail()}")
        if time.monotonic() > deadline:
            client.kill()
            pytest.fail(f"batch {PAUSE_AT} did not pause:\n{server.tail()}")
        time.sleep(0.2)


def test_connect_stream_survives_server_kill(
    connect_server: ConnectServer, tmp_path: Path
) -> None:
    """foreachBatch through Connect; the server (the Spark driver) killed -9 after batch
    2's sink wrote and before its checkpoint completed; a new server and a new client run
    the query on from the same checkpoint location: exact output and state, storage
    listed (every referenced file there, no orphan)."""
    inputs, output, root = tmp_path / "in", tmp_path / "out", tmp_path / "ckpt"
    mark = tmp_path / "paused"
    write_inputs(str(inputs), BATCHES, SEED)
    args = ["stream", connect_server.url, str(inputs), str(output), str(root)]
    client = subprocess.Popen(
        client_cmd(*args, "--pause-at", str(PAUSE_AT), "--mark", str(mark)), cwd=tmp_path,
        env=client_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        stdin=subprocess.DEVNULL,
    )
    _wait_for(mark, client, connect_server)
    job = open_storage(str(root)).child("stream")
    assert latest_id(job) == PAUSE_AT - 1  # batch 2's checkpoint is not complete
    assert (output / f"batch-{PAUSE_AT:08d}").is_dir()  # its output is written
    connect_server.kill()
    # The client's gRPC retries would wait minutes for the dead server: it goes too, and
    # a new client restarts the query (with or without it, the server held the query).
    client.kill()
    client.wait()

    connect_server.start()
    done = run_client(tmp_path, *[connect_server.url if a.startswith("sc://") else a
                                  for a in args])
    assert "client savepoint refused: ConnectUnsupportedError" in done.stdout

    ref = Reference()
    expected = {i: ref.apply(rows) for i, rows in enumerate(make_batches(BATCHES, seed=SEED))}
    got = _output(output)
    assert sorted(got) == list(range(BATCHES))
    for i in range(BATCHES):
        assert got[i] == {k: list(v) for k, v in expected[i].items()}, f"batch {i}"
    assert latest_id(job) == BATCHES - 1  # checkpoint N = Spark batch N
    with open_job(job) as opened:  # batches 2.. ran in the second server's attempt
        assert [p.epoch for p in opened.ha.read().retained][-1] == 2
    assert stored_state(job) == ref.state
    assert (root / "stream" / layout.SPARK_DIR / "commits").is_dir()
    check_retained_intact(job)


def test_connect_stream_processor_exact(connect_server: ConnectServer, tmp_path: Path) -> None:
    """A stateful processor (a class written for Spark) through foreachBatch under
    Connect, in two runs of the query: the counts are exact across the restart."""
    inputs, output, root = tmp_path / "in", tmp_path / "out", tmp_path / "ckpt"
    batches = list(make_batches(3, seed=SEED))
    write_inputs(str(inputs), 2, SEED)
    args = ["stream", connect_server.url, str(inputs), str(output), str(root), "--processor"]
    run_client(tmp_path, *args)
    write_inputs(str(inputs), 3, SEED)  # the third file is new; the first two unchanged
    run_client(tmp_path, *args)
    counts: dict[str, int] = {}
    expected = []
    for rows in batches:
        for key, _value, _seq in rows:
            counts[key] = counts.get(key, 0) + 1
        expected.append({key: counts[key] for key, _v, _s in rows})
    got = []
    for batch in sorted(output.glob("batch-*")):
        rows_out = [json.loads(line) for part in sorted(batch.glob("part-*"))
                    for line in part.read_text().splitlines()]
        got.append({r["key"]: r["count"] for r in rows_out})
        assert len(rows_out) == len(got[-1]), f"a key twice in {batch.name}"
    assert got == expected
    check_retained_intact(open_storage(str(root)).child("stream"))
