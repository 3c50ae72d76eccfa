"""What state readers (`iter_state`, `read_state`, `statehold state`) show of stored values.

A processor's typed variables are stored in `statehold.state.codec`'s compact layout, not JSON, so a
reader decodes each variable with the codec its checkpoint recorded (`state_schemas`) and
turns the value into plain JSON data by its Spark type: a struct becomes an object with its
field names, a timestamp or date ISO-8601 text, a decimal its exact text, binary base64.
Untyped variables (no recorded schema) are JSON already and pass through unchanged.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
from dataclasses import dataclass
from typing import Any

from pyspark.sql.types import ArrayType, DataType, MapType, StructType

from statehold.format.metadata import OperatorSchemas, VariableSchema
from statehold.state.json_codec import EntryDecoders
from statehold.state.schema import TypedCodec, from_schema_json


@dataclass(frozen=True)
class PlainDecoder:
    """Decodes one typed variable's stored values (or map keys) into plain data."""

    codec: TypedCodec
    #: a map's keys: a struct or list key becomes its JSON text (JSON objects need text)
    map_key: bool = False

    def decode(self, data: bytes) -> Any:
        value = plain(self.codec.decode(data), self.codec.dtype)
        return _map_key(value) if self.map_key else value


def recorded_decoders(schemas: OperatorSchemas | None) -> dict[str, EntryDecoders]:
    """The decoders of every typed variable an operator's checkpoint recorded (state name
    -> value and map-key decoders); a name absent here is untyped JSON."""
    if schemas is None:
        return {}
    out: dict[str, EntryDecoders] = {}
    for name, var in schemas.variables.items():
        value, key = (
            None if text is None else PlainDecoder(TypedCodec(from_schema_json(text)), is_key)
            for text, is_key in ((var.value, False), (var.map_key, True))
        )
        if value is not None or key is not None:
            out[name] = (value, key)
    return out


def plain(value: Any, dtype: DataType) -> Any:
    """`value` of Spark type `dtype` as JSON-ready data (see the module's docstring)."""
    if value is None:
        return None
    if isinstance(dtype, StructType):
        names = getattr(value, "__fields__", None) or dtype.fieldNames()
        fields = dict(zip(names, value, strict=True))
        return {f.name: plain(fields.get(f.name), f.dataType) for f in dtype.fields}
    if isinstance(dtype, ArrayType):
        return [plain(v, dtype.elementType) for v in value]
    if isinstance(dtype, MapType):
        return {
            _map_key(plain(k, dtype.keyType)): plain(v, dtype.valueType) for k, v in value.items()
        }
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    return value


def _map_key(key: Any) -> Any:
    """JSON objects have text keys: a map key that is a struct or list becomes its JSON."""
    if isinstance(key, str | int | float | bool) or key is None:
        return key
    return json.dumps(key, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def typed_decoders(schemas: OperatorSchemas | None) -> dict[str, EntryDecoders]:
    """Like `recorded_decoders`, but each typed variable decodes to its Spark value
    (datetime, Decimal, bytes, tuples for structs) for a typed column, not to plain data."""
    if schemas is None:
        return {}
    out: dict[str, EntryDecoders] = {}
    for name, var in schemas.variables.items():
        value, key = (
            None if text is None else TypedCodec(from_schema_json(text))
            for text in (var.value, var.map_key)
        )
        if value is not None or key is not None:
            out[name] = (value, key)
    return out


def column_type(var: VariableSchema) -> DataType | None:
    """The Spark type of a recorded variable's whole state per key: its value type, an
    array of it (list state) or a map (map state); None for an untyped (JSON) variable."""
    if var.value is None:
        return None
    value = from_schema_json(var.value)
    if var.kind == "list":
        return ArrayType(value, containsNull=False)
    if var.kind == "map":
        if var.map_key is None:
            return None
        return MapType(from_schema_json(var.map_key), value, valueContainsNull=False)
    return value
