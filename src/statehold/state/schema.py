"""How a state variable's values become bytes: a codec per variable, chosen by its schema.

Without a schema a value is stored as strict UTF-8 JSON (the untyped fallback: no NaN,
never pickled). With a schema (Spark DDL text or a `StructType`/`DataType`) a value keeps
its exact type: timestamps, decimals, binary and nested structs round-trip unchanged
(`statehold.state.codec` has the encoding). The schema a checkpoint was written with is recorded in
its metadata as Spark's canonical type JSON (`schema_json`), and `check_compatible`
decides on restore whether a new schema can read it: the same type, or one that appends
nullable fields to a struct (at any depth); anything else is refused with both types.
"""

from __future__ import annotations

import json
from typing import Any

from pyspark.sql.types import ArrayType, DataType, MapType, StructType, _parse_datatype_json_value

from statehold.errors import InvalidArgumentError, StateholdError
from statehold.state import codec as state_codec
from statehold.state.ddl import parse_ddl
from statehold.state.json_codec import JSON, StateCodec, StateDecodeError, StateValueError

#: The longest recorded schema a checkpoint may carry (characters of type JSON).
MAX_SCHEMA_JSON = 1 << 20


class TypedCodec:
    """Values of one Spark `DataType`, in `statehold.state.codec`'s compact layout."""

    def __init__(self, dtype: DataType) -> None:
        self.dtype = dtype
        self._encode, self._decode = state_codec.build(dtype)
        self._json = dtype.json()

    def encode(self, value: Any) -> bytes:
        if value is None:
            raise StateValueError("a state value cannot be None (clear the state to remove it)")
        out = bytearray((state_codec.FORMAT,))
        self._encode(value, out)
        return bytes(out)

    def decode(self, data: bytes) -> Any:
        try:
            if not data or data[0] != state_codec.FORMAT:
                raise StateDecodeError(f"unknown encoding {data[:1]!r}")
            value, end = self._decode(data, 1)
            if end != len(data):
                raise StateDecodeError(f"{len(data) - end} bytes left over")
        except Exception as e:
            raise StateDecodeError(
                f"stored bytes are not a {self.dtype.simpleString()} value: {e}"
            ) from e
        return value

    def schema_json(self) -> str | None:
        return self._json


class SchemaEvolutionError(StateholdError):
    """A restored checkpoint's recorded schema cannot be read with the schema asked for."""


def data_type(schema: Any) -> DataType:
    """The `DataType` a schema argument (DDL text or a `DataType`) stands for."""
    if isinstance(schema, DataType):
        return schema
    if isinstance(schema, str):
        return parse_ddl(schema)
    raise InvalidArgumentError(
        f"a state schema is Spark DDL text or a pyspark DataType, not {type(schema).__name__}"
    )


def codec_for(schema: Any = None) -> StateCodec:
    """The codec for a variable declared with `schema` (None: JSON)."""
    if schema is None:
        return JSON
    return TypedCodec(data_type(schema))


def from_schema_json(text: str) -> DataType:
    """The `DataType` of a recorded `schema_json`; refuses anything else in one line."""
    if len(text) > MAX_SCHEMA_JSON:
        raise SchemaEvolutionError(f"recorded schema is longer than {MAX_SCHEMA_JSON} chars")
    try:
        parsed = _parse_datatype_json_value(json.loads(text))
    except (ValueError, TypeError, KeyError, RecursionError) as e:
        raise SchemaEvolutionError(f"recorded schema is not a Spark type: {e}") from e
    if not isinstance(parsed, DataType):
        raise SchemaEvolutionError(f"recorded schema is not a Spark type: {text[:200]!r}")
    return parsed


def _show(schema_json: str | None) -> str:
    return "untyped JSON" if schema_json is None else from_schema_json(schema_json).simpleString()


def check_compatible(variable: str, recorded: str | None, requested: str | None) -> None:
    """Raise `SchemaEvolutionError` (naming the variable and both types) unless values
    written under `recorded` can be read under `requested`."""
    if recorded == requested:
        return
    problem = "typed and untyped state do not mix"
    if recorded is not None and requested is not None:
        problem = _unreadable(from_schema_json(recorded), from_schema_json(requested), "") or ""
        if not problem:
            return
    raise SchemaEvolutionError(
        f"state variable {variable!r}: recorded type {_show(recorded)} cannot be read as "
        f"{_show(requested)}: {problem}"
    )


def check_same_key(operator: str, recorded: str | None, requested: str | None) -> None:
    """Raise `SchemaEvolutionError` if the grouping key's column types changed (renaming a
    column is fine): stored keys would silently stop matching the new ones."""
    if recorded is None or requested is None or recorded == requested:
        return
    old, new = from_schema_json(recorded), from_schema_json(requested)
    if _key_types(old) != _key_types(new):
        raise SchemaEvolutionError(
            f"operator {operator!r}: the key columns were {old.simpleString()} and are now "
            f"{new.simpleString()}; stored state would no longer match its keys"
        )


def _key_types(dtype: DataType) -> list[str]:
    fields = dtype.fields if isinstance(dtype, StructType) else []
    return [_bare(f.dataType) for f in fields] if fields else [_bare(dtype)]


def _bare(dtype: DataType) -> str:
    """A type's JSON without names' metadata and nullability, for comparing key types."""
    return json.dumps(_strip(dtype.jsonValue()), sort_keys=True)


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        drop = ("metadata", "nullable", "containsNull", "valueContainsNull")
        return {k: _strip(v) for k, v in value.items() if k not in drop}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _unreadable(old: DataType, new: DataType, path: str) -> str | None:  # noqa: C901
    """Why values of `old` cannot be read as `new` (None if they can): the same type,
    nullability only relaxed, and structs may gain nullable fields at the end."""
    at = f" at {path}" if path else ""
    if isinstance(old, StructType) and isinstance(new, StructType):
        if len(new.fields) < len(old.fields):
            gone = [f.name for f in old.fields[len(new.fields) :]]
            return f"field(s) {gone} removed{at}"
        for o, n in zip(old.fields, new.fields, strict=False):
            where = f"{path}.{n.name}" if path else n.name
            if o.name != n.name:
                return f"field {o.name!r} became {n.name!r}{at} (fields may only be appended)"
            if o.nullable and not n.nullable:
                return f"{where} became NOT NULL"
            problem = _unreadable(o.dataType, n.dataType, where)
            if problem:
                return problem
        for n in new.fields[len(old.fields) :]:
            if not n.nullable:
                return f"added field {n.name!r}{at} is NOT NULL (old values have no value)"
        return None
    if isinstance(old, ArrayType) and isinstance(new, ArrayType):
        if old.containsNull and not new.containsNull:
            return f"array elements{at} became NOT NULL"
        return _unreadable(old.elementType, new.elementType, f"{path}[]")
    if isinstance(old, MapType) and isinstance(new, MapType):
        if _bare(old.keyType) != _bare(new.keyType):
            return f"map key type changed{at}"
        if old.valueContainsNull and not new.valueContainsNull:
            return f"map values{at} became NOT NULL"
        return _unreadable(old.valueType, new.valueType, f"{path}{{}}")
    if _bare(old) != _bare(new):
        return f"{old.simpleString()} became {new.simpleString()}{at}"
    return None
