"""Per batch of a Spark checkpoint location: when it ran, its watermark, what each source
read up to, and the state each operator held after it (the bytes and files a restart
after it reads)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Literal

from pydantic import BaseModel

from statehold.format import results as shared
from statehold.spark_checkpoints.errors import SparkCheckpointError
from statehold.spark_checkpoints.location import SparkCheckpoint


class OperatorState(BaseModel):
    operator: int
    #: Bytes and files of the operator's stores at the version the batch wrote (what a
    #: restart after the batch reads), over every partition and store.
    bytes: int
    files: int


class BatchRecord(BaseModel):
    batch: int
    committed: bool
    timestamp_ms: int | None = None
    watermark_ms: int | None = None
    #: Each source's end offset for the batch (None: no data yet).
    offsets: list[Any] = []
    #: None where the batch's state is no longer held in full.
    operators: list[OperatorState] | None = None
    problem: str | None = None


class SparkHistory(shared.History):
    location_kind: Literal["spark"] = "spark"
    uri: str
    records: list[BatchRecord]


def history(checkpoint: SparkCheckpoint, limit: int | None = None) -> SparkHistory:
    """The batches in the offsets log, oldest first (the newest `limit` of them)."""
    found = checkpoint.scan()
    ids = sorted(set(found.offsets) | set(found.commits))
    records = []
    for batch in ids[-limit:] if limit else ids:
        record = BatchRecord(batch=batch, committed=batch in found.commits)
        try:
            offsets = checkpoint.offsets(batch)
            record.timestamp_ms = offsets.metadata.batchTimestampMs
            record.watermark_ms = offsets.metadata.batchWatermarkMs
            record.offsets = offsets.sources
        except SparkCheckpointError as e:
            record.problem = str(e)
        if record.committed:
            needs = checkpoint.restart_needs(found, batch)
            sizes: dict[int, list[int]] = defaultdict(lambda: [0, 0])
            for store in needs.stores:
                for key in store.files:
                    if key in found.files:
                        sizes[store.store.operator][0] += found.files[key].size
                        sizes[store.store.operator][1] += 1
            if needs.stores and all(s.ok for s in needs.stores):
                record.operators = [
                    OperatorState(operator=op, bytes=b, files=f)
                    for op, (b, f) in sorted(sizes.items())
                ]
            record.problem = record.problem or next(
                (p for s in needs.stores for p in s.problems), None
            )
        records.append(record)
    return SparkHistory(uri=checkpoint.uri, records=records)
