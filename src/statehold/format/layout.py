"""The job directory layout: where each kind of file lives and what its name says.

    <checkpoint-root>/<job-id>/
        shared/e<epoch>-c<checkpoint>-<unique>       incremental files, many checkpoints
        exclusive/e<epoch>-c<checkpoint>-<unique>    files of exactly one checkpoint
        taskowned/...                                 the tasks' own; never cleaned here
        chk-<N>/_metadata                             checkpoint N, written last
        savepoints/<name>/_metadata                   never deleted by statehold
        _ha/                                          embedded HA pointer documents
        _job/                                         job result entry and running lease
        _spark/                                       Spark's own streaming checkpoint

Invariant: every data file's name carries the epoch and checkpoint id that created it, so
a listing alone tells which attempt wrote a file and whether it can still be live.
All keys here are relative to the job directory.
"""

from __future__ import annotations

import functools
import posixpath
import re
import uuid
from dataclasses import dataclass
from enum import StrEnum

from statehold.errors import InvalidArgumentError
from statehold.storage.base import UnsafePathError, check_key

SHARED_DIR = "shared"
EXCLUSIVE_DIR = "exclusive"
TASKOWNED_DIR = "taskowned"
SAVEPOINTS_DIR = "savepoints"
HA_DIR = "_ha"
JOB_DIR = "_job"
SPARK_DIR = "_spark"
METADATA_NAME = "_metadata"
TEMP_MARKER = ".tmp-"

# ASCII digits only: `\d` alone also matches other scripts' digits, which int() reads, so
# a crafted ``chk-١٢`` would alias checkpoint 12
_DATA_NAME = re.compile(r"^e(?P<epoch>\d+)-c(?P<ckpt>\d+)-(?P<unique>[A-Za-z0-9._-]+)$", re.ASCII)
_CHK_DIR = re.compile(r"^chk-(?P<ckpt>\d+)$", re.ASCII)
_SAVEPOINT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class Scope(StrEnum):
    """Who owns a state file, and so who may delete it."""

    SHARED = "shared"  # may be referenced by several checkpoints; reference counted
    EXCLUSIVE = "exclusive"  # belongs to exactly one checkpoint
    TASKOWNED = "taskowned"  # the task manages it; the checkpoint cleaner never deletes it


class Kind(StrEnum):
    """What a key in the job directory is."""

    SHARED = "shared"
    EXCLUSIVE = "exclusive"
    TASKOWNED = "taskowned"
    CHECKPOINT_METADATA = "checkpoint-metadata"
    CHECKPOINT_OTHER = "checkpoint-other"  # anything else under chk-N/
    SAVEPOINT_METADATA = "savepoint-metadata"
    SAVEPOINT_OTHER = "savepoint-other"
    HA = "ha"
    JOB = "job"
    SPARK = "spark"
    TEMP = "temp"  # an interrupted atomic write
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class PathInfo:
    key: str
    kind: Kind
    epoch: int | None = None
    checkpoint_id: int | None = None
    savepoint: str | None = None

    @property
    def scope(self) -> Scope | None:
        return {
            Kind.SHARED: Scope.SHARED,
            Kind.EXCLUSIVE: Scope.EXCLUSIVE,
            Kind.TASKOWNED: Scope.TASKOWNED,
        }.get(self.kind)


def data_file_name(epoch: int, checkpoint_id: int, hint: str = "") -> str:
    """A fresh data file name: epoch, checkpoint id, then a unique part (plus a hint such
    as the task's key-group range or the local file name, for people reading listings)."""
    if epoch < 0 or checkpoint_id < 0:
        raise InvalidArgumentError("epoch and checkpoint id must be non-negative")
    hint = re.sub(r"[^A-Za-z0-9._-]", "_", hint)
    while TEMP_MARKER in hint:  # else parse() would call a live data file a temp file
        hint = hint.replace(TEMP_MARKER, "_tmp-")
    hint = hint[:80]
    unique = uuid.uuid4().hex[:16] + (f"-{hint}" if hint else "")
    return f"e{epoch}-c{checkpoint_id}-{unique}"


def shared_key(epoch: int, checkpoint_id: int, hint: str = "") -> str:
    return f"{SHARED_DIR}/{data_file_name(epoch, checkpoint_id, hint)}"


def exclusive_key(epoch: int, checkpoint_id: int, hint: str = "") -> str:
    return f"{EXCLUSIVE_DIR}/{data_file_name(epoch, checkpoint_id, hint)}"


def checkpoint_dir(checkpoint_id: int) -> str:
    return f"chk-{checkpoint_id}"


def checkpoint_metadata_key(checkpoint_id: int) -> str:
    return f"{checkpoint_dir(checkpoint_id)}/{METADATA_NAME}"


def check_savepoint_name(name: str) -> str:
    if not _SAVEPOINT_NAME.match(name) or name in (".", ".."):
        raise InvalidArgumentError(
            f"bad savepoint name {name!r}: use letters, digits, '.', '_', '-' (max 128)"
        )
    return name


def savepoint_dir(name: str) -> str:
    return f"{SAVEPOINTS_DIR}/{check_savepoint_name(name)}"


def savepoint_metadata_key(name: str) -> str:
    return f"{savepoint_dir(name)}/{METADATA_NAME}"


_SPECIAL = {HA_DIR: Kind.HA, JOB_DIR: Kind.JOB, SPARK_DIR: Kind.SPARK}


@functools.lru_cache(maxsize=8192)
def parse(key: str) -> PathInfo:
    """Tell what `key` (relative to the job directory) is. Raises UnsafePathError for any
    path that is absolute or leaves the job directory. Cached (a pure function of the
    key, its result immutable): a gc parses each listed key again when the cleaner
    checks it, moments after the policy judged it."""
    check_key(key)
    parts = key.split("/")
    top, name = parts[0], parts[-1]
    if top in _SPECIAL and len(parts) >= 2:
        return PathInfo(key, _SPECIAL[top])  # their owners manage their own temp files
    if TEMP_MARKER in name:
        # ".<final name>.tmp-<unique>": the final name still tells epoch and checkpoint
        final = _DATA_NAME.match(name.lstrip(".").split(TEMP_MARKER, 1)[0])
        chk_dir = _CHK_DIR.match(top)
        return PathInfo(
            key,
            Kind.TEMP,
            int(final["epoch"]) if final else None,
            int(final["ckpt"]) if final else int(chk_dir["ckpt"]) if chk_dir else None,
        )
    if top in (SHARED_DIR, EXCLUSIVE_DIR, TASKOWNED_DIR):
        kind = Kind(top)
        m = _DATA_NAME.match(name) if len(parts) == 2 else None
        if m:
            return PathInfo(key, kind, int(m["epoch"]), int(m["ckpt"]))
        if kind is Kind.TASKOWNED:
            return PathInfo(key, kind)
        return PathInfo(key, Kind.UNKNOWN)
    chk = _CHK_DIR.match(top)
    if chk:
        ckpt = int(chk["ckpt"])
        if len(parts) == 2 and name == METADATA_NAME:
            return PathInfo(key, Kind.CHECKPOINT_METADATA, checkpoint_id=ckpt)
        return PathInfo(key, Kind.CHECKPOINT_OTHER, checkpoint_id=ckpt)
    if top == SAVEPOINTS_DIR and len(parts) >= 3:
        sp = parts[1]
        kind = Kind.SAVEPOINT_METADATA if len(parts) == 3 and name == METADATA_NAME else (
            Kind.SAVEPOINT_OTHER
        )
        return PathInfo(key, kind, savepoint=sp)
    return PathInfo(key, Kind.UNKNOWN)


def resolve(metadata_key: str, relative_path: str) -> str:
    """The job-directory key of a path written relative to a `_metadata` file.

    Refuses absolute paths and any path that leaves the job directory."""
    check_key(metadata_key)
    if relative_path.startswith("/") or "://" in relative_path or "\\" in relative_path:
        raise UnsafePathError(f"absolute path {relative_path!r} in {metadata_key}")
    if relative_path == "" or "\x00" in relative_path:
        raise UnsafePathError(f"bad path {relative_path!r} in {metadata_key}")
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(metadata_key), relative_path))
    if joined == ".." or joined.startswith("../") or joined in (".", ""):
        raise UnsafePathError(
            f"path {relative_path!r} in {metadata_key} leaves the job directory"
        )
    return check_key(joined)


def check_data_key(metadata_key: str, key: str) -> str:
    """Return `key` if a document at `metadata_key` may name it: a data file in
    ``shared/`` or ``exclusive/`` (a name statehold made), anything in ``taskowned/``, or
    a file in the document's own directory other than itself. Everything else (``_ha/``,
    ``_job/``, ``_spark/``, other checkpoints' and savepoints' folders) is bookkeeping a
    document can never name, so it can never be deleted through one."""
    info = parse(key)
    own_dir = metadata_key.rsplit("/", 1)[0] + "/"
    if info.kind in (Kind.SHARED, Kind.EXCLUSIVE, Kind.TASKOWNED) or (
        key.startswith(own_dir) and key != metadata_key and info.kind is not Kind.TEMP
    ):
        return key
    raise UnsafePathError(
        f"{metadata_key} may only name files in shared/, exclusive/, taskowned/ or its own "
        f"directory, not {key!r}"
    )


def relativize(metadata_key: str, key: str) -> str:
    """The path of job-directory `key` relative to the `_metadata` file at `metadata_key`."""
    check_key(metadata_key)
    check_key(key)
    return posixpath.relpath(key, posixpath.dirname(metadata_key) or ".")
