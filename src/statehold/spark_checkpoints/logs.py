"""Spark's metadata logs, parsed: the offsets log, the commit log and the sources' logs.

Every log file starts with a version line (``v1``) and holds JSON after it. A version
newer than statehold knows is refused: its meaning cannot be guessed, and a tool that
rewrote or deleted by a guess could lose a query's progress.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from statehold.format.signed import load_json
from statehold.spark_checkpoints.errors import SparkCheckpointError
from statehold.spark_checkpoints.layout import is_decimal

#: The newest log version statehold reads, per log.
OFFSETS_VERSION = 1
COMMITS_VERSION = 2
SOURCE_LOG_VERSION = 1
SINK_LOG_VERSION = 1


class OffsetMetadata(BaseModel):
    """The second line of ``offsets/N``: the batch's watermark, timestamp and the
    query's SQL configuration as of its first batch."""

    model_config = ConfigDict(extra="allow")

    batchWatermarkMs: int = 0  # noqa: N815 - Spark's field names
    batchTimestampMs: int = 0  # noqa: N815
    conf: dict[str, str] = Field(default_factory=dict)


class Offsets(BaseModel):
    """``offsets/N``: what batch N reads, one offset per source (None: no data yet)."""

    version: int
    metadata: OffsetMetadata
    sources: list[Any | None]


class Commit(BaseModel):
    """``commits/N``: batch N completed; v2 also names each store's checkpoint (format
    version 2): operator id -> per partition -> per store, the unique id of the version
    batch N wrote."""

    model_config = ConfigDict(extra="allow")

    version: int = 1
    nextBatchWatermarkMs: int = 0  # noqa: N815
    stateUniqueIds: dict[str, list[list[str]]] | None = None  # noqa: N815


class FileEntry(BaseModel):
    """One line of a file source's (or file sink's) log."""

    model_config = ConfigDict(extra="allow")

    path: str
    batchId: int | None = None  # noqa: N815


def split_versioned(text: str, key: str, newest: int) -> tuple[int, list[str]]:
    """The version and the lines after it; refuses a newer version or a bad header."""
    first, _, rest = text.partition("\n")
    if not (first.startswith("v") and is_decimal(first[1:])):
        raise SparkCheckpointError(f"{key}: not a Spark log file (first line {first[:20]!r})")
    version = int(first[1:])
    if version < 1 or version > newest:
        raise SparkCheckpointError(
            f"{key}: log version v{version}, statehold reads up to v{newest} "
            "(written by a newer Spark? upgrade statehold)"
        )
    return version, rest.splitlines()


def _json(line: str, key: str) -> Any:
    """One JSON line, parsed as every untrusted document is (`load_json`: bounded depth
    and size, one line on refusal)."""
    return load_json(line.encode("utf-8", "surrogatepass"), where=key, error=SparkCheckpointError,
                     invalid="not JSON")


def _decode(data: bytes, key: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise SparkCheckpointError(f"{key}: not UTF-8 text") from None


def parse_offsets(data: bytes, key: str) -> Offsets:
    version, lines = split_versioned(_decode(data, key), key, OFFSETS_VERSION)
    if not lines:
        raise SparkCheckpointError(f"{key}: no offset metadata (truncated?)")
    try:
        metadata = OffsetMetadata.model_validate(_json(lines[0], key))
    except ValidationError as e:
        raise SparkCheckpointError(f"{key}: bad offset metadata ({_first(e)})") from None
    sources = [None if line == "-" else _json(line, key) for line in lines[1:]]
    return Offsets(version=version, metadata=metadata, sources=sources)


def parse_commit(data: bytes, key: str) -> Commit:
    version, lines = split_versioned(_decode(data, key), key, COMMITS_VERSION)
    if not lines:
        raise SparkCheckpointError(f"{key}: empty commit (truncated?)")
    try:
        return Commit.model_validate({**_json(lines[0], key), "version": version})
    except (ValidationError, TypeError) as e:
        detail = _first(e) if isinstance(e, ValidationError) else "not an object"
        raise SparkCheckpointError(f"{key}: bad commit ({detail})") from None


def parse_file_log(data: bytes, key: str, newest: int = SOURCE_LOG_VERSION) -> list[FileEntry]:
    """A file source's or file sink's log file (plain or compacted): the files it names.
    Another source's log (Kafka's initial offsets: a zero byte, then a versioned JSON
    document) parses too and names none."""
    _version, lines = split_versioned(_decode(data.removeprefix(b"\x00"), key), key, newest)
    docs = [_json(line, key) for line in lines if line]
    if not all(isinstance(d, dict) and "path" in d for d in docs):
        return []
    try:
        return [FileEntry.model_validate(d) for d in docs]
    except ValidationError as e:
        raise SparkCheckpointError(f"{key}: bad file log entry ({_first(e)})") from None


def render_file_log(entries: list[FileEntry], version: int = SOURCE_LOG_VERSION) -> bytes:
    """The text Spark writes for a file log: its version line, one JSON object per line."""
    lines = [f"v{version}"] + [
        json.dumps(e.model_dump(exclude_none=True), separators=(",", ":")) for e in entries
    ]
    return "\n".join(lines).encode()


def _first(e: ValidationError) -> str:
    err = e.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    return f"{where}: {err['msg']}" if where else err["msg"]
