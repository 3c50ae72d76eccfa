"""One result model per verb, whatever the location: the ``--json`` schemas of ``statehold
list``, ``inspect``, ``verify``, ``du``, ``gc``, ``history``, ``report`` and
``export``/``savepoint``.

Each model here declares every key of its verb, so a script reads one shape: the keys of
a statehold job directory (``location_kind`` ``"job"``) and of a Spark checkpoint location
(``"spark"``) are the same, and a key only the other world fills is null or empty
(docs/cli.md, "JSON"). The world's own subclasses (`statehold.tools.results` and
`statehold.spark_checkpoints`) make their keys required and their types exact.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, model_validator

LocationKind = Literal["job", "spark"]


class Problem(BaseModel, frozen=True):
    """One thing wrong, at a key (or URI) of the location."""

    path: str
    problem: str
    #: `verify --deep` on a Spark location: what is wrong (``zip-cut-short``, ...) and the
    #: Spark bug whose signature it carries, where it carries one (``SPARK-43404``).
    kind: str | None = None
    spark_bug: str | None = None


class _Located(BaseModel):
    location_kind: LocationKind
    #: The location the verb ran on (default: ``job_uri``, or a copy's ``source``).
    uri: str = ""

    @model_validator(mode="before")
    @classmethod
    def _uri_of_job(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("uri"):
            uri = data.get("job_uri") or data.get("source")
            if uri:
                return {**data, "uri": uri}
        return data


class _SparkBatches(BaseModel):
    """A Spark location's batches and stores (its `list` and `inspect`)."""

    query_id: str | None = None
    newest_committed: int | None = None
    oldest_committed: int | None = None
    restart_batch: int | None = None
    batches: list[Any] = []
    stores: list[Any] = []
    min_batches_to_retain: int | None = None
    interrupted_rollback: int | None = None
    stale_state: list[str] = []
    #: What a Spark location's `repair` set aside: each ``_repaired/<UTC time>`` folder
    #: and its file count.
    repaired: dict[str, int] = {}


class Listing(_Located, _SparkBatches):
    """``statehold list``: what a restart can start from."""

    problems: list[Problem] = []
    #: A Spark location's: ``"spark-checkpoint"``.
    kind: str | None = None
    # a job directory's
    job_uri: str | None = None
    ha_epoch: int | None = None
    checkpoints: list[Any] = []
    savepoints: list[Any] = []


class InspectReport(_Located, _SparkBatches):
    """``statehold inspect``: a job's checkpoint (its header and files), or a Spark
    location's restart batch (its stores, each version and how it is held)."""

    kind: str | None = None
    # a job directory's checkpoint
    job_uri: str | None = None
    metadata_path: str | None = None
    format_version: int | None = None
    job_id: str | None = None
    checkpoint_id: int | None = None
    savepoint_name: str | None = None
    epoch: int | None = None
    created_at: float | None = None
    completed_at: float | None = None
    max_parallelism: int | None = None
    key_hash: str | None = None
    source_position: dict[str, Any] = {}
    lineage: dict[str, Any] | None = None
    retained: bool | None = None
    metadata_checksum: str | None = None
    operators: list[str] = []
    file_count: int | None = None
    total_bytes: int | None = None
    bytes_by_scope: dict[str, int] = {}
    files: list[Any] = []


class VerifyReport(_Located):
    """``statehold verify``: every file a restore (a restart) reads is there and whole."""

    ok: bool
    files_checked: int
    bytes_checked: int
    problems: list[Problem]
    # a job directory's
    job_uri: str | None = None
    metadata_path: str | None = None
    checksums: bool | None = None
    # a Spark location's
    batch: int | None = None
    bound_to: dict[str, int] = {}
    deep: bool = False
    operator: int | None = None
    stores_loaded: int = 0
    records_read: int = 0
    not_decoded: list[str] = []


class UsageReport(_Located):
    """``statehold du``: bytes held, and what no restart needs (gc's candidates)."""

    total_files: int
    total_bytes: int
    unreferenced_files: int | None = None
    unreferenced_bytes: int | None = None
    # a job directory's
    job_uri: str | None = None
    by_scope: dict[str, int] = {}
    by_checkpoint: list[Any] = []
    referenced_bytes: int | None = None
    unreferenced_sample: list[str] = []
    missing_files: int | None = None
    quarantined: dict[str, str] = {}
    # a Spark location's: bytes and files by kind
    bytes: dict[str, int] = {}
    files: dict[str, int] = {}


class GcReport(_Located):
    """``statehold gc``: what was deleted (with `dry_run`: would be), what was kept and
    why. Key lists are samples (at most 1000 keys); the ``*_count`` fields count all."""

    dry_run: bool
    referenced: int = 0
    #: Spared because they are young or a running attempt's (in flight).
    protected: list[str] = []
    protected_count: int = 0
    #: Not the owner's files (not statehold's, not Spark's): never deleted.
    foreign: list[str] = []
    foreign_count: int = 0
    deleted: int = 0
    problems: list[str] = []
    # a job directory's
    job_uri: str | None = None
    live_epoch: int | None = None
    scanned: int | None = None
    orphans: list[str] = []
    orphan_count: int = 0
    orphan_bytes: int | None = None
    quarantined: dict[str, str] = {}
    # a Spark location's
    listed: int | None = None
    #: The newest committed batch and the oldest in the commit log (None: none).
    newest_batch: int | None = None
    oldest_batch: int | None = None
    #: Logs and metadata, always kept.
    kept: int = 0
    #: Judged deletable (what a dry run would delete), and by kind.
    deletable: int = 0
    deletable_bytes: int = 0
    deletable_by_kind: dict[str, int] = {}
    deleted_bytes: int = 0
    deleted_keys: list[str] = []
    #: Left at the re-check: changed, grown young or gone since the listing.
    changed: int = 0
    #: Stores spared whole, and why (one line each).
    spared_stores: list[str] = []
    #: Retained batches whose state Spark no longer holds (its maintenance deleted it).
    notes: list[str] = []


class History(_Located):
    """``statehold history``: a job's checkpoints or a Spark location's batches, oldest
    first."""

    records: list[Any]
    job_uri: str | None = None


class CopyReport(_Located):
    """``statehold export`` (a job's checkpoint as a new job directory) and ``statehold
    savepoint`` of a Spark location (a new location a restart continues from)."""

    source: str
    dest: str
    verified: bool
    # a job directory's export
    metadata_path: str | None = None
    checkpoint_id: int | None = None
    files_copied: int | None = None
    bytes_copied: int | None = None
    ha_epoch: int | None = None
    # a Spark location's savepoint
    batch: int | None = None
    files: int | None = None
    bytes: int | None = None
    bytes_written: int | None = None
    linked: int | None = None
    source_bytes: int | None = None


class ReportSummary(_Located):
    """``statehold report``: the web page's numbers (``--json``). `checkpoints` counts a
    job's checkpoints or a Spark location's batches; `html` is where the page went."""

    job_uri: str
    html: str = ""
    checkpoints: int
    savepoints: int
    history_records: int
    problems: int


class WebReport(BaseModel):
    """A location's web page (`JobLocation.report`, `SparkLocation.report`): the page, one
    self-contained HTML text, and its numbers."""

    page: str
    summary: ReportSummary

    def write(self, path: Path) -> ReportSummary:
        """Write the page to `path` (a local file); the summary then names it."""
        path.write_text(self.page, encoding="utf-8")
        return self.summary.model_copy(update={"html": str(path)})


__all__ = [
    "CopyReport",
    "GcReport",
    "History",
    "InspectReport",
    "Listing",
    "LocationKind",
    "Problem",
    "ReportSummary",
    "UsageReport",
    "VerifyReport",
    "WebReport",
]
