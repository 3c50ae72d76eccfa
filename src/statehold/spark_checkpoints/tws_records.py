"""A transformWithState store version's raw records: its typed changelogs after the base
snapshot replayed over the snapshot's RocksDB, as `state_reader` does for the other
stores, with the typed changelog's two more kinds of change: a merge appends a value to
the key's (a list state's element: RocksDB's string-append merge, the values joined by
the merge operator's delimiter), and a range delete drops every key from its first key up
to (not including) its end key.

A list state's value read from the snapshot is joined again with Spark's delimiter
(`list_elements`): RocksDB, opened here with the snapshot's OPTIONS file, merges the
operands the SSTs still hold with its string-append operator's default ``,`` whatever
delimiter Spark's RocksDB used (none, under merge operator version 2), and a value
written on with the wrong one would be misread by Spark after a restart.

The changes are held in a dict (memory: the changes since the base snapshot, which
Spark's maintenance keeps few). Records come in key order, as the snapshot's RocksDB
iterates them, so a writer can put them straight into an SST.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

from statehold.spark_checkpoints.layout import StoreId
from statehold.spark_checkpoints.location import SparkCheckpoint
from statehold.spark_checkpoints.state_reader import file_blocks, file_records
from statehold.spark_checkpoints.state_records import (
    TypedOp,
    list_elements,
    typed_changelog_records,
)
from statehold.spark_checkpoints.stores import Needs

#: What a change holds: a whole value (put), nothing (delete), or what to append (merge).
_Change = tuple[TypedOp, bytes | None]


def tws_records(location: SparkCheckpoint, store: StoreId, needs: Needs, delimiter: int,
                lists: frozenset[bytes] = frozenset()) -> Iterator[tuple[bytes, bytes]]:
    """Each (key, value) of the version `needs` resolves, in key order. `lists`: the key
    prefixes (family ids) of list state, whose values are joined with `delimiter` bytes
    of ``,`` (Spark's merge operator's)."""
    joint = b"," * delimiter
    steps = [k for k in needs.files if k.endswith(".changelog")]
    bases = [k for k in needs.files if k.endswith(".zip")]
    changes: dict[bytes, _Change] = {}
    ranges: list[tuple[bytes, bytes]] = []
    with tempfile.TemporaryDirectory(prefix="statehold-tws-") as tmp:
        for key in steps:
            blocks = file_blocks(location, key, Path(tmp))
            for op, k, v in typed_changelog_records(blocks, key):
                if op is TypedOp.DELETE_RANGE:
                    assert v is not None
                    for gone in [c for c in changes if k <= c < v]:
                        del changes[gone]
                    ranges.append((k, v))
                elif op is TypedOp.MERGE:
                    assert v is not None
                    old = changes.get(k)
                    if old is None or old[0] is TypedOp.MERGE:
                        suffix = v if old is None else old[1] + joint + v  # type: ignore[operator]
                        changes[k] = (TypedOp.MERGE, suffix)
                    elif old[0] is TypedOp.PUT:
                        changes[k] = (TypedOp.PUT, old[1] + joint + v)  # type: ignore[operator]
                    else:  # after a delete: the appended value alone
                        changes[k] = (TypedOp.PUT, v)
                else:
                    changes[k] = (op, v)
        survivors = sorted(changes)
        at = 0
        for base in bases:
            for k, value in file_records(location, base, store, Path(tmp), column_families=True):
                if value is not None and k[:2] in lists:
                    value = joint.join(list_elements(value, f"{base} (a list value)"))
                while at < len(survivors) and survivors[at] < k:
                    out = _alone(survivors[at], changes[survivors[at]], ranges)
                    if out is not None:
                        yield out
                    at += 1
                change = changes.get(k)
                if change is None:
                    if value is not None and not _in(k, ranges):
                        yield k, value
                    continue
                if at < len(survivors) and survivors[at] == k:
                    at += 1
                op, v = change
                if op is TypedOp.PUT and v is not None:
                    yield k, v
                elif op is TypedOp.MERGE and v is not None:
                    yield k, (v if _in(k, ranges) or value is None else value + joint + v)
        for k in survivors[at:]:
            out = _alone(k, changes[k], ranges)
            if out is not None:
                yield out


def _alone(key: bytes, change: _Change, ranges: list[tuple[bytes, bytes]]
           ) -> tuple[bytes, bytes] | None:
    """A changed key the snapshot does not hold."""
    op, value = change
    if op in (TypedOp.PUT, TypedOp.MERGE) and value is not None:
        return key, value
    return None


def _in(key: bytes, ranges: list[tuple[bytes, bytes]]) -> bool:
    return any(first <= key < end for first, end in ranges)

