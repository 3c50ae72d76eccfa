"""The running attempt's lease: how an offline `statehold gc` knows what is in flight.

The attempt with epoch E keeps ``_job/lease-e<E>.json`` fresh (a heartbeat thread rewrites
it every `ttl / 4`). A reconcile run from outside treats the current epoch's in-flight
files as live while that lease is younger than its `ttl`. In return the attempt refuses
to complete a checkpoint when its own last renewal is older than `ttl / 2` (`is_fresh`),
so a driver that was paused long enough for its lease to lapse cannot publish a
checkpoint whose files a reconcile may have deleted meanwhile. The assumption, stated
once: a driver pause between that check and its HA publish is shorter than `ttl / 2`.
One file per epoch, so a zombie renewing its own lease never vouches for another attempt.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from statehold import layout
from statehold.storage.base import NotFoundError, Storage, StorageError

log = logging.getLogger("statehold.lease")

DEFAULT_TTL = 120.0


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
        return (now if now is not None else time.time()) - self.renewed_at < self.ttl


def read_lease(storage: Storage, epoch: int) -> LeaseRecord | None:
    """The lease of attempt `epoch`, or None if absent or unreadable (an unreadable lease
    vouches for nothing)."""
    try:
        doc = json.loads(storage.read(lease_key(epoch)))
        status = doc.get("status", {})
        return LeaseRecord(
            int(doc["epoch"]),
            float(doc["renewed_at"]),
            float(doc["ttl"]),
            status if isinstance(status, dict) else {},
        )
    except (NotFoundError, ValueError, KeyError, TypeError):
        return None


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
        self.ttl = ttl
        self.status = status
        self._last_renewal = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Lease:
        self.renew()
        mine = lease_key(self.epoch)
        old = [
            info.key
            for info in self.storage.list(layout.JOB_DIR)
            if info.key.startswith(f"{layout.JOB_DIR}/lease-e") and info.key != mine
        ]
        if old:
            try:
                self.storage.delete_many(old)
            except StorageError as e:  # harmless: a stale lease vouches for a dead epoch
                log.warning("could not remove old leases: %s", e)
        self._thread = threading.Thread(target=self._run, name="statehold-lease", daemon=True)
        self._thread.start()
        return self

    def renew(self) -> None:
        now = time.time()
        record = {
            "epoch": self.epoch,
            "renewed_at": now,
            "ttl": self.ttl,
            "status": self.status() if self.status is not None else {},
        }
        self.storage.write(lease_key(self.epoch), json.dumps(record).encode())
        self._last_renewal = now

    def is_fresh(self) -> bool:
        """True while the last successful renewal is younger than half the ttl."""
        return time.time() - self._last_renewal < self.ttl / 2

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
