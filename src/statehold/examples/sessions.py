"""Sessions per user, closed by event-time timers: the stateful-processor example.

    python -m statehold.examples.sessions --input IN --output OUT --checkpoints CKPT

Reads ``*.jsonl`` files from ``--input`` in name order (``--files-per-batch`` per batch),
rows ``{"user": str, "ts": int epoch seconds, "page": str}``. A user's events less than
``--gap-seconds`` apart (a gap of exactly that much too) form one session; the watermark
is the newest ``ts`` seen minus ``--watermark-delay-seconds``, and a session closes when
the watermark reaches its ``end + gap`` (``end``: the ts of its last event). Each closed
session is written once, as a JSON line ``{"user", "start", "end", "events"}`` under
``--output`` (``batch-<N>/``; a replayed batch replaces its own output), and its state and
timer are removed. Rows at or before the watermark of their batch are late: dropped and
counted.

Batch N ends in checkpoint N in ``<checkpoints>/<job-id>/`` (a directory or
``s3://bucket/prefix``, S3 settings from ``AWS_*``); the checkpoint records the files read
and the watermark, so a run (also after kill -9) resumes after the last checkpoint. When
the input is consumed, the run goes on with batches without input while a timer is due
(a timer fires in the batch after the one that moved the watermark past it), then exits;
``--keep-running`` polls for new files instead, serving the savepoints and stops asked
from outside while it waits (``statehold savepoint``/``stop``; a stop exits 0 with one
``stopped from outside ...`` line).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from statehold.examples import common
from statehold.processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from statehold.spark import BatchResult, PhaseHook, StatefulJob

INPUT_SCHEMA = "user string, ts long, page string"
OUTPUT_SCHEMA = "user string, start long, end long, events long"
EVENT_MS = "_event_ms"


def merge(sessions: list[list[int]], ts: int, gap: int) -> list[list[int]]:
    """Open sessions ([start, end, events], by start) with one more event at `ts`:
    sessions whose gap is at most `gap` seconds merge."""
    merged: list[list[int]] = []
    for s in sorted([*sessions, [ts, ts, 1]]):
        if merged and s[0] - merged[-1][1] <= gap:
            last = merged[-1]
            last[1], last[2] = max(last[1], s[1]), last[2] + s[2]
        else:
            merged.append(list(s))
    return merged


class Sessions(StatefulProcessor):
    """Per user: the open sessions (value state, JSON), one event-time timer per open
    session at ``(end + gap)`` in ms; the timer emits the session and removes it."""

    def __init__(self, gap_seconds: int) -> None:
        self.gap = gap_seconds

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.open = handle.get_value_state("open")

    def _timer(self, session: list[int]) -> int:
        return (session[1] + self.gap) * 1000

    def handle_input_rows(self, key: Any, rows: Any, timer_values: TimerValues) -> Any:
        before: list[list[int]] = self.open.get() or []
        sessions = before
        for row in rows:
            sessions = merge(sessions, int(row["ts"]), self.gap)
        old, new = {self._timer(s) for s in before}, {self._timer(s) for s in sessions}
        for t in old - new:
            self.handle.delete_timer(t)
        for t in new - old:
            self.handle.register_timer(t)
        self.open.update(sessions)
        return None

    def handle_expired_timer(
        self, key: Any, timer_values: TimerValues, expired_timer_info: ExpiredTimerInfo
    ) -> Any:
        expiry = expired_timer_info.get_expiry_time_in_ms()
        sessions: list[list[int]] = self.open.get() or []
        closed = [s for s in sessions if self._timer(s) == expiry]
        left = [s for s in sessions if self._timer(s) != expiry]
        if left:
            self.open.update(left)
        else:
            self.open.clear()
        return [{"user": key, "start": s[0], "end": s[1], "events": s[2]} for s in closed]


def read_batch(spark: SparkSession, input_dir: Path, names: list[str]) -> DataFrame:
    """The rows of `names` with their event time in ms (no files: an empty batch)."""
    from pyspark.sql import functions as F

    if names:
        df = spark.read.schema(INPUT_SCHEMA).json([str(input_dir / n) for n in names])
    else:
        df = spark.createDataFrame([], INPUT_SCHEMA)
    return df.withColumn(EVENT_MS, F.col("ts") * 1000)


def describe(result: BatchResult, files: list[str]) -> str:
    what = f"{len(files)} file(s) {files[0]}..{files[-1]}" if files else "no input (timers)"
    wm = "none" if result.watermark_ms is None else str(result.watermark_ms // 1000)
    return (
        f"batch {result.checkpoint_id}: {what}, {result.rows_in} rows, {result.late_rows} "
        f"late, {result.timers_fired} sessions closed, watermark {wm}, uploaded "
        f"{common.human(result.bytes_uploaded)}, {result.duration:.2f} s, {result.checkpoint_uri}"
    )


def resume_point(job: StatefulJob) -> tuple[int, str | None]:
    """(next batch id, last file read) from the newest retained checkpoint."""
    latest = job.coordinator.latest()
    if latest is None:
        return 0, None
    last = latest[1].source_position.get("last_file")
    return latest[1].checkpoint_id + 1, last if isinstance(last, str) else None


def run(spark: SparkSession, job: StatefulJob, args: argparse.Namespace) -> int:
    input_dir: Path = args.input.absolute()
    sink = common.output_sink(args)
    processor = Sessions(args.gap_seconds)
    batch_id, last_file = resume_point(job)
    print(f"checkpoints: {job.job_dir}  (resuming at batch {batch_id}, after "
          f"{last_file or 'no file yet'})", flush=True)
    idle = False
    while not job.stop_requested:
        pending = common.next_batches(input_dir, last_file, args.files_per_batch)
        files = pending[0] if pending else []
        if not files and not job.timers_due():
            if not args.keep_running:
                break
            said, idle = (None if idle else common.waiting_line(input_dir)), True
            if not common.wait_for_input(job, args.poll_seconds, said):
                break
            continue
        idle = False
        last_file = files[-1] if files else last_file
        result = job.transform_with_state(
            read_batch(spark, input_dir, files),
            processor,
            OUTPUT_SCHEMA,
            key="user",
            time_mode="EventTime",
            event_time_column=EVENT_MS,
            watermark_delay=args.watermark_delay_seconds * 1000,
            batch_id=batch_id,
            sink=sink,
            source_position={"files": files, "last_file": last_file},
        )
        print(describe(result, files), flush=True)
        batch_id += 1
    stopped = common.stopped_line(job)
    if stopped is not None:
        print(stopped, flush=True)
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m statehold.examples.sessions",
        description="Sessions per user closed by event-time timers, checkpointed by statehold.",
    )
    common.add_options(p, "sessions")
    p.add_argument("--gap-seconds", type=int, default=1800)
    p.add_argument("--watermark-delay-seconds", type=int, default=600)
    args = p.parse_args(argv)
    if args.files_per_batch < 1 or args.gap_seconds < 0 or args.watermark_delay_seconds < 0:
        p.error("--files-per-batch must be at least 1; gap and delay must not be negative")
    return args


def main(argv: list[str] | None = None, on_phase: PhaseHook | None = None) -> int:
    args = parse_args(argv)
    return common.run_job(args, "statehold-sessions", lambda spark, job: run(spark, job, args),
                   on_phase=on_phase)


if __name__ == "__main__":
    sys.exit(main())
