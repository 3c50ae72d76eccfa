"""One transformWithState state variable through a transform's function: the records
`transform` writes for its operator's store, every column family's.

Each source partition's raw records (`tws_records`) come in key order, so a variable's
(its family's id first) come together: they are decoded as ``read_state(state_var=NAME)``
gives them (`Family.rows_decoder`: the grouping key's columns, a map state's user key,
then the value's; a list state's one row per element, a key's elements in one batch),
handed to ``fn`` a batch at a time, and the rows it returns written back in the family's
layout: the key by its encoder (no prefix: the version byte and the key's UnsafeRow;
prefix scan: the prefix row's length, the prefix row, the rest), the value as the version
byte and its UnsafeRow; a list's elements, the rows ``fn`` returns for one key in one
call, each a 4-byte little-endian size and its bytes, joined by the merge operator's
delimiter as Spark reads them (`tws_records`). A list's row counter (``$rowCounter_NAME``,
its element count: Spark's metrics) is written again from the elements kept. Every other
family's records (the other variables, timers) are passed on as they are, so a grouping
key whose rows all vanish from the variable keeps its other state. `repartition.rewrite`
routes each record by its grouping key.

Refused in one line, before anything is written: Spark's own families (timers, TTL,
counters: they follow a variable, not a caller), and a variable with a TTL, whose TTL
index (``$ttl_NAME``, and a list's ``$min_`` / ``$count_``) names its rows' expiries and
would keep entries for rows changed or deleted (`delete_keys` removes a grouping key from
every family at once).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

from statehold.spark_checkpoints.arrow_values import (
    TransformFn,
    empty_batch,
    returned,
    row_columns,
    to_values,
)
from statehold.spark_checkpoints.errors import SparkCheckpointError
from statehold.spark_checkpoints.layout import StoreId
from statehold.spark_checkpoints.location import SparkCheckpoint
from statehold.spark_checkpoints.scan import Scan
from statehold.spark_checkpoints.spark_types import Struct
from statehold.spark_checkpoints.state_reader import arrow_batch, resolved
from statehold.spark_checkpoints.tws_records import tws_records
from statehold.spark_checkpoints.tws_state import (
    Family,
    TwsOperator,
    family_prefix,
    partition_ids,
)
from statehold.spark_checkpoints.unsafe_row_writer import encode_row

#: Rows of the variable handed to ``fn`` at once (a list's elements of one key together).
BATCH_ROWS = 4096
_SIZE = struct.Struct("<i")
_VERSION = b"\x00"


def variable_family(tws: TwsOperator, name: str) -> Family:
    """The family of the state variable `name`, refused in one line where a transform
    cannot rewrite it alone."""
    where = f"operator {tws.operator} state variable {name!r}"
    if name.startswith("$"):
        raise SparkCheckpointError(
            f"{where} is Spark's own column family (timers, TTL, counters), copied as it "
            f"is: name a state variable ({', '.join(user_variables(tws))}); nothing written")
    family = tws.family(name)
    ttl = [f for f in (f"$ttl_{name}", f"$min_{name}", f"$count_{name}") if f in tws.families]
    if ttl:
        raise SparkCheckpointError(
            f"{where} has a TTL: its TTL index ({', '.join(ttl)}) names its rows' "
            "expiries, which a transform would leave behind; a TTL'd variable is not "
            "transformed (delete_keys removes grouping keys); nothing written")
    if family.encoder not in ("none", "prefix"):
        raise SparkCheckpointError(f"{where}: a {family.encoder}-scan key is not written")
    return family


def user_variables(tws: TwsOperator) -> list[str]:
    """The operator's state variables a caller made (not Spark's own families)."""
    return [n for n in tws.variables or sorted(tws.families) if not n.startswith("$")]


class VariableRows:
    """A state variable's records through ``fn``, every other family's as they are."""

    def __init__(self, checkpoint: SparkCheckpoint, found: Scan, tws: TwsOperator, name: str,
                 fn: TransformFn) -> None:
        self.checkpoint, self.found, self.tws, self.name, self.fn = (
            checkpoint, found, tws, name, fn)
        self.family = variable_family(tws, name)
        self.arrow = self.family.schema().arrow()
        self.width = len(self.family.key.fields)
        self.key_values = [to_values(f.type) for f in self.family.key.fields]
        self.value_values = [to_values(f.type) for f in self.family.value.fields]
        self.counter = _counter(tws, self.family, name)
        self.read = self.written = 0

    def probe(self) -> None:
        """`fn` of no rows, checked before anything is written: the columns and types it
        returns (checked again for every batch)."""
        list(returned(self.fn(empty_batch(self.arrow)), self.arrow))

    def records(self, sid: StoreId, batch: int, _versioned: bool
                ) -> Iterator[tuple[tuple[Any, ...], bytes, bytes]]:
        """A source partition's records as `repartition.Records` gives them: the
        variable's through ``fn``, the others' as their bytes."""
        _files, needs = resolved(self.checkpoint, self.found, sid, batch)
        if not needs.ok:
            raise SparkCheckpointError(needs.problems[0])
        ids = partition_ids(self.checkpoint, self.found, self.tws, sid, batch)
        fid = ids.get(self.name)
        # (a family the partition never created: no rows for fn, every record as it is)
        prefix = family_prefix(fid) if fid is not None else None
        counter = (family_prefix(ids[self.counter.name]) if prefix is not None
                   and self.counter is not None and self.counter.name in ids else None)
        decode = self.family.rows_decoder(f"{sid} ({self.name})")
        pending: list[tuple[Any, ...]] = []
        for key, value in tws_records(self.checkpoint, sid, needs, self.tws.delimiter,
                                      self.tws.list_prefixes):
            if prefix is not None and key.startswith(prefix):
                pending += decode(key, value)
                if len(pending) >= BATCH_ROWS:
                    yield from self.rewritten(pending, sid, prefix, counter)
                    pending = []
            elif counter is None or not key.startswith(counter):  # a counter: written anew
                yield (), key, value
        if prefix is not None:
            yield from self.rewritten(pending, sid, prefix, counter)

    def rewritten(self, rows: list[tuple[Any, ...]], sid: StoreId, prefix: bytes,
                  counter: bytes | None) -> Iterator[tuple[tuple[Any, ...], bytes, bytes]]:
        """`rows` through ``fn``, the rows it returns as records of the family (`prefix`:
        its id in this partition) and, for a list, of its row counter (`counter`)."""
        if not rows:
            return
        self.read += len(rows)
        where = f"{sid} ({self.name})"
        elements: dict[bytes, list[bytes]] = {}
        for out in returned(self.fn(arrow_batch(rows, self.arrow, sid)), self.arrow):
            keys = row_columns(out, 0, self.width, self.key_values)
            values = row_columns(out, self.width, out.num_columns, self.value_values)
            for key, value in zip(keys, values, strict=True):
                raw_key = prefix + self._key(key, where)
                raw_value = _VERSION + encode_row(value, self.family.value, f"{where}: a value")
                self.written += 1
                if self.family.multiple:
                    elements.setdefault(raw_key, []).append(_SIZE.pack(len(raw_value))
                                                            + raw_value)
                else:
                    yield (), raw_key, raw_value
        joint = b"," * self.tws.delimiter
        for raw_key, listed in elements.items():
            yield (), raw_key, joint.join(listed)
            if counter is not None and self.counter is not None:
                count = _VERSION + encode_row((len(listed),), self.counter.value,
                                              f"{where}: a count")
                yield (), counter + raw_key[2:], count

    def _key(self, key: tuple[Any, ...], where: str) -> bytes:
        """A key's bytes after its family id, as the family's encoder lays them out."""
        family = self.family
        if family.encoder == "none":
            return _VERSION + encode_row(key, family.key, f"{where}: a key")
        fields = family.key.fields
        head = _VERSION + encode_row(key[:family.prefix], Struct(fields[:family.prefix]),
                                     f"{where}: a key")
        tail = (_VERSION + encode_row(key[family.prefix:], Struct(fields[family.prefix:]),
                                      f"{where}: a key")
                if len(fields) > family.prefix else b"")
        return _SIZE.pack(len(head)) + head + tail


def _counter(tws: TwsOperator, family: Family, name: str) -> Family | None:
    """A list state's row counter family (its key the list's, its value one count), if
    the operator has one."""
    counter = tws.families.get(f"$rowCounter_{name}")
    if not family.multiple or counter is None:
        return None
    if (counter.encoder, counter.key) != ("none", family.key) or len(counter.value.fields) != 1:
        raise SparkCheckpointError(
            f"operator {tws.operator}: {counter.name} is not keyed as {name} with one count; "
            "nothing written")
    return counter


__all__ = ["VariableRows", "user_variables", "variable_family"]
