"""Operations on job directories for people and scripts: list, inspect, verify, diff, du,
export and dispose. The CLI (`statehold.cli`) is a thin layer over these functions.

Every function takes a *target*: a URI or path string (plain path, ``file://``,
``s3://bucket/prefix``), a job-directory `Storage`, or a `Target`. A string ending in
``chk-N`` names checkpoint N of the job directory above it, one ending in
``savepoints/NAME`` names a savepoint, anything else is a job directory (where a
checkpoint is needed, its newest retained one). Results are pydantic models, so
``result.model_dump_json()`` is the machine-readable form.

Safety: nothing here reads or deletes outside the job directory it was given (all keys go
through the storage's `check_key`), and every check runs before the first delete, so an
operation that refuses deletes nothing.
"""

from __future__ import annotations

import hashlib
import re
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict

from statehold import layout
from statehold.errors import StateholdError
from statehold.ha.base import CheckpointPointer, FencedError, HAState, HAStore, HAStoreError
from statehold.layout import Kind, Scope
from statehold.metadata import (
    CheckpointMetadata,
    MetadataError,
    StateFile,
    decode,
    encode,
    read_metadata,
    referenced_keys,
)
from statehold.registry import SharedStateRegistry
from statehold.storage import FileInfo, LocalStorage, Storage, StorageError, open_storage

TargetKind = Literal["job", "checkpoint", "savepoint"]

_CHK = re.compile(r"^chk-(\d+)$")
#: Files up to this size are hashed from memory; larger ones are streamed via a temp file.
_IN_MEMORY = 16 << 20


class ToolError(StateholdError):
    """The operation cannot be done as asked; the message says why in one line.
    `problems` lists details (e.g. each missing file) when there are several."""

    def __init__(self, message: str, problems: Iterable[Problem] = ()) -> None:
        super().__init__(message)
        self.problems = list(problems)


class NotAJobDirectoryError(ToolError):
    """The location holds no ``_ha/``, no ``chk-*/`` and no ``savepoints/``."""


class Progress(Protocol):
    """Progress reporting for long work (the CLI draws a rich progress bar)."""

    def start(self, description: str, total: int) -> None: ...

    def advance(self, amount: int) -> None: ...


class _NoProgress:
    def start(self, description: str, total: int) -> None:
        pass

    def advance(self, amount: int) -> None:
        pass


# -- results ---------------------------------------------------------------------------
class _Result(BaseModel):
    model_config = ConfigDict(frozen=True)


class Problem(_Result):
    #: The job-directory key (or URI) the problem is about.
    path: str
    problem: str


class FileRef(_Result):
    """One file a checkpoint references."""

    #: Relative to the job directory (an absolute URI for an external file).
    path: str
    scope: Scope
    size: int
    checksum: str
    operator: str
    #: Key groups start..end, inclusive.
    key_groups: tuple[int, int]
    external: bool = False
    name: str | None = None


class CheckpointSummary(_Result):
    kind: Literal["checkpoint", "savepoint"]
    #: ``chk-N`` or ``savepoints/NAME``, relative to the job directory.
    path: str
    checkpoint_id: int | None
    savepoint_name: str | None = None
    #: Listed by the HA store (savepoints: always False).
    retained: bool = False
    epoch: int | None = None
    created_at: float | None = None
    completed_at: float | None = None
    file_count: int = 0
    #: Declared sizes of every file it references (what a restore reads).
    referenced_bytes: int = 0
    #: Bytes of the files in its own directory (``_metadata`` and copies).
    directory_bytes: int = 0
    #: Why the metadata could not be read, if it could not.
    error: str | None = None


class JobListing(_Result):
    job_uri: str
    ha_epoch: int
    #: Retained checkpoints and ``chk-N`` directories not retained (``retained`` False),
    #: ascending by id.
    checkpoints: list[CheckpointSummary]
    savepoints: list[CheckpointSummary]
    problems: list[Problem]


class Inspection(_Result):
    job_uri: str
    kind: Literal["checkpoint", "savepoint"]
    metadata_path: str
    format_version: int
    job_id: str
    checkpoint_id: int
    savepoint_name: str | None
    epoch: int
    created_at: float
    completed_at: float
    max_parallelism: int
    source_position: dict[str, Any]
    lineage: dict[str, Any] | None
    retained: bool
    metadata_checksum: str
    operators: list[str]
    file_count: int
    total_bytes: int
    bytes_by_scope: dict[str, int]
    files: list[FileRef]


class VerifyReport(_Result):
    job_uri: str
    metadata_path: str
    ok: bool
    checksums: bool
    files_checked: int
    bytes_checked: int
    problems: list[Problem]


class DiffEntry(_Result):
    path: str
    scope: Scope
    size: int


class DiffReport(_Result):
    a: str
    b: str
    added: list[DiffEntry]
    removed: list[DiffEntry]
    #: Same path in both, but a different size or checksum (should never happen).
    changed: list[DiffEntry]
    unchanged_files: int
    unchanged_bytes: int
    added_bytes: int
    removed_bytes: int


class CheckpointUsage(_Result):
    kind: Literal["checkpoint", "savepoint"]
    path: str
    checkpoint_id: int | None
    savepoint_name: str | None
    retained: bool
    #: Every file it references, at full size (what a restore reads).
    referenced_bytes: int
    #: Files no other retained checkpoint or savepoint references, plus its own directory
    #: (about what disposing it frees).
    exclusive_bytes: int
    #: Its share of the files it shares with others: each shared file's bytes are split
    #: evenly (in whole bytes) among the checkpoints and savepoints referencing it.
    shared_attributed_bytes: int
    #: exclusive_bytes + shared_attributed_bytes. Summed over all entries this is exactly
    #: the referenced bytes of the job directory.
    attributed_bytes: int


class DiskUsage(_Result):
    job_uri: str
    total_files: int
    total_bytes: int
    #: Every listed byte, by where it lives: shared, exclusive, taskowned, metadata
    #: (checkpoint/savepoint directories), ha, job, spark, temp, other.
    by_scope: dict[str, int]
    by_checkpoint: list[CheckpointUsage]
    #: Bytes held by retained checkpoints and savepoints (incl. their directories).
    referenced_bytes: int
    #: Files no retained checkpoint or savepoint references (not ``_ha``/``_job``/
    #: ``_spark``/``taskowned``): orphans, leftovers of non-retained checkpoints.
    unreferenced_files: int
    unreferenced_bytes: int
    #: Up to 100 of them, for a look.
    unreferenced_sample: list[str]
    #: Referenced files that are not there.
    missing_files: int


class ExportReport(_Result):
    source: str
    dest: str
    metadata_path: str
    checkpoint_id: int
    files_copied: int
    bytes_copied: int
    ha_epoch: int
    verified: bool


class DisposeReport(_Result):
    job_uri: str
    kind: TargetKind
    path: str
    forced: bool
    dry_run: bool
    #: Keys deleted (or, with dry_run, that would be).
    deleted: list[str]
    deleted_bytes: int
    #: Files of the target kept because another checkpoint or savepoint references them.
    kept: list[str]
    #: For a retained checkpoint disposed with force: the HA store no longer lists it.
    unpublished: bool = False


# -- locating --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Target:
    """A job directory, or one checkpoint or savepoint in it."""

    job: Storage
    kind: TargetKind = "job"
    #: ``chk-N/_metadata`` or ``savepoints/NAME/_metadata``; None for a job directory.
    metadata_key: str | None = None

    @property
    def path(self) -> str:
        """``chk-N``, ``savepoints/NAME`` or '' (the job directory itself)."""
        return self.metadata_key.rsplit("/", 1)[0] if self.metadata_key else ""

    @property
    def uri(self) -> str:
        base = self.job.uri.rstrip("/")
        return f"{base}/{self.path}" if self.path else base


TargetLike = str | Storage | Target


def _ref_key(ref: int | str) -> tuple[TargetKind, str]:
    if isinstance(ref, int):
        return "checkpoint", layout.checkpoint_metadata_key(ref)
    ref = ref.strip("/")
    if ref.endswith("/" + layout.METADATA_NAME):
        ref = ref[: -len(layout.METADATA_NAME) - 1]
    m = _CHK.match(ref)
    if m:
        return "checkpoint", layout.checkpoint_metadata_key(int(m[1]))
    parts = ref.split("/")
    if len(parts) == 2 and parts[0] == layout.SAVEPOINTS_DIR:
        try:
            return "savepoint", layout.savepoint_metadata_key(parts[1])
        except ValueError as e:
            raise ToolError(str(e)) from e
    raise ToolError(f"{ref!r} names neither chk-N nor savepoints/NAME")


def locate(target: TargetLike, ref: int | str | None = None, **storage_options: Any) -> Target:
    """Resolve a URI/path (see the module docstring) or a job-directory Storage plus an
    optional `ref` (checkpoint id, ``chk-N`` or ``savepoints/NAME``) to a Target."""
    if isinstance(target, Target):
        if ref is None:
            return target
        target = target.job
    if isinstance(target, Storage):
        return Target(target) if ref is None else Target(target, *_ref_key(ref))
    uri = target.rstrip("/") or target
    if uri.endswith("/" + layout.METADATA_NAME):
        uri = uri[: -len(layout.METADATA_NAME) - 1]
    parts = uri.rsplit("/", 2)
    job_uri: str = uri
    kind: TargetKind = "job"
    key: str | None = None
    if _CHK.match(parts[-1]):
        job_uri = _parent(uri, 1)
        kind, key = "checkpoint", layout.checkpoint_metadata_key(int(parts[-1][4:]))
    elif len(parts) == 3 and parts[1] == layout.SAVEPOINTS_DIR:
        job_uri = _parent(uri, 2)
        try:
            key = layout.savepoint_metadata_key(parts[2])
        except ValueError as e:
            raise ToolError(str(e)) from e
        kind = "savepoint"
    if ref is not None:
        if key is not None:
            raise ToolError(f"{target} already names a checkpoint; give no other")
        kind, key = _ref_key(ref)
    try:
        storage = open_storage(job_uri, **storage_options)
    except (StorageError, ValueError) as e:
        raise ToolError(f"{target}: cannot open: {e}") from e
    return Target(storage, kind, key)


def _parent(uri: str, levels: int) -> str:
    """`uri` without its last `levels` segments ('.' or '/' for a bare local path)."""
    head = uri
    for _ in range(levels):
        head = head.rsplit("/", 1)[0] if "/" in head else ""
    if head.endswith(":/"):  # s3://bucket/chk-1 has the bucket as its job directory
        raise ToolError(f"{uri}: no job directory above it")
    if head == "":
        return "/" if uri.startswith("/") else "."
    return head


def _ha(job: Storage, ha: HAStore | None) -> HAStore:
    if ha is not None:
        return ha
    from statehold.ha.embedded import EmbeddedHAStore

    return EmbeddedHAStore(job)


def _ha_state(job: Storage, ha: HAStore | None) -> HAState:
    try:
        return _ha(job, ha).read()
    except HAStoreError as e:
        raise ToolError(f"cannot read the HA store: {e}") from e


def _listing(job: Storage) -> list[FileInfo]:
    try:
        return list(job.list())
    except StorageError as e:
        raise ToolError(f"{job.uri}: cannot list: {e}") from e


def _require_job_dir(job: Storage, files: list[FileInfo]) -> None:
    """Refuse a location that is not a job directory (before anything reads or deletes)."""
    if isinstance(job, LocalStorage) and not job.root.is_dir():
        raise NotAJobDirectoryError(f"{job.uri}: no such directory")
    for info in files:
        kind = layout.parse(info.key).kind if _safe(info.key) else Kind.UNKNOWN
        if kind in (Kind.HA, Kind.CHECKPOINT_METADATA, Kind.SAVEPOINT_METADATA) or (
            kind is Kind.CHECKPOINT_OTHER
        ):
            return
    raise NotAJobDirectoryError(
        f"{job.uri}: not a statehold job directory (no _ha/, no chk-*/, no savepoints/)"
    )


def require_job_dir(job: Storage) -> None:
    """Refuse (NotAJobDirectoryError) a location that is not a statehold job directory."""
    _require_job_dir(job, _listing(job))


def _safe(key: str) -> bool:
    try:
        layout.parse(key)
    except ValueError:
        return False
    return True


def _newest_retained(job: Storage, ha: HAStore | None) -> Target:
    state = _ha_state(job, ha)
    if state.latest is None:
        _require_job_dir(job, _listing(job))
        raise ToolError(f"{job.uri}: the HA store lists no retained checkpoint")
    return Target(job, "checkpoint", state.latest.metadata)


def resolve_checkpoint(
    target: TargetLike, *, ha: HAStore | None = None, **storage_options: Any
) -> Target:
    """A Target naming one checkpoint or savepoint (a job directory: its newest retained
    checkpoint)."""
    t = locate(target, **storage_options)
    if t.metadata_key is None:
        return _newest_retained(t.job, ha)
    return t


def _read(t: Target) -> CheckpointMetadata:
    assert t.metadata_key is not None
    if not t.job.exists(t.metadata_key):
        if isinstance(t.job, LocalStorage) and not t.job.root.is_dir():
            raise NotAJobDirectoryError(f"{t.job.uri}: no such directory")
        raise ToolError(f"{t.uri}: no such checkpoint ({layout.METADATA_NAME} missing)")
    meta = read_metadata(t.job, t.metadata_key)
    _check_identity(t, meta)
    return meta


def _check_identity(t: Target, meta: CheckpointMetadata) -> None:
    info = layout.parse(t.metadata_key or "")
    if info.kind is Kind.CHECKPOINT_METADATA and meta.checkpoint_id != info.checkpoint_id:
        raise MetadataError(
            f"{t.uri}: holds checkpoint {meta.checkpoint_id}, not the one its directory names"
        )
    if info.kind is Kind.SAVEPOINT_METADATA and meta.kind == "checkpoint":
        raise MetadataError(f"{t.uri}: holds a checkpoint, not a savepoint")


def _kind(metadata_key: str) -> Literal["checkpoint", "savepoint"]:
    return "savepoint" if metadata_key.startswith(layout.SAVEPOINTS_DIR + "/") else "checkpoint"


def _file_refs(meta: CheckpointMetadata, metadata_key: str) -> list[FileRef]:
    refs = []
    for op, kg, f in meta.state_files():
        path = f.path if f.external else layout.resolve(metadata_key, f.path)
        refs.append(
            FileRef(
                path=path,
                scope=f.scope,
                size=f.size,
                checksum=f.checksum,
                operator=op,
                key_groups=(kg.key_groups.start, kg.key_groups.end),
                external=f.external,
                name=f.name,
            )
        )
    return refs


def _savepoint_keys(files: Iterable[FileInfo]) -> list[str]:
    return sorted(
        i.key
        for i in files
        if _safe(i.key) and layout.parse(i.key).kind is Kind.SAVEPOINT_METADATA
    )


# -- list ------------------------------------------------------------------------------
def list_checkpoints(
    target: TargetLike, *, ha: HAStore | None = None, **storage_options: Any
) -> JobListing:
    """Retained checkpoints (HA store), ``chk-N`` directories not retained, savepoints.
    Unreadable metadata is reported per entry and in `problems`, not raised."""
    job = locate(target, **storage_options).job
    files = _listing(job)
    _require_job_dir(job, files)
    state = _ha_state(job, ha)
    dir_bytes: dict[str, int] = {}
    chk_ids: set[int] = set()
    for info in files:
        if not _safe(info.key):
            continue
        p = layout.parse(info.key)
        if p.kind in (Kind.CHECKPOINT_METADATA, Kind.CHECKPOINT_OTHER):
            assert p.checkpoint_id is not None
            chk_ids.add(p.checkpoint_id)
            d = layout.checkpoint_dir(p.checkpoint_id)
            dir_bytes[d] = dir_bytes.get(d, 0) + info.size
        elif p.kind in (Kind.SAVEPOINT_METADATA, Kind.SAVEPOINT_OTHER):
            assert p.savepoint is not None
            d = f"{layout.SAVEPOINTS_DIR}/{p.savepoint}"
            dir_bytes[d] = dir_bytes.get(d, 0) + info.size
    retained = {p.metadata: p for p in state.retained}
    problems: list[Problem] = []

    def summary(key: str, retained_flag: bool) -> CheckpointSummary:
        d = key.rsplit("/", 1)[0]
        kind = _kind(key)
        p = layout.parse(key)
        base: dict[str, Any] = {
            "kind": kind,
            "path": d,
            "checkpoint_id": p.checkpoint_id,
            "savepoint_name": p.savepoint,
            "retained": retained_flag,
            "directory_bytes": dir_bytes.get(d, 0),
        }
        try:
            meta = _read(Target(job, kind, key))
        except (ToolError, MetadataError, StorageError) as e:
            problems.append(Problem(path=key, problem=_one_line(e)))
            return CheckpointSummary(**base, error=_one_line(e))
        return CheckpointSummary(
            **{**base, "checkpoint_id": meta.checkpoint_id},
            epoch=meta.epoch,
            created_at=meta.created_at,
            completed_at=meta.completed_at,
            file_count=len({f.path for f in _file_refs(meta, key)}),
            referenced_bytes=_unique_bytes(_file_refs(meta, key)),
        )

    checkpoints = [summary(k, True) for k in retained]
    for n in sorted(chk_ids):
        key = layout.checkpoint_metadata_key(n)
        if key not in retained:
            checkpoints.append(summary(key, False))
    checkpoints.sort(key=lambda c: (c.checkpoint_id or 0, not c.retained))
    savepoints = [summary(k, False) for k in _savepoint_keys(files)]
    return JobListing(
        job_uri=job.uri,
        ha_epoch=state.epoch,
        checkpoints=checkpoints,
        savepoints=savepoints,
        problems=problems,
    )


def _unique_bytes(refs: Iterable[FileRef]) -> int:
    return sum({r.path: r.size for r in refs}.values())


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


# -- inspect ---------------------------------------------------------------------------
def inspect(target: TargetLike, *, ha: HAStore | None = None, **storage_options: Any) -> Inspection:
    """Header fields and every referenced file of one checkpoint or savepoint."""
    t = resolve_checkpoint(target, ha=ha, **storage_options)
    meta = _read(t)
    assert t.metadata_key is not None
    refs = _file_refs(meta, t.metadata_key)
    by_scope: dict[str, int] = {}
    for path, r in {r.path: r for r in refs}.items():
        del path
        by_scope[r.scope.value] = by_scope.get(r.scope.value, 0) + r.size
    retained = any(p.metadata == t.metadata_key for p in _ha_state(t.job, ha).retained)
    return Inspection(
        job_uri=t.job.uri,
        kind=_kind(t.metadata_key),
        metadata_path=t.metadata_key,
        format_version=meta.version,
        job_id=meta.job_id,
        checkpoint_id=meta.checkpoint_id,
        savepoint_name=meta.savepoint_name,
        epoch=meta.epoch,
        created_at=meta.created_at,
        completed_at=meta.completed_at,
        max_parallelism=meta.max_parallelism,
        source_position=meta.source_position,
        lineage=meta.lineage.model_dump(mode="json") if meta.lineage else None,
        retained=retained,
        metadata_checksum=meta.checksum,
        operators=[op.operator for op in meta.operators],
        file_count=len({r.path for r in refs}),
        total_bytes=_unique_bytes(refs),
        bytes_by_scope=by_scope,
        files=refs,
    )


# -- verify ----------------------------------------------------------------------------
def sha256_of(storage: Storage, key: str, size_hint: int | None = None) -> str:
    """``sha256:<hex>`` of a stored file, streaming large files through a temp file."""
    h = hashlib.sha256()
    if isinstance(storage, LocalStorage):
        path = storage.root / key
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                h.update(block)
    elif size_hint is not None and size_hint <= _IN_MEMORY:
        h.update(storage.read(key))
    else:
        with tempfile.TemporaryDirectory(prefix="statehold-verify-") as tmp:
            local = Path(tmp) / "data"
            storage.download(key, local)
            with open(local, "rb") as f:
                while block := f.read(1 << 20):
                    h.update(block)
    return "sha256:" + h.hexdigest()


def verify(
    target: TargetLike,
    *,
    checksums: bool = True,
    progress: Progress | None = None,
    ha: HAStore | None = None,
    **storage_options: Any,
) -> VerifyReport:
    """Every referenced file inside the job directory, present, of the right size and
    (with `checksums`) content. Problems are reported, never raised; a location that is
    not a job directory or names no checkpoint raises ToolError."""
    t = resolve_checkpoint(target, ha=ha, **storage_options)
    assert t.metadata_key is not None
    progress = progress or _NoProgress()
    problems: list[Problem] = []

    def report(checked: int = 0, nbytes: int = 0) -> VerifyReport:
        return VerifyReport(
            job_uri=t.job.uri,
            metadata_path=t.metadata_key or "",
            ok=not problems,
            checksums=checksums,
            files_checked=checked,
            bytes_checked=nbytes,
            problems=problems,
        )

    try:
        meta = _read(t)
    except MetadataError as e:
        problems.append(Problem(path=t.metadata_key, problem=_one_line(e)))
        return report()
    for ptr in _ha_state(t.job, ha).retained:
        if ptr.metadata == t.metadata_key and ptr.checksum and ptr.checksum != meta.checksum:
            problems.append(
                Problem(path=t.metadata_key, problem="does not match the HA store's pointer")
            )
    expected: dict[str, StateFile] = {}
    for _op, _kg, f in meta.state_files():
        if f.external:
            problems.append(Problem(path=f.path, problem="outside the job directory (external)"))
            continue
        key = layout.resolve(t.metadata_key, f.path)
        seen = expected.setdefault(key, f)
        if (seen.size, seen.checksum) != (f.size, f.checksum):
            problems.append(Problem(path=key, problem="referenced twice with different contents"))
    progress.start(f"verify {t.path}", sum(f.size for f in expected.values()))
    checked = nbytes = 0
    for key, f in sorted(expected.items()):
        try:
            info = t.job.stat(key)
            if info is None:
                problems.append(Problem(path=key, problem="missing"))
            elif info.size != f.size:
                problems.append(
                    Problem(path=key, problem=f"size {info.size}, metadata says {f.size}")
                )
            elif checksums and sha256_of(t.job, key, info.size) != f.checksum:
                problems.append(Problem(path=key, problem="checksum mismatch"))
            else:
                checked += 1
                nbytes += f.size
        except (StorageError, OSError) as e:
            problems.append(Problem(path=key, problem=f"unreadable: {_one_line(e)}"))
        progress.advance(f.size)
    return report(checked, nbytes)


# -- diff ------------------------------------------------------------------------------
def diff(
    a: TargetLike, b: TargetLike, *, ha: HAStore | None = None, **storage_options: Any
) -> DiffReport:
    """Files (by path relative to their job directory) in `b` and not `a` (added) and in
    `a` and not `b` (removed)."""
    ta = resolve_checkpoint(a, ha=ha, **storage_options)
    tb = resolve_checkpoint(b, ha=ha, **storage_options)
    assert ta.metadata_key is not None and tb.metadata_key is not None
    fa = {r.path: r for r in _file_refs(_read(ta), ta.metadata_key)}
    fb = {r.path: r for r in _file_refs(_read(tb), tb.metadata_key)}

    def entries(keys: Iterable[str], files: Mapping[str, FileRef]) -> list[DiffEntry]:
        return [
            DiffEntry(path=k, scope=files[k].scope, size=files[k].size) for k in sorted(keys)
        ]

    added = entries(fb.keys() - fa.keys(), fb)
    removed = entries(fa.keys() - fb.keys(), fa)
    common = fa.keys() & fb.keys()
    changed = [k for k in common if (fa[k].size, fa[k].checksum) != (fb[k].size, fb[k].checksum)]
    same = common - set(changed)
    return DiffReport(
        a=ta.uri,
        b=tb.uri,
        added=added,
        removed=removed,
        changed=entries(changed, fb),
        unchanged_files=len(same),
        unchanged_bytes=sum(fb[k].size for k in same),
        added_bytes=sum(e.size for e in added),
        removed_bytes=sum(e.size for e in removed),
    )


# -- registry of holders ---------------------------------------------------------------
@dataclass
class _Holders:
    """The retained checkpoints and savepoints of a job directory, read and verified."""

    state: HAState
    documents: dict[str, CheckpointMetadata]  # metadata key -> document
    registry: SharedStateRegistry


def _holders(
    job: Storage,
    files: list[FileInfo],
    ha: HAStore | None,
    *,
    skip: str | None = None,
) -> _Holders:
    """Read every retained checkpoint's and savepoint's metadata (all must verify: a
    registry missing a holder would let files it needs be deleted), except `skip`."""
    state = _ha_state(job, ha)
    keys = [p.metadata for p in state.retained] + _savepoint_keys(files)
    docs: dict[str, CheckpointMetadata] = {}
    for key in dict.fromkeys(keys):
        if key == skip:
            continue
        try:
            docs[key] = _read(Target(job, _kind(key), key))
        except (ToolError, MetadataError) as e:
            raise ToolError(
                f"cannot tell which files are still needed: {_one_line(e)}",
                [Problem(path=key, problem=_one_line(e))],
            ) from e
    try:
        registry = SharedStateRegistry.from_metadata(docs.items())
    except (MetadataError, ValueError) as e:
        raise ToolError(f"cannot tell which files are still needed: {_one_line(e)}") from e
    return _Holders(state, docs, registry)


# -- du --------------------------------------------------------------------------------
_SCOPE_OF_KIND = {
    Kind.SHARED: "shared",
    Kind.EXCLUSIVE: "exclusive",
    Kind.TASKOWNED: "taskowned",
    Kind.CHECKPOINT_METADATA: "metadata",
    Kind.CHECKPOINT_OTHER: "metadata",
    Kind.SAVEPOINT_METADATA: "metadata",
    Kind.SAVEPOINT_OTHER: "metadata",
    Kind.HA: "ha",
    Kind.JOB: "job",
    Kind.SPARK: "spark",
    Kind.TEMP: "temp",
    Kind.UNKNOWN: "other",
}
#: Never counted as unreferenced: they are not checkpoint files.
_NOT_CHECKPOINT_FILES = {Kind.HA, Kind.JOB, Kind.SPARK, Kind.TASKOWNED}


def du(target: TargetLike, *, ha: HAStore | None = None, **storage_options: Any) -> DiskUsage:
    """Bytes by scope and by checkpoint, and unreferenced bytes.

    Attribution: a file referenced by one retained checkpoint or savepoint (and every file
    in its own directory) counts fully to it (`exclusive_bytes`); a file referenced by k
    of them is split evenly among the k (`shared_attributed_bytes`; the remainder bytes go
    to the oldest holders), so the attributed bytes add up to the referenced total.
    ``chk-N`` directories not retained are not holders: their bytes are unreferenced."""
    job = locate(target, **storage_options).job
    files = _listing(job)
    _require_job_dir(job, files)
    holders = _holders(job, files, ha)
    sizes = {i.key: i.size for i in files}
    retained = {p.metadata for p in holders.state.retained}
    by_scope: dict[str, int] = {}
    for info in files:
        kind = layout.parse(info.key).kind if _safe(info.key) else Kind.UNKNOWN
        scope = _SCOPE_OF_KIND[kind]
        by_scope[scope] = by_scope.get(scope, 0) + info.size
    order = sorted(holders.documents, key=lambda k: (_kind(k) == "savepoint", _sort_id(k)))
    exclusive = dict.fromkeys(order, 0)
    shared = dict.fromkeys(order, 0)
    referenced_total = dict.fromkeys(order, 0)
    owned: set[str] = set()
    missing = 0
    holders_of: dict[str, list[str]] = {}
    for mkey in order:  # in `order`, so each file's holders are oldest first
        for key in referenced_keys(holders.documents[mkey], mkey):
            holders_of.setdefault(key, []).append(mkey)
    for key, owners in holders_of.items():
        size = sizes.get(key)
        if size is None:
            missing += 1
            continue
        owned.add(key)
        for o in owners:
            referenced_total[o] += size
        if len(owners) == 1:
            exclusive[owners[0]] += size
        else:
            share, rest = divmod(size, len(owners))
            for i, o in enumerate(owners):
                shared[o] += share + (1 if i < rest else 0)
    for mkey in order:  # each holder's own directory (its _metadata, savepoint copies)
        prefix = mkey.rsplit("/", 1)[0] + "/"
        for info in files:
            if info.key.startswith(prefix) and info.key not in owned:
                owned.add(info.key)
                exclusive[mkey] += info.size
    unreferenced = sorted(
        i.key
        for i in files
        if i.key not in owned
        and not (_safe(i.key) and layout.parse(i.key).kind in _NOT_CHECKPOINT_FILES)
    )
    usage = [
        CheckpointUsage(
            kind=_kind(k),
            path=k.rsplit("/", 1)[0],
            checkpoint_id=holders.documents[k].checkpoint_id,
            savepoint_name=layout.parse(k).savepoint,
            retained=k in retained,
            referenced_bytes=referenced_total[k],
            exclusive_bytes=exclusive[k],
            shared_attributed_bytes=shared[k],
            attributed_bytes=exclusive[k] + shared[k],
        )
        for k in order
    ]
    return DiskUsage(
        job_uri=job.uri,
        total_files=len(files),
        total_bytes=sum(sizes.values()),
        by_scope=by_scope,
        by_checkpoint=usage,
        referenced_bytes=sum(sizes[k] for k in owned),
        unreferenced_files=len(unreferenced),
        unreferenced_bytes=sum(sizes[k] for k in unreferenced),
        unreferenced_sample=unreferenced[:100],
        missing_files=missing,
    )


def _sort_id(metadata_key: str) -> tuple[int, str]:
    p = layout.parse(metadata_key)
    return (p.checkpoint_id or 0, p.savepoint or "")


# -- export ----------------------------------------------------------------------------
def _export_key(key: str, scope: Scope) -> str:
    """Where a referenced file goes in the exported job directory: the same key for files
    in shared/, exclusive/, taskowned/; files kept in a checkpoint's or savepoint's own
    directory (savepoint copies) move to the directory of their scope."""
    if layout.parse(key).kind in (Kind.SHARED, Kind.EXCLUSIVE, Kind.TASKOWNED):
        return key
    directory = {
        Scope.SHARED: layout.SHARED_DIR,
        Scope.EXCLUSIVE: layout.EXCLUSIVE_DIR,
        Scope.TASKOWNED: layout.TASKOWNED_DIR,
    }[scope]
    return f"{directory}/{key.rsplit('/', 1)[-1]}"


def export(
    source: TargetLike,
    dest: str | Storage,
    *,
    progress: Progress | None = None,
    verify_after: bool = True,
    ha: HAStore | None = None,
    dest_options: Mapping[str, Any] | None = None,
    **storage_options: Any,
) -> ExportReport:
    """Write a minimal self-contained job directory at `dest` (which must be empty) with
    only what `source` needs: its files (copied with `Storage.copy`: hard link or
    server-side where possible, streamed across backends), its ``_metadata`` as
    ``chk-N/_metadata`` with paths relative to the new place, and an embedded HA store
    that retains it, with an epoch at least the checkpoint's, so the next attempt's epoch
    is above every file's. The source is only read."""
    t = resolve_checkpoint(source, ha=ha, **storage_options)
    assert t.metadata_key is not None
    meta = _read(t)
    problems = [
        Problem(path=f.path, problem="outside the job directory (external); not exportable")
        for _op, _kg, f in meta.state_files()
        if f.external
    ]
    files = referenced_keys(meta, t.metadata_key)
    for key, f in sorted(files.items()):
        info = t.job.stat(key)
        if info is None:
            problems.append(Problem(path=key, problem="missing"))
        elif info.size != f.size:
            problems.append(Problem(path=key, problem=f"size {info.size}, metadata says {f.size}"))
    if problems:
        raise ToolError(
            f"cannot export {t.uri}: {len(problems)} problem(s), first: "
            f"{problems[0].path}: {problems[0].problem}",
            problems,
        )
    if isinstance(dest, Storage):
        out = dest
    else:
        try:
            out = open_storage(dest, **dict(dest_options or {}))
        except (StorageError, ValueError) as e:
            raise ToolError(f"{dest}: cannot open: {e}") from e
    src_uri, dst_uri = t.job.uri.rstrip("/") + "/", out.uri.rstrip("/") + "/"
    if dst_uri.startswith(src_uri) or src_uri.startswith(dst_uri):
        raise ToolError(f"{out.uri}: the destination must not overlap the source job directory")
    try:
        not_empty = next(iter(out.list_pages("", page_size=1)), [])
    except StorageError as e:
        raise ToolError(f"{out.uri}: cannot list: {e}") from e
    if not_empty:
        raise ToolError(f"{out.uri}: the destination is not empty")

    new_metadata_key = layout.checkpoint_metadata_key(meta.checkpoint_id)
    mapping: dict[str, str] = {}
    for key, f in files.items():
        mapping[key] = _export_key(key, f.scope)
    if len(set(mapping.values())) != len(mapping):
        raise ToolError(f"cannot export {t.uri}: two referenced files would share a name")
    operators = [
        op.model_copy(
            update={
                "ranges": [
                    kg.model_copy(
                        update={
                            "files": [
                                f.model_copy(
                                    update={
                                        "path": layout.relativize(
                                            new_metadata_key,
                                            mapping[layout.resolve(t.metadata_key, f.path)],
                                        )
                                    }
                                )
                                for f in kg.files
                            ]
                        }
                    )
                    for kg in op.ranges
                ]
            }
        )
        for op in meta.operators
    ]
    new_meta = meta.model_copy(
        update={"kind": "checkpoint", "savepoint_name": None, "operators": operators}
    )
    data = encode(new_meta, new_metadata_key)
    new_meta = decode(data, new_metadata_key)

    progress = progress or _NoProgress()
    progress.start(f"export {t.path}", sum(f.size for f in files.values()))
    copied = 0
    for key, f in sorted(files.items()):
        try:
            t.job.copy(key, mapping[key], target=out)
        except StorageError as e:
            raise ToolError(f"copying {key} to {out.uri} failed: {_one_line(e)}") from e
        copied += f.size
        progress.advance(f.size)
    out.create_if_absent(new_metadata_key, data)
    from statehold.ha.embedded import EmbeddedHAStore

    dest_ha = EmbeddedHAStore(out)
    state = dest_ha.claim_epoch()
    while state.epoch < new_meta.epoch:
        state = dest_ha.claim_epoch()
    pointer = CheckpointPointer(
        new_meta.checkpoint_id, new_metadata_key, new_meta.epoch, new_meta.checksum
    )
    state = dest_ha.publish(state.epoch, [pointer])
    verified = False
    if verify_after:
        check = verify(Target(out, "checkpoint", new_metadata_key), ha=dest_ha)
        if not check.ok:
            p = check.problems[0]
            raise ToolError(
                f"exported {out.uri} does not verify: {p.path}: {p.problem}", check.problems
            )
        verified = True
    return ExportReport(
        source=t.uri,
        dest=out.uri,
        metadata_path=new_metadata_key,
        checkpoint_id=new_meta.checkpoint_id,
        files_copied=len(files),
        bytes_copied=copied,
        ha_epoch=state.epoch,
        verified=verified,
    )


# -- dispose ---------------------------------------------------------------------------
def dispose(
    target: TargetLike,
    *,
    force: bool = False,
    dry_run: bool = False,
    ha: HAStore | None = None,
    **storage_options: Any,
) -> DisposeReport:
    """Delete a checkpoint, a savepoint or a whole job directory.

    Refused (ToolError, nothing deleted) without `force`: a retained checkpoint, a job
    directory that still has retained checkpoints or savepoints. Always refused: a
    checkpoint or savepoint whose metadata (or any retained checkpoint's or savepoint's
    metadata) cannot be verified. Even with `force`, a checkpoint's or
    savepoint's files that another retained checkpoint or savepoint references are kept
    (decided by the shared-state registry rebuilt from all their metadata), and a
    location that is not a job directory is never touched."""
    t = locate(target, **storage_options)
    job = t.job
    files = _listing(job)
    _require_job_dir(job, files)
    sizes = {i.key: i.size for i in files}
    if t.metadata_key is None:
        return _dispose_job(job, files, force=force, dry_run=dry_run, ha=ha)
    key = t.metadata_key
    directory = t.path
    state = _ha_state(job, ha)
    retained_here = any(p.metadata == key for p in state.retained)
    if retained_here and not force:
        raise ToolError(
            f"{t.uri} is a retained checkpoint (the job may restore from it); "
            "use --force to dispose it anyway"
        )
    if not any(k.startswith(directory + "/") for k in sizes) and not retained_here:
        raise ToolError(f"{t.uri}: no such {t.kind}")
    try:
        own = _read(t)
    except MetadataError as e:
        # Even forced: what it references is unknown, so what it frees is too (gc finds
        # the leftovers of a damaged checkpoint that is not retained).
        raise ToolError(f"cannot dispose: {_one_line(e)}") from e
    holders = _holders(job, files, ha, skip=key)
    others = holders.registry.referenced()
    own_files = referenced_keys(own, key)
    deleted = sorted(
        k
        for k, f in own_files.items()
        if k not in others and f.scope is not Scope.TASKOWNED and k in sizes
    )
    kept = sorted(k for k in own_files if k in others)
    in_dir = sorted(k for k in sizes if k.startswith(directory + "/") and k not in others)
    deleted = sorted(set(deleted) | set(in_dir))
    report = DisposeReport(
        job_uri=job.uri,
        kind=t.kind,
        path=directory,
        forced=force,
        dry_run=dry_run,
        deleted=deleted,
        deleted_bytes=sum(sizes[k] for k in deleted),
        kept=kept,
        unpublished=retained_here,
    )
    if dry_run:
        return report
    if retained_here:
        remaining = [p for p in state.retained if p.metadata != key]
        try:
            _ha(job, ha).publish(state.epoch, remaining)
        except (FencedError, HAStoreError, ValueError) as e:
            raise ToolError(f"cannot remove {t.path} from the HA store: {_one_line(e)}") from e
    # the _metadata first: from then on nothing can mistake the rest for a checkpoint
    whole_dir = not any(k.startswith(directory + "/") for k in others)
    try:
        job.delete_many([k for k in deleted if k == key])
        job.delete_many(
            k for k in deleted if k != key and not (whole_dir and k.startswith(directory + "/"))
        )
        if whole_dir:
            job.delete_prefix(directory)
    except StorageError as e:
        raise ToolError(f"deleting from {job.uri} failed: {_one_line(e)}") from e
    return report


def _dispose_job(
    job: Storage, files: list[FileInfo], *, force: bool, dry_run: bool, ha: HAStore | None
) -> DisposeReport:
    state = _ha_state(job, ha)
    savepoints = _savepoint_keys(files)
    if (state.retained or savepoints) and not force:
        raise ToolError(
            f"{job.uri} has {len(state.retained)} retained checkpoint(s) and "
            f"{len(savepoints)} savepoint(s); use --force to dispose the whole job directory"
        )
    keys = sorted(i.key for i in files)
    report = DisposeReport(
        job_uri=job.uri,
        kind="job",
        path="",
        forced=force,
        dry_run=dry_run,
        deleted=keys,
        deleted_bytes=sum(i.size for i in files),
        kept=[],
    )
    if dry_run:
        return report
    try:
        # HA pointers first, so no attempt restores from a half-deleted checkpoint.
        job.delete_prefix(layout.HA_DIR)
        job.delete_prefix("")
    except StorageError as e:
        raise ToolError(f"deleting {job.uri} failed: {_one_line(e)}") from e
    return report


__all__ = [
    "CheckpointSummary",
    "CheckpointUsage",
    "DiffEntry",
    "DiffReport",
    "DiskUsage",
    "DisposeReport",
    "ExportReport",
    "FileRef",
    "Inspection",
    "JobListing",
    "NotAJobDirectoryError",
    "require_job_dir",
    "Problem",
    "Progress",
    "Target",
    "ToolError",
    "VerifyReport",
    "diff",
    "dispose",
    "du",
    "export",
    "inspect",
    "list_checkpoints",
    "locate",
    "resolve_checkpoint",
    "sha256_of",
    "verify",
]
