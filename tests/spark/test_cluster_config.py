"""The cluster-like configuration end to end: the example pipeline (a real subprocess,
Spark local mode) with its checkpoints on S3 (moto server) and its HA store in a real
ZooKeeper. A first run over three input files, a second run after a fourth file arrives;
each batch's output equals a plain-Python computation, the pointers live in ZooKeeper (not
in ``_ha/`` on S3), and ``statehold verify --ha zookeeper://...`` passes on the job
directory on S3.

The subprocesses import statehold from this work tree's ``src/`` (PYTHONPATH), whatever
the installed copy is."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path

import pytest

from statehold.format import layout
from statehold.format.layout import Kind
from statehold.format.metadata import read_metadata
from statehold.ha.zookeeper import ZooKeeperHAStore
from statehold.storage import open_storage
from statehold.tools import verify
from tests.support.infra.object_store_servers import S3Server
from tests.support.paths import SRC
from tests.support.zk import ZooKeeperServer

pytestmark = [pytest.mark.spark, pytest.mark.zookeeper, pytest.mark.scenario]

#: The `statehold` console script's entry point, run with this interpreter.
STATEHOLD = ("-c", "from statehold.cli import main; main()")
#: Bound on one subprocess (a hang fails the test instead of blocking the suite).
TIMEOUT = 600

Totals = dict[str, tuple[int, int]]


def write_inputs(input_dir: Path, first: int, count: int, rows: int = 30) -> None:
    """`count` small JSON-lines files ``part-<i>.jsonl`` (key: string, value: int)."""
    input_dir.mkdir(parents=True, exist_ok=True)
    for i in range(first, first + count):
        rng = random.Random(i)
        lines = [
            json.dumps({"key": f"k{rng.randrange(7)}", "value": rng.randrange(-20, 100)})
            for _ in range(rows)
        ]
        (input_dir / f"part-{i:05d}.jsonl").write_text("\n".join(lines) + "\n")


def reference(input_dir: Path) -> list[Totals]:
    """Per batch (one file each, in name order): (count, sum) of the keys it touched."""
    totals: Totals = {}
    batches = []
    for path in sorted(input_dir.glob("*.jsonl")):
        touched: Totals = {}
        for line in path.read_text().splitlines():
            row = json.loads(line)
            count, total = totals.get(row["key"], (0, 0))
            totals[row["key"]] = touched[row["key"]] = (count + 1, total + row["value"])
        batches.append(touched)
    return batches


def read_output(output: Path) -> list[Totals]:
    batches = []
    for d in sorted(output.glob("batch-*"), key=lambda p: int(p.name.split("-")[1])):
        rows: Totals = {}
        for part in d.glob("part-*.json"):
            for line in part.read_text().splitlines():
                r = json.loads(line)
                assert r["key"] not in rows, f"{d.name}: key {r['key']} written twice"
                rows[r["key"]] = (r["count"], r["sum"])
        batches.append(rows)
    return batches


def env_for(tmp: Path, extra: Mapping[str, str]) -> dict[str, str]:
    path = [str(SRC), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
    return {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join(path),
        "STATEHOLD_LOCAL_DIR": str(tmp / "task-state"),
        **extra,
    }


def run(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=TIMEOUT,
    )


def test_example_on_s3_with_zookeeper(
    tmp_path: Path,
    s3_server: S3Server,
    zk_server: ZooKeeperServer,
) -> None:
    job_id = f"cluster-{uuid.uuid4().hex[:8]}"
    root = f"s3://{s3_server.bucket}/cluster-config-{os.getpid()}"
    job_uri = f"{root}/{job_id}"
    ha_uri = f"zookeeper://{zk_server.hosts}/statehold"
    input_dir, output = tmp_path / "input", tmp_path / "output"
    env = env_for(tmp_path, s3_server.env)
    example = (
        "-m", "statehold.examples.running_totals", "--input", str(input_dir),
        "--output", str(output), "--checkpoints", root, "--job-id", job_id,
        "--ha", ha_uri, "--retain", "2",
    )
    job = open_storage(job_uri, **s3_server.options)
    ha = ZooKeeperHAStore.from_uri(ha_uri, job_id)
    try:
        write_inputs(input_dir, 0, 3)
        first = run(tmp_path, env, *example)
        assert first.returncode == 0, first.stderr[-3000:]
        assert read_output(output) == reference(input_dir)
        state = ha.read()
        assert [p.checkpoint_id for p in state.retained] == [1, 2]
        files = {info.key for info in job.list()}
        assert layout.checkpoint_metadata_key(2) in files
        # Only ZooKeeper holds the pointers: no HA document on S3.
        assert not any(layout.parse(k).kind is Kind.HA for k in files), sorted(files)
        meta = read_metadata(job, layout.checkpoint_metadata_key(2))
        assert meta.source_position["last_file"] == "part-00002.jsonl"

        # A file added later: the second run resumes after the last file of the newest
        # checkpoint in ZooKeeper (batch 3), not from scratch.
        write_inputs(input_dir, 3, 1)
        second = run(tmp_path, env, *example)
        assert second.returncode == 0, second.stderr[-3000:]
        assert "checkpoint 3," in second.stdout
        assert "checkpoint 0," not in second.stdout
        assert read_output(output) == reference(input_dir)
        state = ha.read()
        assert [p.checkpoint_id for p in state.retained] == [2, 3]
        assert state.epoch == 2  # one epoch per run

        # The job directory on S3 verifies against the ZooKeeper pointers: by the CLI ...
        cli = run(tmp_path, env, *STATEHOLD, "verify", "--json", "--ha", ha_uri, job_uri)
        assert cli.returncode == 0, cli.stdout[-2000:] + cli.stderr[-2000:]
        doc = json.loads(cli.stdout)
        assert doc["ok"] and doc["metadata_path"] == layout.checkpoint_metadata_key(3)
        assert doc["files_checked"] > 0
        # ... and by the Python API, for both retained checkpoints.
        for pointer in state.retained:
            report = verify(f"{job_uri}/chk-{pointer.checkpoint_id}", ha=ha,
                            **s3_server.options)
            assert report.ok, report.problems
        # Without --ha the CLI uses the store the job directory records (ZooKeeper) ...
        recorded = run(tmp_path, env, *STATEHOLD, "verify", "--json", job_uri)
        assert recorded.returncode == 0, recorded.stderr[-2000:]
        assert json.loads(recorded.stdout)["metadata_path"] == layout.checkpoint_metadata_key(3)
        # ... and naming another one is refused with the right --ha, not read as empty.
        embedded = run(tmp_path, env, *STATEHOLD, "verify", "--ha", "embedded", job_uri)
        assert embedded.returncode == 1
        assert "use --ha zookeeper://" in embedded.stderr
    finally:
        ha.close()
