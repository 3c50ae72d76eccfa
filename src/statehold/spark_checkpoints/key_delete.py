"""Deleting keys offline, the operator's kind decided here: one store's by
`transform.delete_keys`; a transformWithState operator's grouping keys by
`tws_delete`; a stream-stream join's here, from the four stores that hold them together.

A join keeps each side's rows in two stores: ``<side>-keyToNumValues`` (the join key ->
how many rows of it are buffered, n) and ``<side>-keyWithIndexToValue`` (the join key and
an index 0..n-1 -> a row). A key given as the join key's columns is removed from both
stores of a side, its count and every indexed row, so no index is left without its count
and no count without its rows; from both sides by default, or one (``side``): a later row
of the key on the other side then finds none of that side's rows to match, as if they had
expired. Every other record is copied byte for byte (RocksDB's too: the keys of a join's
stores are single rows), routed where Spark's hash of its join key sends it; DEST is
written by `repartition.rewrite`, so all it promises holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from statehold.progress import Progress
from statehold.spark_checkpoints.errors import SparkCheckpointError
from statehold.spark_checkpoints.layout import StoreId
from statehold.spark_checkpoints.location import SparkCheckpoint
from statehold.spark_checkpoints.repartition import JOIN_STORES, Records, StoreChange, rewrite
from statehold.spark_checkpoints.scan import Scan
from statehold.spark_checkpoints.spark_types import Atomic
from statehold.spark_checkpoints.state_reader import row_decoders, store_records, store_schema
from statehold.spark_checkpoints.state_schema import StateSchema, read_state_schema_texts
from statehold.spark_checkpoints.transform import (
    DeleteReport,
    decoded_keys,
    freeze,
)
from statehold.spark_checkpoints.transform import (
    delete_keys as delete_store_keys,
)
from statehold.spark_checkpoints.tws_delete import delete_grouping_keys
from statehold.spark_checkpoints.tws_state import tws_operator
from statehold.storage import Storage

SIDES = ("left", "right")
_COUNTS, _VALUES = "keyToNumValues", "keyWithIndexToValue"


def delete_keys(
    checkpoint: SparkCheckpoint,
    dest: str | Storage,
    *,
    operator: int,
    keys: Iterable[Mapping[str, Any]],
    side: str | None = None,
    batch: int | None = None,
    progress: Progress | None = None,
    dest_options: Mapping[str, Any] | None = None,
) -> DeleteReport:
    """DEST (empty or absent) without `keys` in `operator`'s state: a join's from both
    sides, or `side` (``left``, ``right``) only; a transformWithState operator's grouping
    keys from every column family; any other operator's from its one store."""
    found = checkpoint.scan()
    names = {s.name for s in found.stores if s.operator == operator}
    if side is not None and side not in SIDES:
        raise SparkCheckpointError(f"side {side!r}: left or right; nothing written")
    tws = tws_operator(checkpoint, found, operator)
    if tws is not None:
        if side is not None:
            raise SparkCheckpointError(
                f"operator {operator} is transformWithState, not a stream-stream join: "
                "--side names a join's side; nothing written")
        return delete_grouping_keys(checkpoint, dest, tws, keys=keys, batch=batch,
                                    progress=progress, dest_options=dest_options)
    if names != JOIN_STORES:
        if side is not None:
            raise SparkCheckpointError(
                f"operator {operator} is not a stream-stream join (its stores: "
                f"{', '.join(sorted(names)) or 'none'}): a side is a join's; nothing written")
        return delete_store_keys(checkpoint, dest, operator=operator, keys=keys, batch=batch,
                                 progress=progress, dest_options=dest_options)
    return _delete_join_keys(checkpoint, found, dest, operator=operator, keys=keys,
                             sides=SIDES if side is None else (side,), side=side, batch=batch,
                             progress=progress, dest_options=dest_options)


def _delete_join_keys(
    checkpoint: SparkCheckpoint, found: Scan, dest: str | Storage, *, operator: int,
    keys: Iterable[Mapping[str, Any]], sides: tuple[str, ...], side: str | None,
    batch: int | None, progress: Progress | None, dest_options: Mapping[str, Any] | None,
) -> DeleteReport:
    schemas = {n: store_schema(checkpoint, found, StoreId(operator, 0, n)) for n in JOIN_STORES}
    counts = schemas[f"{sides[0]}-{_COUNTS}"]
    width = len(counts.key.fields)
    for s in sides:
        _check_join_keys(operator, s, counts, schemas[f"{s}-{_COUNTS}"],
                         schemas[f"{s}-{_VALUES}"])
    wanted, given = decoded_keys(keys, counts)
    held: set[Any] = set()
    read: dict[str, int] = {}
    removed: dict[str, int] = {}

    def records_of(name: str, schema: StateSchema) -> Records:
        read[name] = removed[name] = 0

        def records(sid: StoreId, at: int, _versioned: bool
                    ) -> Iterator[tuple[tuple[Any, ...], bytes, bytes]]:
            # (a partition without files is refused in one line when read)
            provider = found.stores[sid].provider if sid in found.stores else "hdfs"
            decode, _value = row_decoders(schema, sid, at + 1, provider)
            for key, value in store_records(checkpoint, found, sid, at):
                read[name] += 1
                join_key = freeze(decode(key)[:width])
                if join_key in wanted:
                    removed[name] += 1
                    if name.endswith(_COUNTS):
                        held.add(join_key)
                    continue
                yield (), key, value

        return records

    changes = [StoreChange(operator, name, schemas[name].key, records_of(name, schemas[name]))
               for s in sides for name in (f"{s}-{_COUNTS}", f"{s}-{_VALUES}")]
    done = rewrite(checkpoint, dest, batch=batch, progress=progress,
                   dest_options=dest_options, changes=changes)
    [plan] = [p for p in done.operators if p.operator == operator]
    written = [p for p in plan.stores if p.store in read]
    schema_file = found.stores[StoreId(operator, 0, f"{sides[0]}-{_COUNTS}")].schema
    assert schema_file is not None  # store_schema read it
    key_text, value_text = read_state_schema_texts(checkpoint.read(schema_file.key),
                                                   schema_file.key)
    return DeleteReport(
        source=checkpoint.uri, dest=done.dest, batch=done.batch, operator=operator,
        name=plan.name, store=", ".join(p.store for p in written),
        partitions_before=done.partitions_before, partitions=done.partitions,
        rows_read=sum(read.values()), rows_written=sum(p.rows for p in written),
        per_partition=[sum(c) for c in zip(*(p.per_partition for p in written), strict=True)],
        partitioning=written[0].partitioning, key_schema_changed=False,
        value_schema_changed=False, key_schema=key_text, value_schema=value_text,
        files=len(done.written), bytes=sum(done.written.values()), verified=True,
        keys_given=given, deleted=len(held), not_found=len(wanted - held), removed=removed,
        side=side,
    )


def _check_join_keys(operator: int, side: str, given: StateSchema, counts: StateSchema,
                     values: StateSchema) -> None:
    """A side's stores are keyed by the join key the keys are given in (the values' store
    with its index after it)."""
    types = [f.type for f in given.key.fields]
    value_key = values.key.fields
    if ([f.type for f in counts.key.fields] != types
            or [f.type for f in value_key[:-1]] != types
            or not value_key or value_key[-1].name != "index"
            or value_key[-1].type != Atomic("long")):
        raise SparkCheckpointError(
            f"operator {operator}: the {side} side's stores are not keyed by the join key "
            f"({', '.join(f.name for f in given.key.fields)}); nothing written")


__all__ = ["SIDES", "delete_keys"]
