"""One micro-batch: what is asked of it (`BatchRequest`), what it did (`BatchResult`),
and the figures summed from its tasks' reports (for the result, the checkpoint history
and the metrics)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from statehold.backend.keys import all_ranges
from statehold.errors import StateholdError
from statehold.format.metadata import KeyGroupState

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

    from statehold.format.metadata import EventTime, OperatorSchemas
    from statehold.processor.runner import ProcessorSpec
    from statehold.spark.api import InputFormat, Sink


@dataclass(frozen=True)
class BatchRequest:
    """One batch as `StatefulJob` was asked to run it: the input, the user's function (or
    stateful processor) and its output schema, how rows are keyed and ordered, and what
    the checkpoint records besides the state."""

    df: DataFrame
    #: a `KeyFunction`, a `BatchFunction` (`vectorized`) or a stateful processor
    function: Any
    output_schema: StructType
    keys: tuple[str, ...]
    order_by: tuple[str, ...] = ()
    input_format: InputFormat = "rows"
    vectorized: bool = False
    #: the batch's processing time (ms) for state TTLs (None: now)
    processing_time_ms: int | None = None
    #: the checkpoint id (None: the latest checkpoint + 1)
    batch_id: int | None = None
    sink: Sink | None = None
    source_position: Mapping[str, Any] = field(default_factory=dict)
    #: set for a stateful processor (`StatefulJob.transform_with_state`)
    processor: ProcessorSpec | None = None
    #: the event time to record, made from the tasks' figures
    event_time: Callable[[dict[str, Any]], EventTime] | None = None
    #: the state schemas to record (every operator's)
    schemas: dict[str, OperatorSchemas] | None = None


@dataclass(frozen=True)
class BatchResult:
    """What one micro-batch did. `output` is the batch's output DataFrame (materialised)
    unless the batch was skipped as an already completed replay."""

    checkpoint_id: int
    skipped: bool
    duration: float
    bytes_uploaded: int = 0
    files_uploaded: int = 0
    state_size: int = 0
    rows_in: int = 0
    keys: int = 0
    checkpoint_uri: str = ""
    output: DataFrame | None = None
    #: the tasks' snapshots (flush, RocksDB checkpoint, uploads), summed over tasks
    snapshot_seconds: float = 0.0
    #: the driver's part of the checkpoint: `_metadata` and the HA publish
    complete_seconds: float = 0.0
    #: files the snapshots kept from the previous checkpoint instead of uploading
    files_reused: int = 0
    bytes_reused: int = 0
    #: what the tasks downloaded to restore (not found in their local snapshots)
    bytes_downloaded: int = 0
    files_downloaded: int = 0
    #: tasks that opened a local snapshot compacted after the previous checkpoint, the
    #: compaction having run after that batch's tasks (off the commit path)
    compacted_restores: int = 0
    #: stateful processors: the watermark (ms) after this batch, its earliest pending
    #: timer (ms), late input rows (dropped or processed), timers fired, TTL'd entries
    #: the sweep deleted (those also with per-key functions)
    watermark_ms: int | None = None
    next_timer_ms: int | None = None
    late_rows: int = 0
    timers_fired: int = 0
    ttl_expired: int = 0


#: The figures only the tasks' reports carry, noted for the checkpoint history.
NOTED = ("rows", "keys", "snapshot_seconds", "bytes_downloaded", "files_downloaded")


def batch_figures(handles: list[KeyGroupState], acks: list[str]) -> dict[str, Any]:
    """A batch's figures summed over its tasks (handles: the snapshots' own counts;
    acks: what the tasks measured around them)."""
    reports = [json.loads(a) for a in acks]
    figures: dict[str, Any] = {
        name: sum(int(h.info.get(name, 0)) for h in handles)
        for name in ("bytes_uploaded", "files_uploaded", "state_size", "files_reused",
                     "bytes_reused")
    }
    for name in ("rows_in", "keys", "bytes_downloaded", "files_downloaded",
                 "compacted_restores", "late_rows", "timers_fired", "ttl_expired"):
        figures[name] = sum(int(r.get(name) or 0) for r in reports)
    events = [r["max_event_ms"] for r in reports if r.get("max_event_ms") is not None]
    figures["max_event_ms"] = max(events) if events else None
    timers = [r["next_timer_ms"] for r in reports if r.get("next_timer_ms") is not None]
    figures["next_timer_ms"] = min(timers) if timers else None
    figures["rows"] = figures["rows_in"]
    figures["snapshot_seconds"] = sum(float(r.get("snapshot_seconds", 0)) for r in reports)
    return figures


class TaskReportError(StateholdError, RuntimeError):
    """The tasks' acknowledgements do not cover the key groups exactly once."""


def check_acks(acks: list[str], parallelism: int, max_parallelism: int) -> list[KeyGroupState]:
    """One handle per task range, exactly the ranges of the current parallelism."""
    handles = [KeyGroupState.model_validate(json.loads(a)["state"]) for a in acks]
    got = sorted((h.key_groups.start, h.key_groups.end) for h in handles)
    want = [(r.start, r.end) for r in all_ranges(parallelism, max_parallelism)]
    if got != want:
        raise TaskReportError(
            f"tasks reported key-group ranges {got}, expected {want} (a task did not run "
            "or ran twice in the materialised result)"
        )
    return handles
