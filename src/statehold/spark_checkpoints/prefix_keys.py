"""RocksDB keys encoded for prefix scans: a session window's (Spark's prefix-scan key
encoder, used for a store whose operator metadata gives ``numColsPrefixKey`` > 0).

Such a key is two rows, not one: a 4-byte int in the JVM's native order (little-endian on
the platforms Spark runs on) giving the prefix part's length, the prefix part (Spark's state
encoding version byte, 0, and the UnsafeRow of the key's first ``numColsPrefixKey`` columns:
a session window's grouping columns), then the rest (the version byte and the UnsafeRow of
the other columns: the session start), whose length is what is left. Spark scans a group's
sessions by the prefix, so a key written back must keep this layout.

Spark 3.5 writes no operator metadata: there a RocksDB store ``default`` whose key ends in
``sessionStartTime`` is a session window's, its prefix every column but the last.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from statehold.spark_checkpoints.columnar_rows import flat_columns
from statehold.spark_checkpoints.errors import SparkCheckpointError
from statehold.spark_checkpoints.layout import DEFAULT_STORE, StoreId
from statehold.spark_checkpoints.location import SparkCheckpoint
from statehold.spark_checkpoints.scan import Scan
from statehold.spark_checkpoints.spark_types import Struct
from statehold.spark_checkpoints.unsafe_row import versioned_row_decoder
from statehold.spark_checkpoints.unsafe_row_writer import encode_row

_LENGTH = struct.Struct("<i")
#: The last key column of a session window's store (Spark 3.5: no metadata says so).
SESSION_START = "sessionStartTime"


@dataclass(frozen=True)
class PrefixKeys:
    """The prefix-scan layout of a store's keys of schema `key`, its first `count` columns
    the prefix."""

    key: Struct
    count: int

    @property
    def prefix(self) -> Struct:
        return Struct(self.key.fields[: self.count])

    @property
    def rest(self) -> Struct:
        return Struct(self.key.fields[self.count :])

    def split(self, data: bytes, where: str) -> tuple[bytes, bytes]:
        """A key's prefix part and rest, each its version byte then its UnsafeRow."""
        size = _LENGTH.unpack_from(data)[0] if len(data) >= 4 else -1
        if not 1 <= size <= len(data) - 5:
            raise SparkCheckpointError(
                f"{where}: a prefix-scan key of {len(data)} bytes whose prefix length "
                f"({size}) does not fit it")
        return data[4 : 4 + size], data[4 + size :]

    def decoder(self, where: str) -> Callable[[bytes], tuple[Any, ...]]:
        """A key's values, every column in the key schema's order."""
        head = versioned_row_decoder(self.prefix, f"{where} (its prefix)")
        tail = versioned_row_decoder(self.rest, where)

        def decode(data: bytes) -> tuple[Any, ...]:
            prefix, rest = self.split(data, where)
            return head(prefix) + tail(rest)

        return decode

    def encode(self, values: Sequence[Any], where: str) -> bytes:
        """A key's bytes from its values (as `unsafe_row.decode_row` gives them)."""
        prefix = b"\x00" + encode_row(tuple(values[: self.count]), self.prefix, where)
        rest = b"\x00" + encode_row(tuple(values[self.count :]), self.rest, where)
        return _LENGTH.pack(len(prefix)) + prefix + rest

    def prefixes(self, keys: list[bytes], where: str) -> list[bytes]:
        """Each key's prefix part (version byte and row): what a session window's shuffle
        hashes."""
        return [self.split(k, where)[0] for k in keys]

    def columns(self, keys: list[bytes], types: list[pa.DataType]) -> list[pa.Array] | None:
        """The keys' columns decoded many at once (`columnar_rows.flat_columns`); None
        where one must be decoded alone."""
        try:
            parts = [self.split(k, "") for k in keys]
        except SparkCheckpointError:
            return None
        head = flat_columns([p for p, _r in parts], self.prefix, types[: self.count], 1)
        tail = flat_columns([r for _p, r in parts], self.rest, types[self.count :], 1)
        return None if head is None or tail is None else [*head, *tail]


def prefix_keys(location: SparkCheckpoint, found: Scan, store: StoreId, key: Struct
                ) -> PrefixKeys | None:
    """The layout of a RocksDB store's keys of schema `key` where they are encoded for
    prefix scans; None where each is one row (HDFS-backed stores' always are)."""
    providers = {f.provider for s, f in found.stores.items()
                 if (s.operator, s.name) == (store.operator, store.name)}
    if providers != {"rocksdb"}:
        return None
    infos = location.operator_stores(found, store.operator)
    if infos:
        count = next((i.numColsPrefixKey for i in infos if i.storeName == store.name), 0)
    elif store.name == DEFAULT_STORE and key.fields and key.fields[-1].name == SESSION_START:
        count = len(key.fields) - 1
    else:
        count = 0
    if count <= 0:
        return None
    if count >= len(key.fields):
        raise SparkCheckpointError(
            f"{store}: {count} prefix columns of a key of {len(key.fields)} columns")
    return PrefixKeys(key, count)


__all__ = ["SESSION_START", "PrefixKeys", "prefix_keys"]
