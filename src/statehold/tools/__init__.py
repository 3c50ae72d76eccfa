"""Operations on job directories for people and scripts: list, inspect, verify, diff, du,
export and dispose. The CLI (`statehold.cli`) is a thin layer over these functions.

Every function takes a *target*: a location string (plain path, ``file://``,
``s3://bucket/prefix``; see `statehold.job.locate`), a job-directory `Storage`, an open
`statehold.job.directory.JobDirectory`, or a `Target`, and `ha`: the HA store's URI (default:
the one the job directory records). Results are pydantic models, so
``result.model_dump_json()`` is the machine-readable form.

Safety: nothing here reads or deletes outside the job directory it was given, every
check runs before the first delete (an operation that refuses deletes nothing), and
every delete is one the deletion policy (`statehold.cleanup.policy`) allows.

    listing.py     a job directory's files, page by page, with progress
    results.py     the result models
    reports.py     read-only: list, inspect, verify, diff
    usage.py       read-only: du
    operations.py  writing: export, dispose
"""

from statehold.job.directory import JobDirectoryError, NotAJobDirectoryError, require_job_directory
from statehold.job.locate import Target, TargetLike, ToolError, locate, opened
from statehold.tools.listing import Progress
from statehold.tools.operations import dispose, export
from statehold.tools.reports import diff, inspect, list_checkpoints, verify
from statehold.tools.results import (
    CheckpointSummary,
    CheckpointUsage,
    DiffEntry,
    DiffReport,
    DiskUsage,
    DisposeReport,
    ExportReport,
    FileRef,
    Inspection,
    JobListing,
    Problem,
    VerifyReport,
)
from statehold.tools.usage import du

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
    "JobDirectoryError",
    "JobListing",
    "NotAJobDirectoryError",
    "Problem",
    "Progress",
    "Target",
    "TargetLike",
    "ToolError",
    "VerifyReport",
    "diff",
    "dispose",
    "du",
    "export",
    "inspect",
    "list_checkpoints",
    "locate",
    "opened",
    "require_job_directory",
    "verify",
]
