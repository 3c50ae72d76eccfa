"""`open_location` (``statehold.open``): a location's kind decided once
(`statehold.format.location_kind`), and one handle per kind with the same verbs where both
worlds have the thing: `JobLocation` here, `statehold.spark_checkpoints.SparkLocation` for
a Spark checkpoint location.

    with statehold.open("s3://bucket/jobs/orders") as location:
        location.verify().ok
        location.gc(dry_run=True).orphan_count
        location.report().write(Path("orders.html"))

Each verb returns its one result model (`statehold.format.results`); the verbs only one
world has (`dispose`, `set_ha`, a running job's requests; `rollback`, `repair`, `relocate`,
`repartition`, `transform`, `delete_keys`) are that class's only. The methods are the
free functions of `statehold.tools` on the opened job directory.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from statehold.checkpoint import requests
from statehold.cleanup.gc import GcReport
from statehold.cleanup.gc import gc as gc_job
from statehold.errors import InvalidArgumentError
from statehold.format.location_kind import JOB_NEEDS, SPARK_NEEDS, location_kind
from statehold.format.requests import Action, OperatorRequest
from statehold.format.results import WebReport
from statehold.ha.base import HAState
from statehold.job.directory import JobDirectory, NotAJobDirectoryError, change_ha_store
from statehold.job.history import read_history
from statehold.job.locate import Target, locate, split_location
from statehold.progress import Progress
from statehold.spark_checkpoints.api import SparkLocation
from statehold.spark_checkpoints.errors import NotASparkCheckpointError
from statehold.storage import LocalStorage, Storage, StorageError, open_storage
from statehold.tools import web_page
from statehold.tools.operations import dispose, export
from statehold.tools.reports import inspect, list_checkpoints, verify
from statehold.tools.results import (
    DiskUsage,
    DisposeReport,
    ExportReport,
    Inspection,
    JobHistory,
    JobListing,
    JobVerifyReport,
)
from statehold.tools.usage import du


class UnknownLocationError(NotAJobDirectoryError, NotASparkCheckpointError):
    """The location is neither a statehold job directory nor a Spark checkpoint location
    (absent, empty, a file, something else, or with the marks of both)."""


class JobLocation:
    """A statehold job directory (or one checkpoint or savepoint in it: `target`), opened
    with its HA store; close it (or use it as a context manager) when done."""

    def __init__(self, target: Target) -> None:
        self.target = target

    @property
    def job(self) -> JobDirectory:
        return self.target.job

    @property
    def uri(self) -> str:
        return self.target.uri

    def close(self) -> None:
        self.job.close()

    def __enter__(self) -> JobLocation:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- the verbs both worlds have ------------------------------------------------------
    def listing(self, *, progress: Progress | None = None) -> JobListing:
        """Retained checkpoints, ``chk-N`` directories not retained, savepoints."""
        return list_checkpoints(self.job, progress=progress)

    def inspect(self) -> Inspection:
        """The checkpoint named (default: the newest retained): its header and files."""
        return inspect(self.target)

    def verify(self, *, checksums: bool = True, progress: Progress | None = None
               ) -> JobVerifyReport:
        return verify(self.target, checksums=checksums, progress=progress)

    def du(self, *, progress: Progress | None = None) -> DiskUsage:
        return du(self.job, progress=progress)

    def history(self, limit: int | None = None) -> JobHistory:
        return JobHistory(job_uri=self.job.storage.uri, records=read_history(self.job.storage,
                                                                             limit))

    def report(self) -> WebReport:
        """The web page (`statehold.web_page`): history charts, retained checkpoints and
        savepoints, shared files and their holders, storage, cleanup, verify of sizes."""
        return web_page.report(self.job)

    def gc(self, *, dry_run: bool = False, grace: float | None = None,
           progress: Progress | None = None) -> GcReport:
        """Delete every file no retained checkpoint or savepoint references; safe while
        the job runs (its in-flight files are spared while its lease is fresh, so there is
        no `grace`: giving one is refused)."""
        if grace is not None:
            raise InvalidArgumentError(
                f"{self.uri}: a grace is for a Spark checkpoint location; a job directory's "
                "gc spares what its running attempt has in flight")
        return gc_job(self.job, dry_run=dry_run, progress=progress)

    def copy(self, dest: str | Storage, *, at: int | str | None = None, verify: bool = True,
             progress: Progress | None = None, **dest_options: Any) -> ExportReport:
        """Export: a self-contained job directory at `dest` holding only checkpoint `at`
        (an id, ``chk-N`` or ``savepoints/NAME``; default: the one named, else the newest
        retained)."""
        source = self.target if at is None else locate(self.job, at)
        return export(source, dest, progress=progress, verify_after=verify,
                      dest_options=dest_options or None)

    # -- a job directory's own ------------------------------------------------------------
    def dispose(self, *, force: bool = False, dry_run: bool = False,
                progress: Progress | None = None) -> DisposeReport:
        """Delete the checkpoint or savepoint named, or (none named) the job directory."""
        return dispose(self.target, force=force, dry_run=dry_run, progress=progress)

    def set_ha(self, new_ha: str) -> HAState:
        """Move the stopped job to another HA store (``statehold set-ha``)."""
        return change_ha_store(self.job, new_ha)

    def request(self, action: Action, savepoint: str | None = None) -> OperatorRequest:
        """Ask the running attempt for a savepoint or a stop (``statehold savepoint JOB
        NAME``, ``statehold stop``); its answer: `statehold.checkpoint.requests.wait`."""
        return requests.submit(self.job.storage, self.job.ha, self.job.job_id, action,
                               savepoint)


Location = JobLocation | SparkLocation


def open_location(uri: str, *, ha: str | None = None, **storage_options: Any) -> Location:
    """The location at `uri` (path, ``file://``, ``s3://``, ...), of the kind it is: a job
    directory (`ha`: its HA store, default the one it records), a checkpoint or savepoint
    in one (``.../chk-N``, ``.../savepoints/NAME``), or a Spark checkpoint location.
    UnknownLocationError when it is none of them; the one place the kind is decided."""
    storage = _open(uri, storage_options)
    problem = storage.root_problem() if isinstance(storage, LocalStorage) else None
    kind = None if problem is not None else location_kind(storage)
    if kind == "spark":
        return SparkLocation(storage)
    if kind == "job":
        return JobLocation(locate(storage, ha=ha))
    job_uri, ref = split_location(uri)
    if ref is not None and _kind_at(job_uri, storage_options) == "job":
        return JobLocation(locate(job_uri, ref, ha=ha, **storage_options))
    if problem is not None:
        raise UnknownLocationError(f"{uri}: {problem} (a statehold job directory or a "
                                   "query's checkpoint location is expected)")
    raise UnknownLocationError(f"{uri.rstrip('/') or uri}: {JOB_NEEDS}, and {SPARK_NEEDS}")


def _open(uri: str, storage_options: dict[str, Any]) -> Storage:
    try:
        return open_storage(uri, **storage_options)
    except (StorageError, ValueError) as e:
        raise UnknownLocationError(f"{uri}: cannot open: {e}") from e


def _kind_at(uri: str, storage_options: dict[str, Any]) -> str | None:
    storage = _open(uri, storage_options)
    if isinstance(storage, LocalStorage) and storage.root_problem() is not None:
        return None
    return location_kind(storage)
