"""A driver that loses an executor (kill -9 of its JVM) at one phase of a batch and must
carry on: the pipeline of tests/spark/test_executor_loss.py.

    python -c 'import sys, tests.support.executor_loss as d; d.main(sys.argv[1:])' \
        ROOT MASTER PHASE [PHASE ...]   (from the repository, so its classes pickle by name)

One Spark session (``MASTER``, e.g. ``local-cluster[2,1,1024]``) runs, per phase, a job of
`BATCHES` batches of running totals into ``ROOT/checkpoints/<phase>``, with a sink writing
each batch's rows to ``ROOT/<phase>/output/batch-<N>.json``; in batch `KILL_BATCH` one
executor JVM is killed with SIGKILL, once, at that phase:

* ``staging``: in a task of the map stage that keys and routes the rows;
* ``state``: in a stateful task, while it updates a key;
* ``after-tasks``: on the driver, after the acks were collected, before the sink: the
  executor holding the cached result of partition 0 (it ran that partition's task);
* ``sink``: in a task of the sink's own Spark job, reading the cached result;
* ``upload``: in a stateful task, in its first upload of a snapshot file.

An executor-side kill is made by the task's Python worker: it finds its executor JVM
(tests/support/cluster.py ``executor_of``), kills it, then itself. A hard link on a mark file makes
it happen once per phase, whichever task gets there first. Every stateful task attempt
leaves a file in ``ROOT/<phase>/runs/`` (batch, partition, attempt, executor pid), so the
test can see which tasks ran again. The job ends (`StatefulJob.end`) after the last
batch; ``ROOT/<phase>/result.json`` tells how it went. Spark starts local executors with
the driver's environment: the repository must be on PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import signal
import time
import traceback
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from statehold.spark import KeyedState, StatefulJob

PHASES = ("staging", "state", "after-tasks", "sink", "upload")
BATCHES = 3
KILL_BATCH = 1
MAX_PARALLELISM = 16
INPUT = "key string, value long, seq long"
OUTPUT = "key string, count long, sum long, last array<long>"
KEYS = 30
ROWS = 120
LAST_N = 8
#: How long to wait for the killed executor to be replaced (not an assertion: the next
#: phase starts with two executors again, or the driver says it could not).
EXECUTOR_WAIT = 600.0


def batch_rows(batch_id: int) -> list[tuple[str, int, int]]:
    """The input of batch `batch_id`: (key, value, seq), the same on every run."""
    rows = []
    for i in range(ROWS):
        seq = batch_id * ROWS + i
        rows.append((f"k{(seq * 7 + batch_id) % KEYS:02d}", (seq * 31) % 97 - 20, seq))
    return rows


def reference() -> tuple[list[dict[str, list[Any]]], dict[str, dict[str, Any]]]:
    """Per batch, each touched key's (count, sum, last values) after it; and the state."""
    state: dict[str, dict[str, Any]] = {}
    outputs = []
    for batch_id in range(BATCHES):
        touched: dict[str, list[Any]] = {}
        for key, value, _seq in batch_rows(batch_id):
            st = state.setdefault(key, {"count": 0, "sum": 0, "last": []})
            st["count"] += 1
            st["sum"] += value
            st["last"] = (st["last"] + [value])[-LAST_N:]
            touched[key] = [st["count"], st["sum"], list(st["last"])]
        outputs.append(touched)
    return outputs, state


# -- the kill, executor side -------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    """Kill once at `phase` of batch `batch`; `mark` is taken by the one task that does."""

    phase: str
    batch: int
    mark: str
    runs: str

    def take(self) -> bool:
        """True for exactly one caller, on any executor (an atomic hard link)."""
        if os.path.exists(self.mark):
            return False
        tmp = f"{self.mark}.{uuid.uuid4().hex}"
        with open(tmp, "w") as f:
            f.write(f"{os.getpid()}\n")
        try:
            os.link(tmp, self.mark)
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)

    def kill_here(self, phase: str, batch_id: int) -> None:
        """In a Python worker: if this is the moment, kill -9 the executor JVM running it,
        then this worker (left orphaned by its JVM)."""
        if phase != self.phase or batch_id != self.batch or not self.take():
            return
        from tests.support.cluster import executor_of

        executor = executor_of(os.getpid())
        with open(self.mark, "a") as f:
            f.write(f"killed executor {executor}\n")
        os.kill(executor, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass(frozen=True)
class KillInStaging:
    """A narrow step on the input, so it runs in the map stage that keys the rows."""

    plan: Plan
    batch_id: int

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            self.plan.kill_here("staging", self.batch_id)
            yield batch


@dataclass(frozen=True)
class KillInSink:
    """The sink's own Spark job reads the cached result through this."""

    plan: Plan
    batch_id: int

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            self.plan.kill_here("sink", self.batch_id)
            yield batch


#: The plan of the stateful task running in this worker, for the upload hook.
_task_plan: tuple[Plan, int] | None = None
_recorded: set[int] = set()


def _patch_uploads() -> None:
    """Once per worker: local uploads first ask the running task's plan whether to kill."""
    from statehold.format import layout
    from statehold.storage.local import LocalStorage

    original = LocalStorage.upload
    if getattr(original, "executor_loss", False):
        return

    def upload(self: LocalStorage, local_path: Path, key: str) -> None:
        if _task_plan is not None:
            plan, batch_id = _task_plan
            if layout.parse(key).checkpoint_id == batch_id:
                plan.kill_here("upload", batch_id)
        original(self, local_path, key)

    upload.executor_loss = True  # type: ignore[attr-defined]
    LocalStorage.upload = upload  # type: ignore[method-assign]


@dataclass(frozen=True)
class Totals:
    """Per key: count, sum and the last values, in input order (`seq`)."""

    plan: Plan
    batch_id: int

    def __call__(self, key: str, rows: list[dict[str, Any]],
                 state: KeyedState) -> list[tuple[Any, ...]]:
        global _task_plan
        self._record()
        _task_plan = (self.plan, self.batch_id)
        _patch_uploads()
        self.plan.kill_here("state", self.batch_id)
        count, total, last = state.value("count"), state.value("sum"), state.list("last")
        values = [int(r["value"]) for r in rows]
        n, s = (count.get() or 0) + len(values), (total.get() or 0) + sum(values)
        count.update(n)
        total.update(s)
        last.update((last.get() + values)[-LAST_N:])
        return [(key, n, s, last.get())]

    def _record(self) -> None:
        """One file per stateful task attempt: batch, partition, attempt, executor."""
        from pyspark import TaskContext

        from tests.support.cluster import executor_of

        ctx = TaskContext.get()
        if ctx is None or ctx.taskAttemptId() in _recorded:
            return
        _recorded.add(ctx.taskAttemptId())
        name = (f"b{self.batch_id}-p{ctx.partitionId()}-a{ctx.attemptNumber()}-"
                f"t{ctx.taskAttemptId()}-s{ctx.stageId()}")
        Path(self.plan.runs, name).write_text(str(executor_of(os.getpid())))


# -- the driver ------------------------------------------------------------------------
def task_runs(runs: Path, batch_id: int) -> list[dict[str, int]]:
    """The stateful task attempts of `batch_id` recorded in `runs`."""
    found = []
    for f in sorted(runs.glob(f"b{batch_id}-*")):
        _b, p, a, t, s = f.name.split("-")
        found.append({"partition": int(p[1:]), "attempt": int(a[1:]), "task": int(t[1:]),
                      "stage": int(s[1:]), "executor": int(f.read_text())})
    return found


def kill_block_holder(plan: Plan) -> None:
    """Driver side, after the acks: kill -9 the executor that ran partition 0's task (so
    holds its cached block) and wait until it is gone."""
    from tests.support.cluster import alive

    if not plan.take():
        return
    holders = [r["executor"] for r in task_runs(Path(plan.runs), plan.batch)
               if r["partition"] == 0]
    assert holders, "no stateful task of partition 0 recorded"
    executor = holders[-1]
    with open(plan.mark, "a") as f:
        f.write(f"killed executor {executor}\n")
    os.kill(executor, signal.SIGKILL)
    while alive(executor):
        time.sleep(0.1)


def executors(spark: SparkSession) -> int:
    """Executors registered with the driver (the driver's own block manager excluded)."""
    jsc: Any = spark.sparkContext._jsc  # noqa: SLF001
    return int(jsc.sc().getExecutorMemoryStatus().size()) - 1


def wait_for_executors(spark: SparkSession, n: int = 2) -> None:
    deadline = time.monotonic() + EXECUTOR_WAIT
    while executors(spark) < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"fewer than {n} executors after {EXECUTOR_WAIT:.0f} s")
        time.sleep(0.5)


def write_output(out: Path, batch_id: int, rows: list[list[Any]]) -> None:
    """Replace batch `batch_id`'s output (a replayed batch writes it again)."""
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".batch-{batch_id}.{uuid.uuid4().hex}"
    tmp.write_text(json.dumps(sorted(rows)))
    os.replace(tmp, out / f"batch-{batch_id}.json")


def run_phase(spark: SparkSession, root: Path, phase: str, master: str) -> dict[str, Any]:
    from statehold.cleanup.reconcile import plan as reconcile_plan
    from statehold.spark import StatefulJob

    base = root / phase
    runs = base / "runs"
    runs.mkdir(parents=True)
    kill = Plan(phase, KILL_BATCH, str(base / "killed"), str(runs))
    result: dict[str, Any] = {"phase": phase, "master": master, "seconds": {}}

    def on_phase(name: str, batch_id: int) -> None:
        if name == "after-tasks" and phase == "after-tasks" and batch_id == KILL_BATCH:
            kill_block_holder(kill)
        if name == "after-complete" and batch_id == KILL_BATCH:
            # Listed before any reconcile: what the kill left unreferenced (a task's
            # re-run or partial uploads), which the job end must remove.
            listed = reconcile_plan(job.coordinator.job, None)
            result["orphans_after_kill_batch"] = sorted(f.key for f in listed.orphans)

    def sink(output: DataFrame, batch_id: int) -> None:
        read = output.mapInArrow(KillInSink(kill, batch_id), output.schema)
        write_output(base / "output", batch_id, [list(r) for r in read.collect()])

    job: StatefulJob = StatefulJob(
        spark, str(root / "checkpoints"), phase, max_parallelism=MAX_PARALLELISM,
        parallelism=2, retain=2, on_phase=on_phase,
    )
    try:
        for batch_id in range(BATCHES):
            wait_for_executors(spark)
            started = time.perf_counter()
            df = spark.createDataFrame(batch_rows(batch_id), INPUT)
            df = df.mapInArrow(KillInStaging(kill, batch_id), INPUT)
            job.run_batch(df, Totals(kill, batch_id), OUTPUT, key="key", batch_id=batch_id,
                          order_by=["seq"], sink=sink)
            result["seconds"][batch_id] = round(time.perf_counter() - started, 2)
        result["ended"] = job.end()
    finally:
        job.close()
    result["killed"] = Path(kill.mark).read_text() if Path(kill.mark).exists() else None
    result["runs"] = task_runs(runs, KILL_BATCH)
    return result


def main(argv: list[str]) -> int:
    from pyspark.sql import SparkSession

    root, master, phases = Path(argv[0]), argv[1], argv[2:]
    spark = (
        SparkSession.builder.master(master)
        .appName("statehold-executor-loss")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.task.maxFailures", "4")
        .config("spark.python.worker.reuse", "true")
        # a standalone worker's executors do not inherit the driver's environment
        .config("spark.executorEnv.PYTHONPATH", os.environ.get("PYTHONPATH", ""))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        for phase in phases:
            try:
                result = run_phase(spark, root, phase, master)
            except BaseException as e:
                result = {"phase": phase, "error": f"{type(e).__name__}: {e}",
                          "traceback": traceback.format_exc()}
            (root / phase / "result.json").write_text(json.dumps(result, indent=1))
            print(json.dumps({k: v for k, v in result.items() if k != "traceback"}),
                  flush=True)
    finally:
        spark.stop()
    return 0
