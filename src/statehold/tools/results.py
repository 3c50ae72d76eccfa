"""The results of the tools: pydantic models, so ``result.model_dump_json()`` is the
machine-readable form (the CLI's ``--json``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from statehold.format import results as shared
from statehold.format.layout import Scope
from statehold.format.results import Problem as Problem
from statehold.job.history import HistoryRecord

TargetKind = Literal["job", "checkpoint", "savepoint"]


class _Result(BaseModel):
    model_config = ConfigDict(frozen=True)


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


class JobListing(shared.Listing):
    location_kind: Literal["job"] = "job"
    job_uri: str
    ha_epoch: int
    #: Retained checkpoints and ``chk-N`` directories not retained (``retained`` False),
    #: ascending by id.
    checkpoints: list[CheckpointSummary]
    savepoints: list[CheckpointSummary]
    problems: list[Problem]


class Inspection(shared.InspectReport):
    location_kind: Literal["job"] = "job"
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
    #: how keys map to key groups (`statehold.backend.keys`)
    key_hash: str
    source_position: dict[str, Any]
    lineage: dict[str, Any] | None
    retained: bool
    metadata_checksum: str
    operators: list[str]
    file_count: int
    total_bytes: int
    bytes_by_scope: dict[str, int]
    files: list[FileRef]


class JobVerifyReport(shared.VerifyReport):
    location_kind: Literal["job"] = "job"
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


class DiskUsage(shared.UsageReport):
    location_kind: Literal["job"] = "job"
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
    #: Documents that cannot be verified (key -> why): left out above; gc spares what
    #: they may name.
    quarantined: dict[str, str] = {}


class ExportReport(shared.CopyReport):
    location_kind: Literal["job"] = "job"
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


class JobHistory(shared.History):
    location_kind: Literal["job"] = "job"
    """A job directory's checkpoint history, oldest first."""

    job_uri: str
    records: list[HistoryRecord]


#: The job world's verify result, by its old name.
VerifyReport = JobVerifyReport
