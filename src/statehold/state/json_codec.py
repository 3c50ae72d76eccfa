"""The one codec protocol of state values, and the untyped fallback: strict JSON.

Every state variable's values pass through a `StateCodec`: `codec_for` (in
`statehold.state.schema`) picks a typed one for a schema and `JSON` without one. It lives
here, below the backend that stores the bytes, so the backend and the typed codecs share
one protocol and one JSON encoding. Without a schema, values must be JSON data: None,
bool, int, float, str, and lists / dicts (with str keys) of those; tuples come back as
lists; JSON map keys are scalars. Never pickled, so reading state can never run code.
This module needs no pyspark: a backend without typed state never imports it.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from statehold.errors import InvalidArgumentError, StateholdError

_SCALARS = (str, int, float, bool, type(None))


class StateValueError(InvalidArgumentError, TypeError):
    """A value that does not fit its state variable's codec (nothing was written)."""


class StateDecodeError(StateholdError):
    """Stored bytes that are not a value of the variable's schema (corrupt or foreign)."""


class Decoder(Protocol):
    """What a reader needs of a codec: stored bytes back to a value."""

    def decode(self, data: bytes) -> Any: ...


class StateCodec(Decoder, Protocol):
    """Turns one state value into bytes and back; `schema_json` is what metadata records
    (None: untyped JSON)."""

    def encode(self, value: Any) -> bytes: ...
    def schema_json(self) -> str | None: ...


#: A reader's decoders of one state name: (values, map keys); None is the JSON fallback.
EntryDecoders = tuple[Decoder | None, Decoder | None]


#: One encoder for every value: ``json.dumps`` with any option builds a new one per call,
#: which cost a third of encoding a small value.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


class JsonCodec:
    """The untyped fallback: compact strict UTF-8 JSON (no NaN); refuses anything else."""

    def encode(self, value: Any) -> bytes:
        try:
            text = _ENCODER.encode(value)
        except (TypeError, ValueError) as e:
            raise StateValueError(f"state values must be JSON-serializable: {e}") from e
        return text.encode("utf-8")

    def decode(self, data: bytes) -> Any:
        return json.loads(data.decode("utf-8"))

    def schema_json(self) -> str | None:
        return None


class JsonMapKeyCodec(JsonCodec):
    """Canonical JSON of a scalar map key, so equal keys always hit the same entry."""

    def encode(self, value: Any) -> bytes:
        if not isinstance(value, _SCALARS):
            raise StateValueError(
                f"map keys must be str, int, float, bool or None, not {value!r}"
            )
        return super().encode(value)


JSON: StateCodec = JsonCodec()
JSON_MAP_KEY: StateCodec = JsonMapKeyCodec()
