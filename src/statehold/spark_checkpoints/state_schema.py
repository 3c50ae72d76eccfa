"""A state store's schema file (``state/OP/PART/[STORE/]_metadata/schema``): the key and
value schemas Spark checks a restart against, and that the offline reader decodes rows
with.

Spark writes it with Java's DataOutputStream: the version as ``writeUTF`` (``v1``, ``v2``),
then for v1 the key and value schemas' JSON, each one ``writeUTF``; for v2 each schema as
a chunk count (4-byte int) and that many ``writeUTF`` chunks (a schema may be longer than
one UTF string's 64 KiB). Version 3 (transformWithState's, under
``state/OP/_stateSchema/STORE/``) is a column family count (4-byte int), then for each
family its name (``writeUTF``) and four chunked texts: the key schema, the value schema
(each after its 2-byte schema id), the key encoder's spec and the user key encoder's
schema (``{    }`` for none), read by
`read_state_schema_v3` (`tws_state` makes sense of them).

Where a location holds no schema a reader can use, the caller gives one as JSON
(`parse_state_schema_json`): ``{"key": <StructType JSON>, "value": <StructType JSON>}``,
each in Spark's own form (``StructType.json()``, what the schema file holds).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from statehold.format.signed import load_json
from statehold.spark_checkpoints.errors import SparkCheckpointError
from statehold.spark_checkpoints.spark_types import (
    Array,
    Atomic,
    Decimal,
    SparkType,
    Struct,
    arrow_fields,
    parse_struct,
)

#: A schema file is a few KiB; one larger than this is not read.
MAX_SCHEMA_BYTES = 16 << 20
#: The metadata key of a state batch's Arrow schema: how many leading columns are the key.
KEY_COLUMNS = b"statehold.key_columns"
#: The most bytes Java's ``writeUTF`` writes in one string.
_UTF_MAX = 65535


@dataclass(frozen=True, slots=True)
class StateSchema:
    """A store's key and value schemas."""

    key: Struct
    value: Struct

    def arrow(self) -> pa.Schema:
        """Key columns, then value columns; the metadata says how many are the key."""
        fields = [*arrow_fields(self.key), *arrow_fields(self.value)]
        return pa.schema(fields, metadata={KEY_COLUMNS: str(len(self.key.fields)).encode()})


def read_state_schema(data: bytes, where: str) -> StateSchema:
    """The key and value schemas of a schema file's bytes; SparkCheckpointError (one line)
    when it is not one statehold reads."""
    key, value = read_state_schema_texts(data, where)
    return StateSchema(struct_text(key, f"{where} (key schema)"),
                       struct_text(value, f"{where} (value schema)"))


def read_state_schema_texts(data: bytes, where: str) -> tuple[str, str]:
    """The key and value schemas' JSON texts of a schema file's bytes, as Spark wrote them
    (a rewritten file keeps an unchanged side's text, field metadata and all)."""
    if len(data) > MAX_SCHEMA_BYTES:
        raise SparkCheckpointError(f"{where}: {len(data)} bytes, not a state schema file")
    reader = _Reader(data, where)
    version = reader.utf()
    if version == "v1":
        key, value = reader.utf(), reader.utf()
    elif version == "v2":
        key, value = reader.chunks(), reader.chunks()
    elif version == "v3":
        raise SparkCheckpointError(
            f"{where}: state schema v3 (transformWithState's column families): read it by "
            "state variable")
    else:
        raise SparkCheckpointError(f"{where}: not a state schema file (version {version[:20]!r})")
    if reader.at != len(data):
        raise SparkCheckpointError(f"{where}: {len(data) - reader.at} bytes after the schemas")
    return key, value


def read_state_schema_v3(data: bytes, where: str) -> list[tuple[str, str, str, str]]:
    """A v3 schema file's column families: (name, key schema, value schema, key encoder
    spec) as their JSON texts; SparkCheckpointError (one line) when it is not one."""
    if len(data) > MAX_SCHEMA_BYTES:
        raise SparkCheckpointError(f"{where}: {len(data)} bytes, not a state schema file")
    reader = _Reader(data, where)
    version = reader.utf()
    if version != "v3":
        raise SparkCheckpointError(
            f"{where}: state schema {version[:20]!r}, not v3 (transformWithState's)")
    (count,) = struct.unpack(">i", reader._take(4))
    if not 0 < count <= len(data) // 8:
        raise SparkCheckpointError(f"{where}: {count} column families")
    families = []
    for _ in range(count):
        name = reader.utf()
        reader._take(2)  # the key schema's id (schema evolution's; 0)
        key = reader.chunks()
        reader._take(2)  # the value schema's id
        value, spec = reader.chunks(), reader.chunks()
        reader.chunks()  # the user key encoder's schema: not needed to read the rows
        families.append((name, key, value, spec))
    if reader.at != len(data):
        raise SparkCheckpointError(f"{where}: {len(data) - reader.at} bytes after the schemas")
    return families


def state_schema_file(key: str, value: str) -> bytes:
    """A v2 schema file of the key and value schemas' JSON texts, as Spark writes one:
    ``writeUTF("v2")``, then each schema as a chunk count and that many ``writeUTF``
    chunks of at most 65535 bytes (Spark's chunks are 65535 characters; the same for the
    ASCII a schema's JSON is)."""
    out = bytearray(_utf("v2"))
    for text in (key, value):
        chunks = _chunked(text)
        out += struct.pack(">i", len(chunks))
        for chunk in chunks:
            out += _utf(chunk)
    return bytes(out)


def _utf(text: str) -> bytes:
    data = text.encode("utf-8", "surrogatepass")
    return struct.pack(">H", len(data)) + data


def _chunked(text: str) -> list[str]:
    chunks: list[str] = []
    current: list[str] = []
    size = 0
    for ch in text:
        n = len(ch.encode("utf-8", "surrogatepass"))
        if size + n > _UTF_MAX:
            chunks.append("".join(current))
            current, size = [], 0
        current.append(ch)
        size += n
    chunks.append("".join(current))
    return chunks


def struct_json(schema: Struct) -> str:
    """A `Struct` as Spark's StructType JSON (``StructType.json()``; no field metadata)."""
    return json.dumps(_type_json(schema), separators=(",", ":"), ensure_ascii=False)


def _type_json(t: SparkType) -> Any:
    if isinstance(t, Atomic):
        return t.name
    if isinstance(t, Decimal):
        return f"decimal({t.precision},{t.scale})"
    if isinstance(t, Struct):
        return {"type": "struct", "fields": [
            {"name": f.name, "type": _type_json(f.type), "nullable": f.nullable, "metadata": {}}
            for f in t.fields]}
    if isinstance(t, Array):
        return {"type": "array", "elementType": _type_json(t.element),
                "containsNull": t.contains_null}
    return {"type": "map", "keyType": _type_json(t.key), "valueType": _type_json(t.value),
            "valueContainsNull": t.value_contains_null}


def parse_state_schema_json(data: bytes, where: str) -> StateSchema:
    """The key and value schemas of a JSON document ``{"key": ..., "value": ...}`` (each
    Spark's StructType JSON); SparkCheckpointError (one line) when it is not one."""
    doc = load_json(data, where=where, error=SparkCheckpointError, max_bytes=MAX_SCHEMA_BYTES)
    if not isinstance(doc, dict) or set(doc) != {"key", "value"}:
        raise SparkCheckpointError(
            f"{where}: not a state schema (a JSON object with \"key\" and \"value\", each "
            "a Spark StructType)")
    return StateSchema(parse_struct(doc["key"], f"{where} (key schema)"),
                       parse_struct(doc["value"], f"{where} (value schema)"))


def schema_json(text: str, where: str) -> Any:
    """A schema file's JSON text (Java's modified UTF-8: lone surrogates kept), bounded."""
    return load_json(text.encode("utf-8", "surrogatepass"), where=where,
                     error=SparkCheckpointError, max_bytes=MAX_SCHEMA_BYTES)


def struct_text(text: str, where: str) -> Struct:
    """A StructType's JSON text as a `Struct`."""
    return parse_struct(schema_json(text, where), where)


class _Reader:
    """Java's DataInputStream over bytes, refusing in one line where they end early."""

    def __init__(self, data: bytes, where: str) -> None:
        self.data, self.at, self.where = data, 0, where

    def _take(self, n: int) -> bytes:
        if self.at + n > len(self.data):
            raise SparkCheckpointError(f"{self.where}: cut short at byte {self.at}")
        out = self.data[self.at : self.at + n]
        self.at += n
        return out

    def utf(self) -> str:
        (length,) = struct.unpack(">H", self._take(2))
        try:
            # Java's modified UTF-8 differs only for NUL and astral characters
            return self._take(length).decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            raise SparkCheckpointError(f"{self.where}: a string that is not UTF-8") from None

    def chunks(self) -> str:
        (count,) = struct.unpack(">i", self._take(4))
        if not 0 < count <= len(self.data) // 2:
            raise SparkCheckpointError(f"{self.where}: {count} chunks in a schema")
        return "".join(self.utf() for _ in range(count))
