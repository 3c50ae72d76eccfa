"""A location opened as a job directory (`statehold.job.directory.open_job`) and the
checkpoint or savepoint in it that it names: what the tools, the state reader and a
restore (``StatefulJob(restore_from=...)``) start from.

A location string ending in ``chk-N`` names checkpoint N of the job directory above it,
one ending in ``savepoints/NAME`` a savepoint, anything else a job directory (where a
checkpoint is needed, its newest retained one).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from statehold.errors import StateholdError
from statehold.format import layout
from statehold.format.metadata import CheckpointMetadata
from statehold.ha.base import HAStore
from statehold.job.directory import JobDirectory, JobDirectoryError, open_job
from statehold.storage import Storage, StorageError

TargetKind = Literal["job", "checkpoint", "savepoint"]

_CHK = re.compile(r"^chk-(\d+)$", re.ASCII)


class ToolError(StateholdError):
    """The operation cannot be done as asked; the message says why in one line.
    `problems` lists details (e.g. each missing file) when there are several."""

    def __init__(self, message: str, problems: Iterable[Any] = ()) -> None:
        super().__init__(message)
        self.problems = list(problems)


@dataclass(frozen=True)
class Target:
    """A job directory, or one checkpoint or savepoint in it."""

    job: JobDirectory
    kind: TargetKind = "job"
    #: ``chk-N/_metadata`` or ``savepoints/NAME/_metadata``; None for a job directory.
    metadata_key: str | None = None

    @property
    def storage(self) -> Storage:
        return self.job.storage

    @property
    def path(self) -> str:
        """``chk-N``, ``savepoints/NAME`` or '' (the job directory itself)."""
        return self.metadata_key.rsplit("/", 1)[0] if self.metadata_key else ""

    @property
    def uri(self) -> str:
        return f"{self.job.uri}/{self.path}" if self.path else self.job.uri


TargetLike = str | Storage | JobDirectory | Target


def kind_of(metadata_key: str) -> Literal["checkpoint", "savepoint"]:
    return "savepoint" if metadata_key.startswith(layout.SAVEPOINTS_DIR + "/") else "checkpoint"


def split_location(uri: str) -> tuple[str, str | None]:
    """A location string -> (job directory URI, ``chk-N`` / ``savepoints/NAME`` or None)."""
    uri = uri.rstrip("/") or uri
    if uri.endswith("/" + layout.METADATA_NAME):
        uri = uri[: -len(layout.METADATA_NAME) - 1]
    parts = uri.rsplit("/", 2)
    if _CHK.match(parts[-1]):
        return _parent(uri, 1), parts[-1]
    if len(parts) == 3 and parts[1] == layout.SAVEPOINTS_DIR:
        return _parent(uri, 2), f"{parts[1]}/{parts[2]}"
    return uri, None


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


def locate(
    target: TargetLike,
    ref: int | str | None = None,
    *,
    ha: str | HAStore | None = None,
    **storage_options: Any,
) -> Target:
    """Resolve a location (see the module docstring), a job-directory Storage or an open
    JobDirectory, plus an optional `ref` (checkpoint id, ``chk-N``, ``savepoints/NAME``),
    to a Target. A job directory opened here is the caller's to close (``t.job.close()``).
    """
    if isinstance(target, Target):
        if ref is None:
            return target
        target = target.job
    named: str | None = None
    if isinstance(target, str):
        job_uri, named = split_location(target)
        if named is not None and ref is not None:
            raise ToolError(f"{target} already names a checkpoint; give no other")
        try:
            job = open_job(job_uri, ha, **storage_options)
        except StorageError as e:
            raise ToolError(f"{target}: cannot open: {e}") from e
    elif isinstance(target, Storage):
        job = open_job(target, ha)
    else:
        job = target
    ref = named if ref is None else ref
    if ref is None:
        return Target(job)
    key = job.metadata_key(ref)
    return Target(job, kind_of(key), key)


@contextmanager
def opened(
    target: TargetLike,
    ref: int | str | None = None,
    *,
    ha: str | HAStore | None = None,
    checkpoint: bool = False,
    **storage_options: Any,
) -> Iterator[Target]:
    """`locate`, closing the job directory afterwards if it was opened here. With
    `checkpoint`, a job directory means its newest retained checkpoint."""
    t = locate(target, ref, ha=ha, **storage_options)
    try:
        if checkpoint and t.metadata_key is None:
            key = t.job.metadata_key(None)
            t = Target(t.job, "checkpoint", key)
        yield t
    finally:
        if not isinstance(target, (Target, JobDirectory)):
            t.job.close()


def read(t: Target) -> CheckpointMetadata:
    """The target's verified document (JobDirectoryError if there is no such one)."""
    assert t.metadata_key is not None
    if not t.storage.exists(t.metadata_key):
        raise JobDirectoryError(f"{t.uri}: no such {t.kind} ({layout.METADATA_NAME} missing)")
    return t.job.read_document(t.metadata_key)
