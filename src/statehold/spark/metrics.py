"""Prometheus metrics of a running job, served by the driver (``StatefulJob(metrics_port=
...)``) with the standard `prometheus_client` library: each checkpoint's record (the same
figures as its history record and `BatchResult`) updates them; the cleaner's backlog and
the time since the last completed checkpoint are read at scrape time.

Each job has its own registry, so two jobs in one driver never collide on names; every
metric carries the ``job`` label.

The endpoint listens on 127.0.0.1 unless told another address (``StatefulJob(metrics_host=
...)``): `prometheus_client.start_http_server` itself binds every interface (``0.0.0.0``)
when given none, so the address is always passed. A Prometheus server on another machine
needs ``metrics_host="0.0.0.0"`` (or the address of one interface)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from statehold.job.history import HistoryRecord

_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


#: Where the endpoint listens unless told otherwise: this machine only.
DEFAULT_HOST = "127.0.0.1"


class JobMetrics:
    """The metrics of one job, and the HTTP endpoint serving them on `host` (127.0.0.1
    unless told otherwise) and `port` (0: any free one; `port` then tells which)."""

    def __init__(self, job_id: str, port: int, host: str = DEFAULT_HOST) -> None:
        self.registry = CollectorRegistry()
        r, job = self.registry, ["job"]
        self.job_id = job_id
        self._last_completed: float | None = None
        self._cleaner: Callable[[], Any] | None = None
        self.checkpoints = Counter("statehold_checkpoints", "Checkpoints ended, by outcome",
                                   ["job", "outcome"], registry=r)
        self.duration = Histogram("statehold_checkpoint_duration_seconds",
                                  "Completed checkpoints' duration (begin to complete)", job,
                                  buckets=_BUCKETS, registry=r)
        self.last_seconds = Gauge("statehold_last_checkpoint_seconds",
                                  "The last completed checkpoint's duration by phase "
                                  "(total, snapshot: the tasks' summed, complete: the driver's)",
                                  ["job", "phase"], registry=r)
        self.uploaded = Counter("statehold_uploaded_bytes", "Bytes the checkpoints uploaded",
                                job, registry=r)
        self.last_uploaded = Gauge("statehold_last_checkpoint_uploaded_bytes",
                                   "Bytes the last completed checkpoint uploaded", job, registry=r)
        self.downloaded = Counter("statehold_restore_downloaded_bytes",
                                  "Bytes the tasks downloaded to restore state", job, registry=r)
        self.state_size = Gauge("statehold_state_size_bytes",
                                "The last completed checkpoint's state size", job, registry=r)
        self.checkpoint_id = Gauge("statehold_last_checkpoint_id",
                                   "The last completed checkpoint's id", job, registry=r)
        self.epoch = Gauge("statehold_epoch", "This attempt's epoch", job, registry=r)
        Gauge("statehold_seconds_since_last_checkpoint",
              "Seconds since this driver last completed a checkpoint (-1: none yet)", job,
              registry=r).labels(job_id).set_function(self._since_last)
        Gauge("statehold_cleanup_backlog", "Files and folders the cleaner has yet to delete",
              job, registry=r).labels(job_id).set_function(lambda: self._cleaner_figure("backlog"))
        Gauge("statehold_cleanup_failures", "The cleaner's failed delete attempts so far", job,
              registry=r).labels(job_id).set_function(lambda: self._cleaner_figure("failures"))
        self._server, self._thread = start_http_server(port, addr=host, registry=r)
        self.port: int = self._server.server_address[1]

    @property
    def address(self) -> tuple[str, int]:
        """The address the endpoint's socket is bound to: (host, port)."""
        host, port = self._server.socket.getsockname()[:2]
        return str(host), int(port)

    def attach(self, epoch: int, cleaner_status: Callable[[], Any]) -> None:
        """A (new) attempt: its epoch and its cleaner's `status()`."""
        self.epoch.labels(self.job_id).set(epoch)
        self._cleaner = cleaner_status

    def observe(self, record: HistoryRecord | None) -> None:
        """One checkpoint ended (its history record)."""
        if record is None:
            return
        job = self.job_id
        self.checkpoints.labels(job, record.outcome).inc()
        self.uploaded.labels(job).inc(record.bytes_uploaded)
        self.downloaded.labels(job).inc(record.bytes_downloaded)
        if record.outcome != "completed":
            return
        self._last_completed = time.time()
        self.duration.labels(job).observe(record.duration)
        for phase, seconds in (("total", record.duration), ("snapshot", record.snapshot_seconds),
                               ("complete", record.complete_seconds)):
            self.last_seconds.labels(job, phase).set(seconds)
        self.last_uploaded.labels(job).set(record.bytes_uploaded)
        self.state_size.labels(job).set(record.state_size)
        self.checkpoint_id.labels(job).set(record.checkpoint_id)

    def _since_last(self) -> float:
        return -1.0 if self._last_completed is None else time.time() - self._last_completed

    def _cleaner_figure(self, name: str) -> float:
        if self._cleaner is None:
            return 0.0
        status = self._cleaner()
        if name == "backlog":
            return float(status.pending_keys + status.pending_dirs)
        return float(status.failures)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
