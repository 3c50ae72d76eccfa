"""The running attempt's lease: how an offline `statehold gc` knows what is in flight.

The attempt with epoch E keeps ``_job/lease-e<E>.json`` fresh (a heartbeat thread rewrites
it every `ttl / 4`). A reconcile run from outside treats the current epoch's in-flight
files as live while that lease is younger than its `ttl`. In return the attempt refuses
to complete a checkpoint when its own last renewal is older than `ttl / 2` (`is_fresh`),
and refuses one begun before its lease last lapsed (`unbroken_since`), so a driver that
was paused long enough for its lease to lapse cannot publish a checkpoint whose files an
outside gc may have deleted meanwhile. The assumptions, stated once: a driver pause
between that check and its HA publish is shorter than `ttl / 2`, and the clocks of the
driver and of a machine running gc differ by less than `ttl / 2`.
One file per epoch, so a zombie renewing its own lease never vouches for another attempt.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError

from statehold import clock
from statehold.errors import InvalidArgumentError, StateholdError
from statehold.format import layout, signed
from statehold.storage.base import NotFoundError, Storage, StorageError

log = logging.getLogger("statehold.job.lease")

DEFAULT_TTL = 120.0


_LEASE_KEY = re.compile(rf"^{re.escape(layout.JOB_DIR)}/lease-e(?P<epoch>\d+)\.json$",
                        re.ASCII)


def lease_key(epoch: int) -> str:
    return f"{layout.JOB_DIR}/lease-e{epoch}.json"


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    epoch: int
    renewed_at: float
    ttl: float
    #: What the attempt reports about itself (e.g. its cleaner's backlog and failures).
    status: dict[str, Any] = field(default_factory=dict)

    def alive(self, now: float | None = None) -> bool:
        return (now if now is not None else clock.now()) - self.renewed_at < self.ttl


class _LeaseDocument(BaseModel):
    """What `Lease.renew` writes; unknown fields are ignored (a newer writer may add some)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    epoch: signed.Id
    renewed_at: signed.Timestamp
    ttl: Annotated[float, Strict(), Field(gt=0, le=signed.MAX_LEASE_TTL, allow_inf_nan=False)]
    status: Any = None


def read_lease(storage: Storage, epoch: int) -> LeaseRecord | None:
    """The lease of attempt `epoch`, or None if absent or malformed: a lease that is not
    JSON, too large or deep (see `signed`), of another epoch, or with a number that is not a
    plausible one (NaN, a bool, a ttl over `signed.MAX_LEASE_TTL`) vouches for nothing.
    Only a failure to read it at all (StorageError) is raised: that is not an answer."""
    try:
        data = storage.read(lease_key(epoch))
    except NotFoundError:
        return None
    try:
        raw = signed.load_json(
            data,
            where=lease_key(epoch),
            error=StateholdError,
            max_bytes=signed.MAX_SMALL_DOCUMENT_BYTES,
        )
        doc = _LeaseDocument.model_validate(raw)
    except (StateholdError, ValidationError):
        return None
    if doc.epoch != epoch:
        return None
    status = doc.status if isinstance(doc.status, dict) else {}
    return LeaseRecord(doc.epoch, doc.renewed_at, doc.ttl, status)


class Lease:
    """Renews this attempt's lease in a background thread; removes older epochs' leases.
    Each renewal also publishes `status()` (JSON), so `statehold status` can show a
    running attempt's cleanup backlog and failures from outside."""

    def __init__(
        self,
        storage: Storage,
        epoch: int,
        ttl: float = DEFAULT_TTL,
        status: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.storage = storage
        self.epoch = epoch
        if not 0 < ttl <= signed.MAX_LEASE_TTL:  # a reader would take a longer one for no lease
            raise InvalidArgumentError(
                f"lease ttl must be in (0, {signed.MAX_LEASE_TTL:.0f}] seconds"
            )
        self.ttl = ttl
        self.status = status
        self._last_renewal = 0.0
        #: Since when renewals have followed each other within ttl/2 (see unbroken_since).
        self._unbroken_since = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, *, background: bool = True) -> Lease:
        """Renew once, remove older epochs' leases, then keep renewing every ttl/4 in a
        background thread (unless `background` is False: then the caller calls `renew`)."""
        self.renew()
        # Only older epochs': a newer attempt's lease is what tells an outside gc that it
        # runs, and a late-starting older attempt (fenced, but not knowing it yet) must
        # not remove it (found by the simulation, seed 1009).
        old = [
            info.key
            for info in self.storage.list(layout.JOB_DIR)
            if (m := _LEASE_KEY.match(info.key)) and int(m["epoch"]) < self.epoch
        ]
        if old:
            try:
                self.storage.delete_many(old)
            except StorageError as e:  # harmless: a stale lease vouches for a dead epoch
                log.warning("could not remove old leases: %s", e)
        if background:
            self._thread = threading.Thread(
                target=self._run, name="statehold-lease", daemon=True
            )
            self._thread.start()
        return self

    def renew(self) -> None:
        now = clock.now()
        record = {
            "epoch": self.epoch,
            "renewed_at": now,
            "ttl": self.ttl,
            "status": self.status() if self.status is not None else {},
        }
        self.storage.write(lease_key(self.epoch), json.dumps(record).encode())
        if now - self._last_renewal >= self.ttl / 2:
            self._unbroken_since = now  # a lapse: whoever looked meanwhile saw no attempt
        self._last_renewal = now

    def is_fresh(self) -> bool:
        """True while the last successful renewal is younger than half the ttl."""
        return clock.now() - self._last_renewal < self.ttl / 2

    def unbroken_since(self, since: float) -> bool:
        """True if the lease is fresh and never lapsed since `since`: no two renewals
        since then were ttl/2 or more apart. A checkpoint begun before a lapse may have
        lost in-flight files to an outside gc that saw no running attempt, so it must
        not complete; one begun after it was written after the gc's listing."""
        return self.is_fresh() and self._unbroken_since <= since

    def _run(self) -> None:
        while not self._stop.wait(self.ttl / 4):
            try:
                self.renew()
            except StorageError as e:
                log.warning("lease renewal failed (checkpoints pause if it stays so): %s", e)

    def stop(self, *, release: bool = True) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if release:
            try:
                self.storage.delete_many([lease_key(self.epoch)])
            except StorageError as e:
                log.warning("could not release lease: %s", e)
