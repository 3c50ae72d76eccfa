"""Checkpoint metadata: one versioned, self-describing JSON document per checkpoint.

JSON, never pickle: a `_metadata` file is data a person can read and a program can verify,
and reading one can never execute code. The document carries a SHA-256 of its own
canonical form, so truncation and bit rot are detected, and every state file path is
relative to the `_metadata` file, so the job directory can be copied anywhere.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator, Mapping
from enum import StrEnum
from typing import Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from statehold import clock
from statehold.errors import InvalidArgumentError, StateholdError
from statehold.format import layout, signed
from statehold.format.layout import Scope
from statehold.storage.base import NotFoundError, Storage, UnsafePathError

FORMAT_NAME: Final = "statehold.checkpoint"
#: Bump on any change a reader of the previous version would misread. Version 2 added
#: `state_schemas` and `event_time`, version 3 `key_hash`; a document is written with the
#: lowest version its content needs, so a job that needs none stays readable by an older
#: statehold.
FORMAT_VERSION = 3
#: The version of one operator's schema record (`OperatorSchemas.version`).
SCHEMA_RECORD_VERSION = 1
#: Characters of one recorded type (Spark's type JSON).
MAX_SCHEMA_JSON = 1 << 20

SchemaJson = Annotated[str, Field(min_length=1, max_length=MAX_SCHEMA_JSON)]

Checksum = Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")]


class MetadataError(StateholdError):
    """A `_metadata` document cannot be used; the message names the file and the problem."""


class RestoreMode(StrEnum):
    RESUME = "resume"
    NO_CLAIM = "no-claim"
    CLAIM = "claim"


class KeyHash(StrEnum):
    """How a job maps a key to its key group (`statehold.backend.keys`). Fixed for the
    life of a job: its stored state is laid out by key group."""

    #: BLAKE2b-64 of the key's UTF-8 bytes: every job written before format version 3.
    BLAKE2B = "blake2b-64"
    #: Spark's ``xxhash64`` (seed 42) of the key's UTF-8 bytes, so the JVM can key rows
    #: without a pass through Python.
    XXHASH64 = "xxhash64"


#: What a new job uses.
NEW_JOB_KEY_HASH = KeyHash.XXHASH64


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StateFile(_Model):
    """One file a checkpoint references."""

    #: Relative to the `_metadata` file; an absolute URI only when `external`.
    path: signed.Name
    scope: Scope
    size: signed.Size
    checksum: Checksum
    #: A file of a restored checkpoint still outside this job directory (only in the
    #: first checkpoint after a no-claim restore, until it holds its own copy).
    external: bool = False
    #: The task's own name for the file (e.g. RocksDB's SST name), so it can be
    #: downloaded back under that name.
    name: signed.Name | None = None


class InlineFile(_Model):
    """A small file of a task's state kept inside `_metadata` instead of on its own (as
    Flink does below its memory threshold): on an object store, one PUT and one later
    DELETE less per file, task and checkpoint. Covered by the document's checksum."""

    #: The task's own name for the file (e.g. RocksDB's MANIFEST-000012).
    name: str = Field(min_length=1, max_length=200)
    #: The bytes, base64.
    data: str = Field(max_length=signed.MAX_INLINE_DATA)

    def content(self) -> bytes:
        try:
            return base64.b64decode(self.data, validate=True)
        except ValueError as e:
            raise signed.InvalidDocumentError(f"inline file {self.name!r}: bad base64: {e}") from e

    @classmethod
    def of(cls, name: str, content: bytes) -> InlineFile:
        return cls(name=name, data=base64.b64encode(content).decode("ascii"))


class KeyGroupRange(_Model):
    """Key groups `start`..`end`, both inclusive."""

    start: signed.KeyGroup
    end: signed.KeyGroup

    @model_validator(mode="after")
    def _ordered(self) -> KeyGroupRange:
        if self.end < self.start:
            raise InvalidArgumentError(f"empty key-group range {self.start}..{self.end}")
        return self

    def __contains__(self, key_group: object) -> bool:
        return isinstance(key_group, int) and self.start <= key_group <= self.end

    def overlaps(self, other: KeyGroupRange) -> bool:
        return self.start <= other.end and other.start <= self.end


class KeyGroupState(_Model):
    """The state of one task: its key-group range and the files that hold it."""

    key_groups: KeyGroupRange
    files: signed.Items[StateFile]
    #: Small files held in the metadata itself (no storage file to reference or delete).
    inline: signed.Items[InlineFile] = Field(default_factory=list)
    #: Small backend-specific facts the task needs to restore (JSON, never code).
    info: dict[str, Any] = Field(default_factory=dict)


class OperatorState(_Model):
    operator: signed.Name = Field(min_length=1)
    ranges: signed.Items[KeyGroupState]


class VariableSchema(_Model):
    """How one state variable's values were stored: its kind and, when typed, Spark's
    type JSON of its values (and of a map's user keys); None is the untyped JSON fallback."""

    kind: str = Field(min_length=1, max_length=64)
    value: SchemaJson | None = None
    map_key: SchemaJson | None = None


class OperatorSchemas(_Model):
    """What a restore checks before the operator reads its state: the grouping key's column
    types and every state variable's schema (see `statehold.state.schema`)."""

    version: signed.Version = SCHEMA_RECORD_VERSION
    #: Spark's type JSON of the grouping key's columns (a struct); None if unknown.
    key: SchemaJson | None = None
    variables: Annotated[
        dict[signed.Name, VariableSchema], signed.each_member(VariableSchema)
    ] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _known_version(self) -> OperatorSchemas:
        if self.version > SCHEMA_RECORD_VERSION:
            raise InvalidArgumentError(
                f"state schema record version {self.version} is newer than this statehold "
                f"reads ({SCHEMA_RECORD_VERSION}); upgrade statehold"
            )
        return self


class Lineage(_Model):
    """Where the state came from when the job was restored from another checkpoint."""

    mode: RestoreMode
    source: signed.Name  # URI of the source `_metadata`
    source_job_id: signed.Name
    source_checkpoint_id: signed.Id
    #: False while a checkpoint still references files of the source (no-claim).
    source_needed: bool = True


class EventTime(_Model):
    """Time after a checkpoint of a job with a stateful processor: its time mode, the
    event-time watermark (ms) the next batch uses, and its earliest pending timer (ms),
    so a driver knows, also after a restart, whether a batch without input is due."""

    time_mode: Literal["none", "processingtime", "eventtime"] = "none"
    watermark_ms: int | None = None
    next_timer_ms: int | None = None


class CheckpointMetadata(_Model):
    format: Literal["statehold.checkpoint"] = FORMAT_NAME
    #: The lowest version that holds the document's content (see FORMAT_VERSION).
    version: signed.Version = 1
    job_id: signed.Name = Field(min_length=1)
    checkpoint_id: signed.Id
    epoch: signed.Id
    kind: Literal["checkpoint", "savepoint"] = "checkpoint"
    savepoint_name: signed.Name | None = None
    created_at: signed.Timestamp = Field(default_factory=clock.now)
    completed_at: signed.Timestamp = Field(default_factory=clock.now)
    #: Where the input stood after this checkpoint (e.g. Spark batch id and offsets).
    source_position: dict[str, Any] = Field(default_factory=dict)
    max_parallelism: signed.MaxParallelism
    operators: signed.Items[OperatorState] = Field(default_factory=list)
    lineage: Lineage | None = None
    #: Per operator, the schemas its state was written with (absent before version 2 and
    #: in jobs that record none).
    state_schemas: (
        Annotated[dict[signed.Name, OperatorSchemas], signed.each_member(OperatorSchemas)] | None
    ) = None
    #: Watermark and timers (jobs with a stateful processor only).
    event_time: EventTime | None = None
    #: How keys map to key groups; absent (BLAKE2b) before version 3.
    key_hash: KeyHash = KeyHash.BLAKE2B
    #: SHA-256 of the canonical document without this field; set by `encode`.
    checksum: str = ""

    @model_validator(mode="before")
    @classmethod
    def _version_of_content(cls, data: Any) -> Any:
        if isinstance(data, dict) and "version" not in data:
            needed = _version_needed(
                data.get("key_hash", KeyHash.BLAKE2B),
                bool(data.get("state_schemas") or data.get("event_time")),
            )
            if needed > 1:
                return {**data, "version": needed}
        return data

    @model_serializer(mode="wrap")
    def _without_absent_schemas(self, handler: SerializerFunctionWrapHandler) -> Any:
        """Leave `state_schemas`, `event_time` and a BLAKE2b `key_hash` out when absent or
        the old default: the document an older statehold (which forbids unknown fields)
        wrote and reads."""
        data = handler(self)
        if isinstance(data, dict):
            for name in ("state_schemas", "event_time"):
                if data.get(name, 0) is None:
                    del data[name]
            if data.get("key_hash") == KeyHash.BLAKE2B:
                del data["key_hash"]
        return data

    def state_files(self) -> Iterator[tuple[str, KeyGroupState, StateFile]]:
        for op in self.operators:
            for kg in op.ranges:
                for f in kg.files:
                    yield op.operator, kg, f


def check_paths(meta: CheckpointMetadata, metadata_key: str) -> None:
    """Every non-external file must resolve to a data file of the job directory (see
    `layout.check_data_key`); external files (no-claim only) must carry an absolute URI."""
    for _op, _kg, f in meta.state_files():
        if f.external:
            if "://" not in f.path:
                raise UnsafePathError(f"external file {f.path!r} is not an absolute URI")
        else:
            layout.check_data_key(metadata_key, layout.resolve(metadata_key, f.path))


def encode(meta: CheckpointMetadata, metadata_key: str) -> bytes:
    """Serialize with its checksum; refuses absolute or escaping paths."""
    return signed.encode(_checked(meta, metadata_key))


def sealed(meta: CheckpointMetadata, metadata_key: str) -> tuple[bytes, CheckpointMetadata]:
    """`encode`, and the metadata as `decode` reads that document back (checksum set)."""
    return signed.sealed(_checked(meta, metadata_key))


def _checked(meta: CheckpointMetadata, metadata_key: str) -> CheckpointMetadata:
    """`meta` ready to encode: its paths checked, its version the one its fields need."""
    check_paths(meta, metadata_key)
    needed = _version_needed(
        meta.key_hash, meta.state_schemas is not None or meta.event_time is not None
    )
    if meta.version < needed:  # e.g. set by model_copy
        meta = meta.model_copy(update={"version": needed})
    return meta


def _version_needed(key_hash: object, has_schemas_or_time: bool) -> int:
    """The lowest format version that holds a document's content."""
    if key_hash != KeyHash.BLAKE2B:  # a StrEnum: equal to its value in a raw document
        return 3
    return 2 if has_schemas_or_time else 1


def decode(data: bytes, metadata_key: str, where: str | None = None) -> CheckpointMetadata:
    """Parse and verify a document; raise MetadataError naming `where` and the problem."""
    where = where or metadata_key
    meta = signed.decode(
        data,
        CheckpointMetadata,
        where=where,
        format_name=FORMAT_NAME,
        version=FORMAT_VERSION,
        what="checkpoint metadata",
        error=MetadataError,
    )
    try:
        check_paths(meta, metadata_key)
    except UnsafePathError as e:
        raise MetadataError(f"{where}: unsafe state file path: {e}") from e
    return meta


def newer_version(data: bytes) -> int | None:
    """The format version a `_metadata` document declares if it is newer than this
    statehold reads (see `signed.newer_version`), else None."""
    return signed.newer_version(data, format_name=FORMAT_NAME, version=FORMAT_VERSION)


def read_metadata(storage: Storage, metadata_key: str) -> CheckpointMetadata:
    where = f"{storage.uri.rstrip('/')}/{metadata_key}"
    try:
        data = storage.read(metadata_key)
    except NotFoundError as e:
        raise MetadataError(f"{where}: missing") from e
    return decode(data, metadata_key, where)


def referenced_keys(meta: CheckpointMetadata, metadata_key: str) -> dict[str, StateFile]:
    """Job-directory keys of the files this checkpoint references inside the job
    directory (external files are not ours and are left out)."""
    return {
        layout.resolve(metadata_key, f.path): f
        for _op, _kg, f in meta.state_files()
        if not f.external
    }


def check_stored(storage: Storage, files: Mapping[str, StateFile]) -> list[tuple[str, str]]:
    """(key, problem) for each file that is missing, of another size or another checksum
    than `files` (key -> what the metadata says) records. What restore and export check
    before they publish anything."""
    problems = []
    for key, f in sorted(files.items()):
        info = storage.stat(key)
        if info is None:
            problems.append((key, "missing"))
        elif info.size != f.size:
            problems.append((key, f"size {info.size}, metadata says {f.size}"))
        elif storage.checksum(key, info.size) != f.checksum:
            problems.append((key, "checksum mismatch"))
    return problems


def relocate(
    meta: CheckpointMetadata, old_key: str, new_key: str, moved: Mapping[str, str]
) -> CheckpointMetadata:
    """The same document for a new place `new_key`, with every file path relative to it;
    `moved` maps a file's old job-directory key to its new one (unchanged if absent)."""

    def path(f: StateFile) -> str:
        old = layout.resolve(old_key, f.path)
        return layout.relativize(new_key, moved.get(old, old))

    operators = [
        op.model_copy(
            update={
                "ranges": [
                    kg.model_copy(
                        update={"files": [f.model_copy(update={"path": path(f)}) for f in kg.files]}
                    )
                    for kg in op.ranges
                ]
            }
        )
        for op in meta.operators
    ]
    return meta.model_copy(update={"operators": operators})
