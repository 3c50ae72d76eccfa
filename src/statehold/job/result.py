"""The job result store: that a job ended, how, and whether its cleanup is done.

DESIGN invariant 8: when a job ends, a *dirty* entry is written first, cleanup runs per the
retention policy, then the entry becomes *clean*. A driver that starts and finds a dirty
entry finishes that cleanup before anything else. The entry is one small JSON document
in the job directory, ``_job/result.json``, written atomically.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from statehold import clock
from statehold.errors import StateholdError
from statehold.format import layout, signed
from statehold.storage.base import NotFoundError, Storage

RESULT_KEY = f"{layout.JOB_DIR}/result.json"


class JobOutcome(StrEnum):
    FINISHED = "finished"
    CANCELLED = "cancelled"
    FAILED = "failed"


class RetentionPolicy(StrEnum):
    """What a job keeps after it ends. Savepoints are kept by both: statehold deletes a
    savepoint only when a person disposes of it."""

    #: The newest completed checkpoint (so the job can be resumed or restored from).
    KEEP_LATEST = "keep-latest"
    #: No checkpoint at all; the HA pointers and Spark's offsets go too.
    DELETE_ALL = "delete-all"


class JobResultError(StateholdError):
    """The job result entry is unreadable."""


class JobResult(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["statehold.job-result"] = "statehold.job-result"
    version: Literal[1] = 1
    job_id: signed.Name
    epoch: signed.Id
    outcome: JobOutcome
    policy: RetentionPolicy
    state: Literal["dirty", "clean"]
    at: signed.Timestamp


def read_result(storage: Storage) -> JobResult | None:
    """The entry, None if there is none, or JobResultError (one line naming the file) for
    any entry that cannot be trusted: a driver must not act on a half-read cleanup order.
    Bounded like every statehold document (see `signed`)."""
    try:
        data = storage.read(RESULT_KEY)
    except NotFoundError:
        return None
    where = f"{storage.uri.rstrip('/')}/{RESULT_KEY}"
    doc = signed.load_json(
        data,
        where=where,
        error=JobResultError,
        max_bytes=signed.MAX_SMALL_DOCUMENT_BYTES,
        invalid="unreadable job result",
    )
    try:
        return JobResult.model_validate(doc)
    except ValidationError as e:
        raise JobResultError(f"{where}: unreadable job result: {signed.explain(e)}") from e


def write_result(
    storage: Storage,
    *,
    job_id: str,
    epoch: int,
    outcome: JobOutcome,
    policy: RetentionPolicy,
    state: Literal["dirty", "clean"],
) -> JobResult:
    result = JobResult(
        job_id=job_id, epoch=epoch, outcome=outcome, policy=policy, state=state, at=clock.now()
    )
    storage.write(RESULT_KEY, result.model_dump_json(indent=1).encode())
    return result


def clear_result(storage: Storage) -> None:
    """A job that is started again after a clean end is running, not ended."""
    storage.delete_many([RESULT_KEY])
