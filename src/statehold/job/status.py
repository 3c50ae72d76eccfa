"""A job's state as seen from outside: HA pointers, the running attempt, its cleanup."""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel

from statehold.ha.base import HAStore
from statehold.job.lease import read_lease
from statehold.job.result import JobResult, read_result
from statehold.storage.base import Storage


class JobStatus(BaseModel):
    job_uri: str
    epoch: int
    retained: list[int]
    #: True while the current attempt's lease is fresh.
    running: bool
    lease_age_seconds: float | None
    #: What the running attempt last reported: latest checkpoint, pending checkpoints,
    #: and its cleaner's backlog, failures and last errors.
    attempt: dict[str, Any]
    result: JobResult | None


def job_status(job: Storage, ha: HAStore) -> JobStatus:
    state = ha.read()
    lease = read_lease(job, state.epoch)
    return JobStatus(
        job_uri=job.uri,
        epoch=state.epoch,
        retained=[p.checkpoint_id for p in state.retained],
        running=lease is not None and lease.alive(),
        lease_age_seconds=time.time() - lease.renewed_at if lease else None,
        attempt=lease.status if lease else {},
        result=read_result(job),
    )
