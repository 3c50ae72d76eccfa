"""tests/support/crash_driver.py with a short lease and self-pauses, for
tests/cleanup/test_gc_race.py.

    PYTHONPATH=. python tests/support/gc_race_driver.py JOB_URI LOCAL_DIR [--batches N] [--seed S]
        [--lease-ttl SECONDS] [--pause PHASE:N ...]

The same job as crash_driver (the same batches, checkpoints, planned aborts, savepoints
and job end, the same ``PHASE ...`` lines), with two changes:

* the coordinator's lease ttl is `--lease-ttl` (crash_driver keeps the default of two
  minutes, longer than a test can wait for a lease to lapse);
* at each ``--pause PHASE:N`` the driver stops itself (SIGSTOP) right after printing
  ``PHASE <phase> <n>``, so a test can keep it stopped past its lease and resume it.

A checkpoint the coordinator refuses to complete because the lease lapsed since it began
(`Lease.unbroken_since`) is reported as ``PHASE refused <n>`` and then handled like any
failed checkpoint: abort, roll the tasks back, run the batch again.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from statehold.checkpoint.coordinator import CheckpointCoordinator, CheckpointError
from statehold.storage import StorageError, open_storage
from tests.support import crash_driver as cd


class LeaseLapsed(StorageError):
    """complete() was refused after a pause: crash_driver retries a batch whose checkpoint
    failed with a StorageError, which is exactly what a driver should do here."""


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("job_uri")
    p.add_argument("local_dir", type=Path)
    p.add_argument("--batches", type=int, default=16)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--lease-ttl", type=float, default=2.0)
    p.add_argument("--pause", action="append", default=[], help="PHASE:N, may repeat")
    args = p.parse_args(argv)
    pauses = {(phase, int(n)) for phase, n in (x.split(":") for x in args.pause)}
    ttl = args.lease_ttl

    class ShortLease(CheckpointCoordinator):
        @classmethod
        def start(cls, *a: Any, **kw: Any) -> CheckpointCoordinator:
            kw.setdefault("lease_ttl", ttl)
            return super().start(*a, **kw)

    print_phase = cd.phase

    def phase(*words: object) -> None:
        print_phase(*words)
        where = (str(words[0]), int(str(words[1])) if len(words) > 1 else 0)
        if where in pauses:
            pauses.discard(where)
            os.kill(os.getpid(), signal.SIGSTOP)

    cd.phase = phase
    cd.CheckpointCoordinator = ShortLease  # type: ignore[misc]
    driver = cd.Driver(open_storage(args.job_uri), args.local_dir, parallelism=2)
    complete = driver.coord.complete

    def complete_or_retry(n: int, position: Any = None) -> Any:
        try:
            return complete(n, position)
        except CheckpointError as e:
            if "lease lapsed" not in str(e):
                raise
            phase("refused", n)
            raise LeaseLapsed(str(e)) from e

    driver.coord.complete = complete_or_retry  # type: ignore[method-assign]
    return driver.run(args.batches, args.seed)


if __name__ == "__main__":
    sys.exit(main())
