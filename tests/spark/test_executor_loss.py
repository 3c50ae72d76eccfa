"""A batch rides through the loss of an executor at any of its phases, without a restart.

One driver subprocess (tests/support/executor_loss.py) runs ``local-cluster[2,1,1024]`` (two
executor JVMs) and, per phase, a job of three batches of running totals whose batch 1
loses an executor to kill -9: while keying and routing the rows (``staging``), inside a
stateful task (``state``), after the acks were collected and before the sink, taking the
cached result of partition 0 with it (``after-tasks``: with ``localCheckpoint`` this
failed the batch with CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND), inside the sink's own Spark job
(``sink``), and while a task uploads its snapshot (``upload``). Spark retries the lost
tasks and recomputes lost cached blocks from lineage; the driver must never fail. Then:
every batch's output and the final state equal a plain-Python computation (exactly once),
and the job directory is listed: every file of the retained checkpoints is there and
whole, and, the job ended, no orphan is left (a re-run task's unacknowledged uploads
included).

One Spark session for all phases keeps the cost to one cluster start (see
docs/design.md, "A cluster of executors", for the time it takes). The same phases run
again on a standalone master with two workers (tests/support/cluster.py, the session's
`standalone` fixture), whose executors are separate worker-launched JVMs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from statehold.cleanup.reconcile import plan
from statehold.job.directory import open_job
from statehold.storage import open_storage
from statehold.tools import locate, verify
from tests.support.example_runs import final_state
from tests.support.executor_loss import BATCHES, KILL_BATCH, MAX_PARALLELISM, PHASES, reference
from tests.support.paths import ROOT, SRC

pytestmark = [pytest.mark.spark, pytest.mark.crash, pytest.mark.timeout(2400)]

MASTER = "local-cluster[2,1,1024]"


@pytest.fixture(scope="module", params=["local-cluster", "standalone"])
def losses(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Path]:
    """Run every phase in one driver (one Spark cluster); its work directory."""
    from tests.support.infra import provision

    provision.require("java")
    work = tmp_path_factory.mktemp(f"executor-loss-{request.param}")
    if request.param == "local-cluster":
        yield run_driver(work, MASTER)
        return
    yield run_driver(work, request.getfixturevalue("standalone").url)


def run_driver(work: Path, master: str) -> Path:
    env = {k: v for k, v in os.environ.items() if k != "STATEHOLD_LOCAL_DIR"}
    env.update(PYTHONPATH=os.pathsep.join([str(SRC), str(ROOT)]),
               PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    log = work / "driver.log"
    code = "import sys, tests.support.executor_loss as d; sys.exit(d.main(sys.argv[1:]))"
    with open(log, "wb") as out:
        done = subprocess.run([sys.executable, "-c", code, str(work), master, *PHASES],
                              cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                              timeout=2200)
    assert done.returncode == 0, log.read_text()[-4000:]
    return work


def read_outputs(out: Path) -> list[dict[str, list[Any]]]:
    batches = []
    for batch_id in range(BATCHES):
        rows = json.loads((out / f"batch-{batch_id}.json").read_text())
        assert len({r[0] for r in rows}) == len(rows), f"a key output twice in {batch_id}"
        batches.append({r[0]: [r[1], r[2], r[3]] for r in rows})
    return batches




@pytest.mark.parametrize("phase", PHASES)
def test_batch_survives_executor_loss(phase: str, losses: Path, tmp_path: Path) -> None:
    result = json.loads((losses / phase / "result.json").read_text())
    log = (losses / "driver.log").read_text()[-4000:]
    assert "error" not in result, result.get("traceback", "") + log
    assert result["killed"] and "killed executor" in result["killed"], result
    assert result["ended"] is True

    expected_outputs, expected_state = reference()
    assert read_outputs(losses / phase / "output") == expected_outputs
    job = open_storage(str(losses / "checkpoints" / phase))
    assert final_state(job, tmp_path / "reader", MAX_PARALLELISM) == {
        k: {"count": v["count"], "sum": v["sum"], "last": v["last"]}
        for k, v in expected_state.items()
    }

    # The storage, listed: every retained checkpoint whole, and no orphan after the end.
    with open_job(job) as opened:
        retained = opened.ha.read().retained
        assert [p.checkpoint_id for p in retained] == [BATCHES - 1]  # the end keeps one
        for ptr in retained:
            report = verify(locate(job, ptr.metadata))
            assert report.ok, (ptr.metadata, report.problems)
            assert report.files_checked > 0
        leftovers = plan(opened, None)
    assert leftovers.orphan_count == 0, [f.key for f in leftovers.orphans]

    runs = result["runs"]  # the stateful task attempts of the killed batch
    ran_again = len(runs) > len({r["partition"] for r in runs})
    if phase in ("state", "upload", "after-tasks"):
        # a task killed mid-run, or a finished one whose cached result was lost, ran again
        assert ran_again, runs
    if phase == "after-tasks":
        # ... and the re-run's uploads were unreferenced until the job's end removed them
        assert result["orphans_after_kill_batch"], result
    print(phase, result["seconds"], len(runs), "task runs in batch", KILL_BATCH,
          len(result.get("orphans_after_kill_batch", [])), "orphans after it")
