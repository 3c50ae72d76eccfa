"""Spark SQL's data types as its JSON ``StructType`` spells them (what the state schema
files hold), parsed into a small typed tree, and their Arrow equivalents.

The tree is what the UnsafeRow decoder walks: each type says how its value is laid out
(a fixed slot, or an offset and size to a variable-length region). Types Spark does not
allow in state, or that statehold does not decode yet (intervals, variants, UDTs), are
refused in one line, naming the field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from statehold.spark_checkpoints.errors import SparkCheckpointError

#: Spark's largest decimal precision, and the largest whose unscaled value fits a long
#: (stored in the fixed slot; larger ones are variable-length bytes).
MAX_PRECISION = 38
MAX_LONG_DIGITS = 18
#: How deep types may nest: the decoder recurses once per level.
MAX_NESTING = 32

#: Fixed-width atomic types: their width in an array's element region.
FIXED_WIDTH = {
    "boolean": 1, "byte": 1, "short": 2, "integer": 4, "float": 4, "date": 4,
    "long": 8, "double": 8, "timestamp": 8, "timestamp_ntz": 8,
}
VARIABLE = {"string", "binary"}
_ARROW_ATOMIC: dict[str, pa.DataType] = {
    "boolean": pa.bool_(), "byte": pa.int8(), "short": pa.int16(), "integer": pa.int32(),
    "long": pa.int64(), "float": pa.float32(), "double": pa.float64(), "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"), "timestamp_ntz": pa.timestamp("us"),
    "string": pa.string(), "binary": pa.binary(), "void": pa.null(),
}
_DECIMAL = re.compile(r"decimal\(\s*(\d{1,3})\s*,\s*(-?\d{1,3})\s*\)")
_CHARS = re.compile(r"(?:var)?char\(\d{1,9}\)")


@dataclass(frozen=True, slots=True)
class Atomic:
    """A type without children: one of `FIXED_WIDTH`, `VARIABLE`, or ``void``."""

    name: str


@dataclass(frozen=True, slots=True)
class Decimal:
    precision: int
    scale: int

    @property
    def compact(self) -> bool:
        """Whether the unscaled value is a long in the slot (else bytes elsewhere)."""
        return self.precision <= MAX_LONG_DIGITS


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    type: SparkType
    nullable: bool = True


@dataclass(frozen=True, slots=True)
class Struct:
    fields: tuple[Field, ...]


@dataclass(frozen=True, slots=True)
class Array:
    element: SparkType
    contains_null: bool = True


@dataclass(frozen=True, slots=True)
class Map:
    key: SparkType
    value: SparkType
    value_contains_null: bool = True


SparkType = Atomic | Decimal | Struct | Array | Map


def parse_struct(doc: Any, where: str) -> Struct:
    """A JSON ``StructType`` (already parsed) as a `Struct`."""
    parsed = _parse(doc, where, "", 0)
    if not isinstance(parsed, Struct):
        raise SparkCheckpointError(f"{where}: the schema is not a struct")
    return parsed


def _parse(doc: Any, where: str, path: str, depth: int) -> SparkType:
    at = path or "the schema"
    if depth > MAX_NESTING:
        raise SparkCheckpointError(f"{where}: {at} nests more than {MAX_NESTING} levels")
    if isinstance(doc, str):
        return _atomic(doc, where, at)
    if not isinstance(doc, dict):
        raise SparkCheckpointError(f"{where}: {at} is not a type")
    kind = doc.get("type")
    try:
        if kind == "struct":
            fields = doc["fields"]
            if not isinstance(fields, list):
                raise SparkCheckpointError(f"{where}: {at}'s fields are not a list")
            return Struct(tuple(_field(f, where, path, depth) for f in fields))
        if kind == "array":
            return Array(_parse(doc["elementType"], where, f"{path}[]", depth + 1),
                         bool(doc.get("containsNull", True)))
        if kind == "map":
            return Map(_parse(doc["keyType"], where, f"{path}{{key}}", depth + 1),
                       _parse(doc["valueType"], where, f"{path}{{value}}", depth + 1),
                       bool(doc.get("valueContainsNull", True)))
    except (KeyError, TypeError) as e:
        raise SparkCheckpointError(f"{where}: {at} is not a valid {kind} ({e})") from None
    raise SparkCheckpointError(f"{where}: {at} has type {str(kind)[:80]!r}, not read")


def _field(doc: Any, where: str, path: str, depth: int) -> Field:
    if not isinstance(doc, dict) or not isinstance(doc.get("name"), str):
        raise SparkCheckpointError(f"{where}: a field of {path or 'the schema'} has no name")
    name = doc["name"]
    inner = f"{path}.{name}" if path else name
    return Field(name, _parse(doc.get("type"), where, inner, depth + 1),
                 bool(doc.get("nullable", True)))


def _atomic(name: str, where: str, at: str) -> SparkType:
    if name in _ARROW_ATOMIC:
        return Atomic(name)
    if name == "decimal":
        return Decimal(10, 0)
    if _CHARS.fullmatch(name):
        return Atomic("string")
    found = _DECIMAL.fullmatch(name)
    if found:
        precision, scale = int(found[1]), int(found[2])
        if not 0 < precision <= MAX_PRECISION or not 0 <= scale <= precision:
            raise SparkCheckpointError(f"{where}: {at} is {name}, not a valid decimal")
        return Decimal(precision, scale)
    raise SparkCheckpointError(f"{where}: {at} has type {name[:80]!r}, not read")


def to_arrow(t: SparkType) -> pa.DataType:
    """The Arrow type values of `t` are given as (timestamps in microseconds, UTC for
    Spark's ``timestamp``, none for ``timestamp_ntz``; dates in days)."""
    if isinstance(t, Atomic):
        return _ARROW_ATOMIC[t.name]
    if isinstance(t, Decimal):
        return pa.decimal128(t.precision, t.scale)
    if isinstance(t, Struct):
        return pa.struct(arrow_fields(t))
    if isinstance(t, Array):
        return pa.list_(pa.field("element", to_arrow(t.element), t.contains_null))
    return pa.map_(to_arrow(t.key), pa.field("value", to_arrow(t.value), t.value_contains_null))


def arrow_fields(t: Struct) -> list[pa.Field]:
    # nullable always: Spark's "nullable: false" is a promise about the query's values,
    # not one a state file keeps (and a void field is null by definition)
    return [pa.field(f.name, to_arrow(f.type), True) for f in t.fields]


def from_arrow(t: pa.DataType, where: str) -> SparkType:
    """The Spark type whose values `to_arrow`'s `t` holds: the inverse of `to_arrow` (any
    time zone is Spark's ``timestamp``; large strings and binaries are strings and
    binaries); a type Spark state cannot hold is refused in one line."""
    import pyarrow.types as pt

    if pt.is_struct(t):
        return Struct(tuple(Field(f.name, from_arrow(f.type, f"{where}.{f.name}"), f.nullable)
                            for f in t))
    if pt.is_map(t):
        return Map(from_arrow(t.key_type, f"{where}{{key}}"),
                   from_arrow(t.item_type, f"{where}{{value}}"), t.item_field.nullable)
    if pt.is_list(t) or pt.is_large_list(t):
        return Array(from_arrow(t.value_type, f"{where}[]"), t.value_field.nullable)
    if pt.is_decimal(t):
        if not 0 < t.precision <= MAX_PRECISION or not 0 <= t.scale <= t.precision:
            raise SparkCheckpointError(f"{where}: {t} is not a Spark decimal")
        return Decimal(t.precision, t.scale)
    if pt.is_timestamp(t):
        if t.unit != "us":
            raise SparkCheckpointError(f"{where}: {t}: Spark's timestamps are in microseconds")
        return Atomic("timestamp" if t.tz else "timestamp_ntz")
    if pt.is_large_string(t):
        return Atomic("string")
    if pt.is_large_binary(t):
        return Atomic("binary")
    for name, arrow in _ARROW_ATOMIC.items():
        if t == arrow:
            return Atomic(name)
    raise SparkCheckpointError(f"{where}: Arrow type {t} has no Spark state type")


def struct_from_arrow(schema: pa.Schema, where: str) -> Struct:
    """A pyarrow schema's fields as a Spark struct (`from_arrow` of each)."""
    return Struct(tuple(Field(f.name, from_arrow(f.type, f"{where} {f.name}"), f.nullable)
                        for f in schema))
