"""Delete grouping keys from a transformWithState operator's state: a new location whose
batch N holds every record of every column family (value, list and map state, timers, TTL)
but those whose grouping key is one given, so a deleted key loses its state, its timers
and its TTL entries at once.

Each source partition's raw records (`tws_records`) are decoded only as far as their
grouping key (`tws_state.Family.key_decoder`), a batch at a time, compared with the keys
given as Arrow gives values (so a timestamp given as ISO text matches), and the kept
records written as their bytes by `repartition.rewrite`, routed by their grouping key as
a repartition does: DEST must be empty, the source is only read, ``commits/N`` is written
last and DEST is verified.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from statehold.progress import Progress
from statehold.spark_checkpoints.errors import SparkCheckpointError
from statehold.spark_checkpoints.layout import DEFAULT_STORE, StoreId
from statehold.spark_checkpoints.location import SparkCheckpoint
from statehold.spark_checkpoints.repartition import StoreChange, rewrite
from statehold.spark_checkpoints.spark_types import Struct
from statehold.spark_checkpoints.state_reader import arrow_batch, resolved
from statehold.spark_checkpoints.state_schema import StateSchema, struct_json
from statehold.spark_checkpoints.transform import DeleteReport, frozen_rows, key_set
from statehold.spark_checkpoints.tws_records import tws_records
from statehold.spark_checkpoints.tws_state import TwsOperator, family_id
from statehold.storage import Storage

#: Records whose grouping keys are compared at once.
_BATCH = 4096


def delete_grouping_keys(
    checkpoint: SparkCheckpoint,
    dest: str | Storage,
    tws: TwsOperator,
    *,
    keys: Iterable[Mapping[str, Any]],
    batch: int | None = None,
    progress: Progress | None = None,
    dest_options: Mapping[str, Any] | None = None,
) -> DeleteReport:
    """Every record of `tws`'s operator but those of the grouping keys `keys` (each a
    mapping of every grouping column's name to its value, as JSON gives it)."""
    grouping = tws.grouping
    wanted, given = key_set(keys, StateSchema(grouping, Struct(())))
    arrow = StateSchema(grouping, Struct(())).arrow()
    found = checkpoint.scan()
    counts = {"read": 0}
    seen: set[Any] = set()
    decoders = {fid: (f, f.key_decoder(f"operator {tws.operator} ({f.name})"))
                for fid, f in tws.by_id().items()}

    def kept(pending: list[tuple[bytes, bytes]], sid: StoreId
             ) -> Iterator[tuple[tuple[Any, ...], bytes, bytes]]:
        groups = []
        for key, _value in pending:
            entry = decoders.get(family_id(key))
            if entry is None:
                raise SparkCheckpointError(
                    f"{sid}: a key of column family {family_id(key)}, which is in no schema")
            family, decode = entry
            groups.append(family.grouping(decode(key)))
        rows = frozen_rows(arrow_batch(groups, arrow, sid), len(grouping.fields))
        for (key, value), row in zip(pending, rows, strict=True):
            if row in wanted:
                seen.add(row)
            else:
                yield (), key, value

    def records(sid: StoreId, at: int, _versioned: bool
                ) -> Iterator[tuple[tuple[Any, ...], bytes, bytes]]:
        _files, needs = resolved(checkpoint, found, sid, at)
        if not needs.ok:
            raise SparkCheckpointError(needs.problems[0])
        pending: list[tuple[bytes, bytes]] = []
        for record in tws_records(checkpoint, sid, needs, tws.delimiter,
                                  tws.list_prefixes):
            counts["read"] += 1
            pending.append(record)
            if len(pending) >= _BATCH:
                yield from kept(pending, sid)
                pending = []
        yield from kept(pending, sid)

    change = StoreChange(operator=tws.operator, store=DEFAULT_STORE, key=grouping,
                         records=records)
    done = rewrite(checkpoint, dest, batch=batch, progress=progress,
                   dest_options=dest_options, changes=[change])
    [plan] = [p for p in done.operators if p.operator == tws.operator]
    [written] = plan.stores
    return DeleteReport(
        source=checkpoint.uri, dest=done.dest, batch=done.batch, operator=tws.operator,
        name=plan.name, store=DEFAULT_STORE, partitions_before=done.partitions_before,
        partitions=done.partitions, rows_read=counts["read"], rows_written=written.rows,
        per_partition=written.per_partition, partitioning=written.partitioning,
        key_schema_changed=False, value_schema_changed=False,
        key_schema=struct_json(grouping), value_schema=struct_json(Struct(())),
        files=len(done.written), bytes=sum(done.written.values()), verified=True,
        keys_given=given, deleted=counts["read"] - written.rows,
        not_found=len(wanted - seen),
    )
