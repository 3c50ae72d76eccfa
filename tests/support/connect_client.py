"""A Spark Connect client for the tests: statehold's documented API with a session from
``SparkSession.builder.remote(URL)``, in a process of its own.

    PYTHONPATH=src:. python -m tests.support.connect_client api URL ROOT RESULT_JSON
    PYTHONPATH=src:. python -m tests.support.connect_client stream URL INPUT OUTPUT ROOT
        [--pause-at N --mark PATH] [--processor]

A process of its own because a Connect session switches PySpark's module functions into
Connect mode for the whole process (``SPARK_CONNECT_MODE_ENABLED``), which a test process
sharing the classic session must not see; and because under Connect the client is not the
Spark driver, which a crash test kills separately.

``api`` runs `run_batch`, `transform_with_state`, `read_state` and `savepoint` and writes
what they gave, and the one-line refusals of what cannot work, to RESULT_JSON. ``stream``
runs the keyed totals as a Structured Streaming query through ``foreachBatch`` (one
input file per micro-batch, ``availableNow``) until the input is done; with
``--pause-at N`` the server-side batch N pauses after its sink wrote, once (the MARK file
says so), for the test to kill the server there. With ``--processor`` the query runs the
`Count` processor instead.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from statehold.errors import StateholdError
from tests.support.keyed_totals import MAXP, OUT, Reference, make_batches, outputs, to_df, totals
from tests.support.spark_versions import SparkProcessor

INPUT_SCHEMA = "key string, value long, seq long"
COUNT_OUT = "key string, count long"


if TYPE_CHECKING:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessorHandle, TimerValues


class Count(SparkProcessor):  # type: ignore[misc]
    """Rows per key so far (a class written for Spark's transformWithStateInPandas)."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.count = handle.getValueState("count", "n BIGINT")

    def handleInputRows(  # noqa: N802 - Spark's names
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues  # noqa: N803
    ) -> Iterator[pd.DataFrame]:
        have = self.count.get()
        total = (have[0] if have else 0) + sum(len(pdf) for pdf in rows)
        self.count.update((total,))
        yield pd.DataFrame({"key": [key[0]], "count": [total]})

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class PauseAfterSink:
    """A phase hook (it runs in the server's foreachBatch process): batch `batch` pauses
    after its sink wrote, once, having created `mark` (a hard link: whole once it exists)."""

    batch: int
    mark: str
    limit: float = 600.0

    def __call__(self, phase: str, batch_id: int) -> None:
        if phase != "after-sink" or batch_id != self.batch or os.path.exists(self.mark):
            return
        tmp = f"{self.mark}.{uuid.uuid4().hex}"
        with open(tmp, "w") as f:
            f.write(f"{os.getpid()}\n")
        try:
            os.link(tmp, self.mark)
        except FileExistsError:
            return
        finally:
            os.unlink(tmp)
        deadline = time.monotonic() + self.limit
        while time.monotonic() < deadline:
            time.sleep(0.2)
        raise StateholdError(f"nobody killed the server paused after batch {batch_id}'s sink")


def _refusal(call: Any) -> str | None:
    try:
        call()
    except StateholdError as e:
        return f"{type(e).__name__}: {e}"
    return None


def api(spark: Any, root: str) -> dict[str, Any]:
    from statehold.spark import StatefulJob, read_state, replace_output
    from statehold.spark.gc import gc_on_spark

    result: dict[str, Any] = {}
    job = StatefulJob(spark, root, "api", max_parallelism=MAXP)  # the default parallelism
    result["parallelism"] = job.parallelism
    ref = Reference()
    result["batches"], result["expected"] = [], []
    for rows in make_batches(3, seed=3):
        got = outputs(job.run_batch(to_df(spark, rows), totals, OUT, order_by=["seq"]))
        result["batches"].append(got)
        result["expected"].append(ref.apply(rows))
    result["expected_state"] = ref.state
    state = read_state(spark, job.job_dir, schema="count long, sum long, last array<long>")
    result["state"] = {
        r["key"]: {"count": r["count"], "sum": r["sum"], "last": list(r["last"])}
        for r in state.collect()
    }
    untyped = read_state(spark, job.job_dir)
    result["state_json"] = {
        r["key"]: {name: json.loads(r[name]) for name in ("count", "sum", "last")}
        for r in untyped.collect()
    }
    result["savepoint"] = job.savepoint("before-upgrade").checkpoint_id
    result["refused"] = {
        "progress_listener": _refusal(lambda: job.progress_listener(lambda p, r: None)),
        "gc_on_spark": _refusal(lambda: gc_on_spark(spark, job.job_dir)),
        "fire_due_timers": _refusal(
            lambda: StatefulJob(spark, root, "timers", max_parallelism=MAXP, parallelism=2)
            .foreach_batch(Count(), COUNT_OUT, sink=replace_output(root + "-out"))
            .fire_due_timers()  # type: ignore[attr-defined]
        ),
        "foreach_batch_with_metrics": _refusal(
            lambda: StatefulJob(spark, root, "metrics", max_parallelism=MAXP, parallelism=2,
                                metrics_port=0)
            .foreach_batch(totals, OUT, sink=replace_output(root + "-out"))
        ),
    }
    job.close()

    counting = StatefulJob(spark, root, "proc", max_parallelism=MAXP, parallelism=2)
    counts: dict[str, int] = {}
    result["processor"], result["processor_expected"] = [], []
    for rows in make_batches(2, seed=5):
        done = counting.transform_with_state(to_df(spark, rows), Count(), COUNT_OUT)
        assert done.output is not None
        result["processor"].append({r["key"]: r["count"] for r in done.output.collect()})
        for key, _value, _seq in rows:
            counts[key] = counts.get(key, 0) + 1
        result["processor_expected"].append({k: counts[k] for k in {r[0] for r in rows}})
    counting.close()
    return result


def stream(spark: Any, args: argparse.Namespace) -> None:
    from statehold.spark import StatefulJob, replace_output

    hook = None if args.pause_at is None else PauseAfterSink(args.pause_at, args.mark)
    job = StatefulJob(spark, args.root, "stream", max_parallelism=MAXP, parallelism=2,
                      on_phase=hook)
    rows = (spark.readStream.schema(INPUT_SCHEMA).option("maxFilesPerTrigger", 1)
            .json(args.input))
    if args.processor:
        run = job.foreach_batch(Count(), COUNT_OUT, sink=replace_output(args.output))
    else:
        run = job.foreach_batch(totals, OUT, sink=replace_output(args.output),
                                order_by=["seq"])
    query = (rows.writeStream.foreachBatch(run)
             .option("checkpointLocation", job.spark_checkpoint_location)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    refused = _refusal(lambda: job.savepoint("from-the-client"))
    print(f"query done; client savepoint refused: {refused}", flush=True)


def write_inputs(folder: str, batches: int, seed: int) -> None:
    """One JSON-lines file per micro-batch (`make_batches`), in order of modification."""
    os.makedirs(folder, exist_ok=True)
    for i, batch in enumerate(make_batches(batches, seed=seed)):
        lines = [json.dumps({"key": k, "value": v, "seq": s}) for k, v, s in batch]
        path = os.path.join(folder, f"part-{i:03d}.json")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="what", required=True)
    a = sub.add_parser("api")
    a.add_argument("url")
    a.add_argument("root")
    a.add_argument("result")
    s = sub.add_parser("stream")
    s.add_argument("url")
    s.add_argument("input")
    s.add_argument("output")
    s.add_argument("root")
    s.add_argument("--pause-at", type=int)
    s.add_argument("--mark")
    s.add_argument("--processor", action="store_true", help="the Count processor instead")
    args = p.parse_args(argv)

    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(args.url).getOrCreate()
    if args.what == "api":
        with open(args.result, "w") as f:
            json.dump(api(spark, args.root), f)
    else:
        stream(spark, args)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
