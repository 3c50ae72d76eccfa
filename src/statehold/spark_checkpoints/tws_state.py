"""transformWithState's state, read offline: one RocksDB per partition holding every
state variable in a virtual column family of its own.

What says how to read it: the operator's state schema v3 (``state/OP/_stateSchema/
STORE/N_ID``: each family's key and value schemas and key encoder spec), its metadata v2
(``state/OP/_metadata/v2/N``: the state variables and their types) and a snapshot zip's
metadata (``columnFamilyMapping``: each family's id).

Layout (UnsafeRow encoding). Every RocksDB key starts with its family's id, a 2-byte
short in the machine's order (little-endian); then, by the family's encoder spec:

* no prefix (value and list state): the state encoding version byte (0) and the key's
  UnsafeRow;
* prefix scan (map state, timers' ``keyToTimestamp``): a 4-byte little-endian length,
  that many bytes (version byte, UnsafeRow of the first `prefix` fields), then the version
  byte and the UnsafeRow of the other fields;
* range scan (timers' ``timestampToKey``, TTL): the same with the ordering fields' row
  first, each ordering field in it a binary of a marker byte (0 negative, 1 positive, 2
  null) and the value big-endian (a negative float's or double's bits flipped), so that
  RocksDB's byte order is the fields' order.

A value is the version byte and the value's UnsafeRow; a list state's several values are
each a 4-byte little-endian size and that many bytes (version byte, row), separated by one
delimiter byte under RocksDB merge operator version 1 and none under version 2.

Each record's grouping key (what ``groupBy`` gave, which Spark's hash partitions by) is a
no-prefix family's whole key; in any other family a struct field of its key not ordered by
(map state's and the timers' ``key``, a TTL family's ``elementKey``), or a struct inside
one (a map state TTL's ``elementKey.key``): `Family.located`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa

from statehold.format.signed import load_json
from statehold.spark_checkpoints.errors import SparkCheckpointError
from statehold.spark_checkpoints.layout import DEFAULT_STORE, StoreId, is_decimal
from statehold.spark_checkpoints.location import SparkCheckpoint
from statehold.spark_checkpoints.scan import Scan
from statehold.spark_checkpoints.spark_hash import partition_of
from statehold.spark_checkpoints.spark_types import Atomic, Field, SparkType, Struct
from statehold.spark_checkpoints.state_records import list_elements
from statehold.spark_checkpoints.state_schema import (
    StateSchema,
    read_state_schema_v3,
    schema_json,
    struct_text,
)
from statehold.spark_checkpoints.unsafe_row import versioned_row_decoder

_LENGTH = struct.Struct("<i")
_ID = struct.Struct("<h")
#: A range-scan ordering field's big-endian layout after its marker byte.
_RANGE = {"byte": struct.Struct(">b"), "short": struct.Struct(">h"),
          "integer": struct.Struct(">i"), "long": struct.Struct(">q"),
          "float": struct.Struct(">f"), "double": struct.Struct(">d")}
_FLIP = {"float": (struct.Struct(">I"), 0xFFFFFFFF), "double": (struct.Struct(">Q"), (1 << 64) - 1)}
_NEGATIVE, _POSITIVE, _NULL = 0, 1, 2
_MERGE_CONF = "spark.sql.streaming.stateStore.rocksdb.mergeOperatorVersion"
_REFUSED_CONF = {"spark.sql.streaming.stateStore.encodingFormat": "unsaferow",
                 "spark.sql.streaming.stateStore.rowChecksum.enabled": "false"}

Decode = Callable[[bytes], tuple[Any, ...]]


@dataclass(frozen=True)
class Family:
    """One column family: its schemas and how its keys are laid out."""

    name: str
    key: Struct
    value: Struct
    #: "none", "prefix" or "range" (the key encoder spec).
    encoder: str
    prefix: int = 0
    ordering: tuple[int, ...] = ()
    #: A list state's: several values in one RocksDB value.
    multiple: bool = False

    #: Where the grouping key is in the decoded key: () the whole key, (i,) the struct
    #: field i, (i, j) field j of the struct field i (set by `tws_operator`).
    path: tuple[int, ...] = ()
    #: The grouping key's columns.
    grouping_fields: tuple[Field, ...] = ()

    @property
    def grouping_types(self) -> list[SparkType]:
        return [f.type for f in self.grouping_fields]

    def grouping(self, key: tuple[Any, ...]) -> tuple[Any, ...]:
        """The grouping key's column values of a decoded key."""
        value: Any = key
        for i in self.path:
            value = value[i] if value is not None else None
        return tuple(value) if value is not None else (None,) * len(self.grouping_fields)

    def located(self, grouping: tuple[Field, ...], where: str) -> Family:
        """This family with where its key holds `grouping` (the operator's grouping key's
        columns): its whole key, or a struct of them in a field not ordered by, or in
        such a struct's field (a map state's TTL: ``elementKey.key``)."""
        fields = self.key.fields
        if self.encoder == "none" or fields == grouping:
            if fields != grouping:
                raise SparkCheckpointError(f"{where}: a key that is not the grouping key")
            return replace(self, path=(), grouping_fields=grouping)
        for i, f in enumerate(fields):
            if i in self.ordering or not isinstance(f.type, Struct):
                continue
            if f.type.fields == grouping:
                return replace(self, path=(i,), grouping_fields=grouping)
            for j, inner in enumerate(f.type.fields):
                if isinstance(inner.type, Struct) and inner.type.fields == grouping:
                    return replace(self, path=(i, j), grouping_fields=grouping)
        raise SparkCheckpointError(f"{where}: no grouping key in the key")

    def key_decoder(self, where: str) -> Decode:
        """The decoder of a RocksDB key of this family (its id first) into the key schema's
        field values, in the schema's order."""
        if self.encoder == "none":
            whole = versioned_row_decoder(self.key, f"{where} (a key)")
            return lambda raw: whole(raw[2:])
        fields = self.key.fields
        first = list(range(self.prefix)) if self.encoder == "prefix" else list(self.ordering)
        rest = [i for i in range(len(fields)) if i not in first]
        if self.encoder == "prefix":
            head = versioned_row_decoder(Struct(tuple(fields[i] for i in first)),
                                         f"{where} (a key prefix)")
        else:
            head = _range_decoder([fields[i] for i in first], f"{where} (a range key)")
        tail = (versioned_row_decoder(Struct(tuple(fields[i] for i in rest)), f"{where} (a key)")
                if rest else None)

        def decode(raw: bytes) -> tuple[Any, ...]:
            if len(raw) < 6:
                raise SparkCheckpointError(f"{where}: a key of {len(raw)} bytes")
            (size,) = _LENGTH.unpack_from(raw, 2)
            if not 0 < size <= len(raw) - 6:
                raise SparkCheckpointError(f"{where}: a key's prefix of {size} bytes")
            values: list[Any] = [None] * len(fields)
            for i, v in zip(first, head(raw[6 : 6 + size]), strict=True):
                values[i] = v
            if tail is not None:
                for i, v in zip(rest, tail(raw[6 + size :]), strict=True):
                    values[i] = v
            elif len(raw) != 6 + size:
                raise SparkCheckpointError(f"{where}: bytes after a key")
            return tuple(values)

        return decode

    def values_decoder(self, where: str
                       ) -> Callable[[bytes], list[tuple[Any, ...]]]:
        """The decoder of a RocksDB value into its rows: one, or a list state's each (read
        with or without a ``,`` between them: `state_records.list_elements`)."""
        one = versioned_row_decoder(self.value, f"{where} (a value)")
        if not self.multiple:
            return lambda raw: [one(raw)]

        def many(raw: bytes) -> list[tuple[Any, ...]]:
            return [one(element[4:]) for element in list_elements(raw, where)]

        return many

    def rows_decoder(self, where: str) -> Callable[[bytes, bytes], list[tuple[Any, ...]]]:
        """The decoder of a record (RocksDB key and value) into its rows as
        `read_variable` gives them: the key's fields, then the value's (a list state's one
        row per element)."""
        decode_key = self.key_decoder(where)
        decode_values = self.values_decoder(where)
        width = len(self.schema().value.fields)

        def rows(raw_key: bytes, raw_value: bytes) -> list[tuple[Any, ...]]:
            key = decode_key(raw_key)
            return [key + value[:width] for value in decode_values(raw_value)]

        return rows

    def schema(self) -> StateSchema:
        """The rows' columns: the key's, then the value's (none where the value is only a
        placeholder, as a timer's is)."""
        value = self.value
        if all(isinstance(f.type, Atomic) and f.type.name == "void" for f in value.fields):
            value = Struct(())
        return StateSchema(self.key, value)


@dataclass(frozen=True)
class TwsOperator:
    """A transformWithState operator's store: its families and their ids."""

    operator: int
    store: str
    families: dict[str, Family]
    #: Each family's id (the snapshot's ``columnFamilyMapping``).
    ids: dict[str, int]
    #: The state variables the operator metadata names, in its order.
    variables: list[str]
    #: Bytes between a list state's values (the merge operator's delimiter).
    delimiter: int
    #: The ``_stateSchema`` file read.
    schema_key: str
    #: The snapshot zip metadata's column family fields (``columnFamilyMapping``,
    #: ``columnFamilyTypeMap``, ``maxColumnFamilyId``) the ids came from.
    zip_fields: dict[str, Any]

    @property
    def grouping(self) -> Struct:
        """The grouping key's columns (every family's agree)."""
        return Struct(next(iter(self.families.values())).grouping_fields)

    @property
    def internal_ids(self) -> set[int]:
        """The ids of Spark's internal families (timers, TTL), which a snapshot counts
        apart from the others (``numInternalKeys``)."""
        types = self.zip_fields.get("columnFamilyTypeMap") or {}
        return {i for name, i in self.ids.items() if types.get(name) is True}

    def family(self, name: str) -> Family:
        """The family of a state variable (or of any family, by its own name)."""
        if name not in self.families:
            raise SparkCheckpointError(
                f"operator {self.operator} has no state variable {name!r} (it has: "
                f"{', '.join(self.variables or sorted(self.families))})")
        return self.families[name]

    @property
    def list_prefixes(self) -> frozenset[bytes]:
        """The key prefixes of the list state families (`tws_records`'s `lists`)."""
        return frozenset(family_prefix(self.ids[n]) for n, f in self.families.items()
                         if f.multiple and n in self.ids)

    def by_id(self) -> dict[int, Family]:
        return {self.ids[n]: f for n, f in self.families.items() if n in self.ids}


def schema_file(found: Scan, operator: int, store: str = DEFAULT_STORE) -> str | None:
    """The operator's newest state schema v3 file (``_stateSchema/STORE/N_ID``), if any."""
    prefix = f"state/{operator}/_stateSchema/{store}/"
    named = [(k, k[len(prefix):].split("_", 1)[0]) for k in found.operator_files
             if k.startswith(prefix) and "/" not in k[len(prefix):]
             and not k.rsplit("/", 1)[1].startswith(".")]
    numbered = [(int(n), k) for k, n in named if is_decimal(n)]
    return max(numbered)[1] if numbered else None


def tws_operator(location: SparkCheckpoint, found: Scan, operator: int,
                 store: str = DEFAULT_STORE) -> TwsOperator | None:
    """The operator's transformWithState layout; None when it is not transformWithState's
    (no state schema v3). Refused in one line where it cannot be read."""
    key = schema_file(found, operator, store)
    if key is None:
        return None
    data = location.read(key)
    if not data.startswith(b"\x00\x02v3"):  # another operator's schema file: not tWS
        return None
    conf = location.conf(found)
    for name, wanted in _REFUSED_CONF.items():
        if conf.get(name, wanted).lower() != wanted:
            raise SparkCheckpointError(
                f"operator {operator}: {name} is {conf[name]}; only {wanted} is read")
    delimiter = 1 if conf.get(_MERGE_CONF, "1") == "1" else 0
    variables, kinds = _variables(location, found, operator)
    families = {}
    for name, key_text, value_text, spec_text in read_state_schema_v3(data, key):
        families[name] = _family(name, key_text, value_text, spec_text,
                                 kinds.get(name) == "ListState", f"{key} ({name})")
    if not families:
        raise SparkCheckpointError(f"{key}: no column families")
    grouping = _grouping(families, key)
    families = {n: f.located(grouping, f"{key} ({n})") for n, f in families.items()}
    zip_fields = zip_family_fields(location, found, operator, store)
    return TwsOperator(operator, store, families, zip_fields["columnFamilyMapping"], variables,
                       delimiter, key, zip_fields)


def _family(name: str, key_text: str, value_text: str, spec_text: str, multiple: bool,
            where: str) -> Family:
    key = struct_text(key_text, where)
    value = struct_text(value_text, where)
    spec = schema_json(spec_text, where)
    kind = spec.get("keyStateEncoderType") if isinstance(spec, dict) else None
    if kind == "NoPrefixKeyStateEncoderSpec":
        family = Family(name, key, value, "none", multiple=multiple)
    elif kind == "PrefixKeyScanStateEncoderSpec":
        n = spec.get("numColsPrefixKey")
        if not isinstance(n, int) or not 0 < n < len(key.fields):
            raise SparkCheckpointError(f"{where}: a prefix of {n!r} key columns")
        family = Family(name, key, value, "prefix", prefix=n, multiple=multiple)
    elif kind == "RangeKeyScanStateEncoderSpec":
        ordering = spec.get("orderingOrdinals")
        if (not isinstance(ordering, list) or not ordering
                or not all(isinstance(i, int) and 0 <= i < len(key.fields) for i in ordering)):
            raise SparkCheckpointError(f"{where}: ordering ordinals {ordering!r}")
        for i in ordering:
            t = key.fields[i].type
            if not (isinstance(t, Atomic) and t.name in _RANGE):
                raise SparkCheckpointError(f"{where}: a range key ordered by a {t} field")
        family = Family(name, key, value, "range", ordering=tuple(ordering), multiple=multiple)
    else:
        raise SparkCheckpointError(f"{where}: key encoder {str(kind)[:60]!r} is not read")
    return family


def _grouping(families: dict[str, Family], where: str) -> tuple[Field, ...]:
    """The operator's grouping key's columns: a no-prefix family's whole key (value and
    list state, their counters), else a prefix family's first field (map state, timers)."""
    for family in families.values():
        if family.encoder == "none":
            return family.key.fields
    for family in families.values():
        first = family.key.fields[0].type
        if family.encoder == "prefix" and isinstance(first, Struct):
            return first.fields
    raise SparkCheckpointError(f"{where}: no column family says the grouping key")


def _variables(location: SparkCheckpoint, found: Scan, operator: int
               ) -> tuple[list[str], dict[str, str]]:
    """The state variables of the operator's newest metadata v2, and each one's type."""
    prefix = f"state/{operator}/_metadata/v2/"
    numbered = [(int(k[len(prefix):]), k) for k in found.operator_files
                if k.startswith(prefix) and is_decimal(k[len(prefix):])]
    if not numbered:
        return [], {}
    key = max(numbered)[1]
    body = location.read(key).partition(b"\n")[2]
    doc = load_json(body, where=key, error=SparkCheckpointError)
    props = doc.get("operatorPropertiesJson") if isinstance(doc, dict) else None
    listed = schema_json(props, key).get("stateVariables", []) if isinstance(props, str) else []
    out: dict[str, str] = {}
    for var in listed if isinstance(listed, list) else []:
        if isinstance(var, dict) and isinstance(var.get("stateName"), str):
            out[var["stateName"]] = str(var.get("stateVariableType"))
    return list(out), out


def zip_family_fields(location: SparkCheckpoint, found: Scan, operator: int, store: str,
                      keys: list[str] | None = None) -> dict[str, Any]:
    """The column family fields of the newest snapshot zip among `keys` (default: any of
    the operator's partitions', each of which registers the same families in the same
    order): ``columnFamilyMapping`` (name -> id), ``columnFamilyTypeMap`` (name ->
    internal?), ``maxColumnFamilyId``."""
    from statehold.spark_checkpoints.state_files import read_zip_metadata

    if keys is None:
        keys = [k for k, n in found.names.items() if n.store is not None
                and (n.store.operator, n.store.name) == (operator, store) and k.endswith(".zip")]
    ordered = sorted(((found.names[k].version or 0, k) for k in keys if k in found.names),
                     reverse=True)
    for _version, key in ordered:
        extra = read_zip_metadata(location.read(key), key).model_extra or {}
        mapping = extra.get("columnFamilyMapping")
        if (isinstance(mapping, dict) and mapping
                and all(isinstance(v, int) and 0 <= v < 1 << 15 for v in mapping.values())):
            return {"columnFamilyMapping": {str(k): int(v) for k, v in mapping.items()},
                    "columnFamilyTypeMap": extra.get("columnFamilyTypeMap") or {},
                    "maxColumnFamilyId": extra.get("maxColumnFamilyId", max(mapping.values()))}
    raise SparkCheckpointError(
        f"operator {operator}: no snapshot yet names its column families' ids")


def _range_decoder(fields: list[Field], where: str) -> Decode:
    """The ordering fields' row: each a binary of a marker and the value big-endian."""
    rows = versioned_row_decoder(
        Struct(tuple(Field(f.name, Atomic("binary")) for f in fields)), where)
    kinds = [f.type.name if isinstance(f.type, Atomic) else "" for f in fields]

    def decode(data: bytes) -> tuple[Any, ...]:
        out: list[Any] = []
        for raw, kind in zip(rows(data), kinds, strict=True):
            layout = _RANGE[kind]
            if not raw or (raw[0] != _NULL and len(raw) < 1 + layout.size):
                raise SparkCheckpointError(f"{where}: an ordering value of {len(raw or b'')} bytes")
            if raw[0] == _NULL:
                out.append(None)
            elif raw[0] == _NEGATIVE and kind in _FLIP:
                bits, mask = _FLIP[kind]
                flipped = bits.pack(bits.unpack_from(raw, 1)[0] ^ mask)
                out.append(layout.unpack(flipped)[0])
            elif raw[0] in (_NEGATIVE, _POSITIVE):
                out.append(layout.unpack_from(raw, 1)[0])
            else:
                raise SparkCheckpointError(f"{where}: an ordering marker {raw[0]:#04x}")
        return tuple(out)

    return decode


def family_id(raw_key: bytes) -> int:
    """The column family id a RocksDB key starts with."""
    if len(raw_key) < 2:
        raise SparkCheckpointError(f"a key of {len(raw_key)} bytes has no column family id")
    value: int = _ID.unpack_from(raw_key)[0]
    return value


def family_prefix(family_id_: int) -> bytes:
    return _ID.pack(family_id_)


def read_variable(location: SparkCheckpoint, found: Scan, tws: TwsOperator, store: StoreId,
                  batch: int, name: str, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """One state variable's rows in `store` as `batch` left them: its key's columns then
    its value's, a list state's one row per element."""
    from statehold.spark_checkpoints.state_reader import arrow_batch, resolved
    from statehold.spark_checkpoints.tws_records import tws_records

    family = tws.family(name)
    decode = family.rows_decoder(f"{store} ({name})")
    arrow = family.schema().arrow()
    _files, needs = resolved(location, found, store, batch)
    if not needs.ok:
        raise SparkCheckpointError(needs.problems[0])
    ids = partition_ids(location, found, tws, store, batch)
    if name not in ids:  # in the schema, never created: no records
        return
    prefix = family_prefix(ids[name])
    rows: list[tuple[Any, ...]] = []
    for k, v in tws_records(location, store, needs, tws.delimiter, tws.list_prefixes):
        if not k.startswith(prefix):
            continue
        rows += decode(k, v)
        if len(rows) >= batch_rows:
            yield arrow_batch(rows, arrow, store)
            rows = []
    if rows:
        yield arrow_batch(rows, arrow, store)


def partition_ids(location: SparkCheckpoint, found: Scan, tws: TwsOperator, store: StoreId,
                  batch: int) -> dict[str, int]:
    """The family ids (name -> id) `store`'s version at `batch` numbers its records by: its
    own snapshot's, which may differ from the operator's newest (`tws.ids`), those where
    the version loads no snapshot."""
    from statehold.spark_checkpoints.state_reader import resolved

    _files, needs = resolved(location, found, store, batch)
    zips = [k for k in needs.files if k.endswith(".zip")]
    if not zips:
        return tws.ids
    mapping: dict[str, int] = zip_family_fields(
        location, found, store.operator, store.name, zips)["columnFamilyMapping"]
    return mapping


def grouping_router(tws: TwsOperator, partitions: int, where: str) -> Callable[[bytes], int]:
    """The partition Spark's hash of a record's grouping key sends it to, from the raw
    RocksDB key (any family of the operator's)."""
    routes: dict[int, Callable[[bytes], int]] = {}
    for fid, family in tws.by_id().items():
        decode = family.key_decoder(f"{where} ({family.name})")
        types = family.grouping_types

        def route(raw: bytes, decode: Decode = decode, family: Family = family,
                  types: list[SparkType] = types) -> int:
            return partition_of(family.grouping(decode(raw)), types, partitions)

        routes[fid] = route

    def router(raw: bytes) -> int:
        fid = family_id(raw)
        route = routes.get(fid)
        if route is None:
            raise SparkCheckpointError(f"{where}: a key of column family {fid}, which is "
                                       "in no schema")
        return route(raw)

    return router
