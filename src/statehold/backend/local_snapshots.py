"""The task backend's local disk: working DBs and local snapshots, per operator, under the
`local_dir` the caller gives (one per job)::

    <local_dir>/<operator>/kg-<start>-<end>/work-<uuid>/db     the private working DB of
                                                               one open (own RocksDB lock)
    <local_dir>/<operator>/kg-<start>-<end>/snap-<ckpt>-<uuid>/ a local snapshot: RocksDB
                                                               checkpoint + marker file

A snapshot directory is complete only once its marker (`LOCAL_MARKER`, written last and
atomically) lists every file with size and checksum; anything without a valid marker is
ignored. On open, every file a restore needs is looked up in those markers by (RocksDB file
name, checksum) and hard-linked if found, else downloaded and verified. So "the cache holds
this range at this checkpoint" is simply the case where nothing needs downloading, and a
stale, foreign or half-written cache can only cost a download, never wrong state.

A snapshot may also be *equivalent* to a checkpoint's state of the range without holding
its files: the same DB after a compaction that finished once the task had snapshotted
(engine.py). Its marker names the state it is equivalent to by `state_digest`, which
covers every file name, checksum and inline file of that state; a restore of exactly
that state opens it instead (`equivalent_snapshot`).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

from statehold.format import layout
from statehold.format.metadata import KeyGroupRange, KeyGroupState

LOCAL_MARKER = "statehold-local.json"
_MARKER_FORMAT = "statehold.local-snapshot"
#: A RocksDB file name we accept from a marker or a checkpoint (no paths, no dot files).
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
_SNAP_DIR = re.compile(r"^snap-(?P<ckpt>\d+)-[0-9a-f]+$", re.ASCII)

#: (RocksDB file name, checksum) -> a local file with that content.
LocalPool = dict[tuple[str, str], Path]


def operator_dir_name(operator: str) -> str:
    """A filesystem-safe, collision-free directory name for an operator."""
    digest = hashlib.blake2b(operator.encode("utf-8"), digest_size=4).hexdigest()
    return re.sub(r"[^A-Za-z0-9._-]", "_", operator)[:60] + "-" + digest


def range_dir_name(key_groups: KeyGroupRange) -> str:
    return f"kg-{key_groups.start}-{key_groups.end}"


def new_snapshot_dir(range_dir: Path, checkpoint_id: int) -> Path:
    """A fresh local snapshot directory of `checkpoint_id` (unique: several attempts of
    one checkpoint may snapshot the same range)."""
    return range_dir / f"snap-{checkpoint_id}-{uuid.uuid4().hex}"


def write_marker(
    snap: Path,
    files: dict[str, tuple[int, str]],
    *,
    operator: str,
    key_groups: KeyGroupRange,
    checkpoint_id: int,
    metadata_key: str,
    equivalent_to: str | None = None,
) -> None:
    """Declare `snap` complete: its `files` ({name: (size, checksum)}), written last and
    atomically, so a crash leaves either no marker or a whole one. `equivalent_to`: the
    `state_digest` of the state `snap` holds in other files (see above)."""
    _write_json_atomic(
        snap / LOCAL_MARKER,
        {
            "format": _MARKER_FORMAT,
            "version": 1,
            "operator": operator,
            "key_groups": [key_groups.start, key_groups.end],
            "checkpoint_id": checkpoint_id,
            "metadata_key": metadata_key,
            "files": {n: {"size": size, "checksum": c} for n, (size, c) in files.items()},
            **({"equivalent_to": equivalent_to} if equivalent_to else {}),
        },
    )


def state_digest(state: KeyGroupState) -> str:
    """What identifies a task's state in a checkpoint: its key groups, every stored file's
    name, size and checksum, and every inline file's name and content (not where the
    files are: a restored or relocated job's paths differ, the state does not)."""
    doc = {
        "key_groups": [state.key_groups.start, state.key_groups.end],
        "files": sorted((f.name or "", f.size, f.checksum) for f in state.files),
        "inline": sorted((i.name, i.data) for i in state.inline),
    }
    return hashlib.blake2b(json.dumps(doc).encode(), digest_size=16).hexdigest()


def equivalent_snapshot(range_dir: Path, checkpoint_id: int, digest: str) -> Path | None:
    """A complete local snapshot of `checkpoint_id` in `range_dir` equivalent to the state
    whose `state_digest` is `digest`, if there is one."""
    for snap in range_dir.glob(f"snap-{checkpoint_id}-*"):
        try:
            doc = json.loads((snap / LOCAL_MARKER).read_bytes())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and doc.get("equivalent_to") == digest and (
            read_marker(snap) is not None
        ):
            return snap
    return None


def _write_json_atomic(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}{layout.TEMP_MARKER}{uuid.uuid4().hex}")
    with open(tmp, "wb") as f:
        f.write(json.dumps(doc, sort_keys=True).encode())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_marker(snap: Path) -> dict[str, tuple[int, str]] | None:
    """The files of a complete local snapshot, {name: (size, checksum)}; None if the
    directory is incomplete, damaged or not ours."""
    try:
        doc = json.loads((snap / LOCAL_MARKER).read_bytes())
        if doc.get("format") != _MARKER_FORMAT:
            return None
        files = {str(n): (int(v["size"]), str(v["checksum"])) for n, v in doc["files"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    for name, (size, _c) in files.items():
        if not SAFE_NAME.match(name):
            return None
        try:
            if (snap / name).stat().st_size != size:
                return None
        except OSError:
            return None
    return files


def local_pool(op_dir: Path) -> LocalPool:
    """Every file in a complete local snapshot of the operator in `op_dir` (any range,
    any checkpoint), by (name, checksum)."""
    pool: LocalPool = {}
    for snap in op_dir.glob("kg-*/snap-*"):
        files = read_marker(snap)
        for name, (_size, checksum) in (files or {}).items():
            pool[(name, checksum)] = snap / name
    return pool


def link_or_copy(src: Path, dst: Path, *, link: bool) -> None:
    """Hard link when asked and possible (another filesystem, no permission, too many
    links: copy instead)."""
    if link:
        try:
            os.link(src, dst)
            return
        except OSError as e:
            if e.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                raise
    shutil.copyfile(src, dst)


#: A range's newest local snapshot is kept this many checkpoints after the executor last
#: held the range (then it is unlikely to share files with the state any more).
STALE_KEEP_CHECKPOINTS = 100


def prune_snapshots(op_dir: Path, keep_from: int, holding: Path | None = None) -> None:
    """Delete the operator's local snapshots older than checkpoint `keep_from` (no task
    restores from them any more; a straggler that still does just downloads), except each
    range's newest complete one, for `STALE_KEEP_CHECKPOINTS`: when a task of that range
    comes back to this executor (Spark does not keep a task on one executor), its restore
    links the SSTs that snapshot shares with the checkpoint and downloads only the newer
    ones, instead of the whole range. Not in `holding`, the range directory of the caller,
    which has restored its range and will snapshot it anew."""
    for range_dir in op_dir.glob("kg-*"):
        old: list[tuple[int, Path]] = []
        for snap in range_dir.glob("snap-*"):
            m = _SNAP_DIR.match(snap.name)
            if m and int(m["ckpt"]) < keep_from:
                old.append((int(m["ckpt"]), snap))
        spare: Path | None = None
        for ckpt, snap in sorted(old, key=lambda c: c[0], reverse=True):
            if ckpt >= keep_from - STALE_KEEP_CHECKPOINTS and read_marker(snap) is not None:
                spare = snap
                break
        newer = any(
            (m := _SNAP_DIR.match(s.name)) and int(m["ckpt"]) >= keep_from
            for s in range_dir.glob("snap-*")
        )
        for _ckpt, snap in old:
            if snap != spare or newer or range_dir == holding:
                shutil.rmtree(snap, ignore_errors=True)


def executor_scratch_dir() -> str:
    """Where this Spark executor keeps scratch data, as Spark itself picks it: the
    application's directories a standalone worker gives its executors
    (``SPARK_EXECUTOR_DIRS``), a YARN container's ``LOCAL_DIRS``, ``SPARK_LOCAL_DIRS``
    (Kubernetes, or set by hand), else the temp directory. The first three are per
    executor (or per machine) and removed with the application, so local snapshots
    neither outlive it nor collide between executors sharing a machine's /tmp."""
    if os.environ.get("SPARK_EXECUTOR_DIRS"):
        dirs = os.environ["SPARK_EXECUTOR_DIRS"]
    elif os.environ.get("CONTAINER_ID") and os.environ.get("LOCAL_DIRS"):
        dirs = os.environ["LOCAL_DIRS"].replace(",", os.pathsep)
    else:
        dirs = os.environ.get("SPARK_LOCAL_DIRS", "").replace(",", os.pathsep)
    first = next((d for d in dirs.split(os.pathsep) if d), None)
    return first or tempfile.gettempdir()
