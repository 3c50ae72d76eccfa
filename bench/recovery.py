"""Recovery is not slowed by cleanup: time-to-first-processed-batch after a restart with
100,000 orphan files in the job directory versus none.

Per repetition and variant: a job runs 3 checkpointed batches (epoch 1) and its driver
"dies" (nothing drained, lease not released). For the orphan variant, 100,000 tiny files
named like real data files of that older epoch are added under shared/ and exclusive/.
Then the clock starts: a new attempt starts (claims epoch 2, restores from the HA store,
starts the reconcile in the background), reopens its tasks' RocksDB state, processes batch
4 and completes checkpoint 4; the clock stops. The reconcile's own duration is reported
separately (and its result checked: every orphan is gone afterwards).

Usage: python bench/recovery.py [--orphans 100000] [--reps 5] [--root DIR]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from statehold.storage import open_storage  # noqa: E402
from tests.support import crash_driver as drv  # noqa: E402  (the crash suite's driver, used in-process)

drv.phase = lambda *words: None  # quiet


def make_orphans(job: Path, count: int) -> None:
    """Tiny files named like real data files of epoch 1 (older than the restart's)."""
    for d in ("shared", "exclusive"):
        (job / d).mkdir(parents=True, exist_ok=True)
    for i in range(count):
        d = "shared" if i % 2 else "exclusive"
        name = f"e1-c{1 + i % 3}-{uuid.uuid4().hex[:16]}-orphan{i:06d}.sst"
        with open(job / d / name, "wb") as f:
            f.write(b"x")


def one_run(root: Path, orphans: int, seed: int) -> tuple[float, float, int]:
    """(seconds to first processed batch, seconds until the reconcile finished, orphans
    left after it)."""
    work = root / f"run-{uuid.uuid4().hex[:8]}"
    job, local = work / "job", work / "local"
    storage = open_storage(str(job))
    first = drv.Driver(storage, local, 2)
    first.open_tasks()
    for b in (1, 2, 3):
        first.run_batch(b, seed)
    first.coord.wait_reconciled(60)
    first.coord.cleaner.close()  # the driver dies: nothing drained,
    assert first.coord.lease is not None
    first.coord.lease.stop(release=False)  # its lease is not released
    for be in first.backends:
        be.close()
    make_orphans(job, orphans)

    t0 = time.perf_counter()
    second = drv.Driver(storage, local, 2)
    second.open_tasks()
    second.run_batch(4, seed)
    t1 = time.perf_counter()
    assert second.coord.wait_reconciled(600)
    t2 = time.perf_counter()
    leftover = sum(1 for info in storage.list() if "-orphan" in info.key)
    for be in second.backends:
        be.close()
    second.coord.close()
    second.pool.shutdown()
    first.pool.shutdown()
    shutil.rmtree(work, ignore_errors=True)
    return t1 - t0, t2 - t0, leftover


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--orphans", type=int, default=100_000)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--root", type=Path, default=None, help="scratch dir (default: a temp dir)")
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="statehold-bench-", dir=args.root))
    results: dict[int, list[tuple[float, float, int]]] = {0: [], args.orphans: []}
    try:
        one_run(root, 0, 0)  # warm-up (imports, RocksDB, page cache)
        for rep in range(args.reps):
            order = [0, args.orphans] if rep % 2 == 0 else [args.orphans, 0]
            for n in order:
                r = one_run(root, n, rep)
                results[n].append(r)
                print(f"rep {rep} orphans={n:>7}: first batch {r[0] * 1000:7.1f} ms, "
                      f"reconcile done {r[1]:6.2f} s, orphans left {r[2]}",
                      flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    base = statistics.median(r[0] for r in results[0])
    loaded = statistics.median(r[0] for r in results[args.orphans])
    rec = statistics.median(r[1] for r in results[args.orphans])
    print()
    print(f"machine: nproc={os.cpu_count()}, cpu={cpu_model()}, "
          f"python={platform.python_version()}, storage=local ({root.parent})")
    print(f"median time to first processed batch, no orphans:       {base * 1000:7.1f} ms")
    print(f"median time to first processed batch, {args.orphans} orphans: {loaded * 1000:7.1f} ms")
    print(f"ratio: {loaded / base:.3f} (goal <= 1.1)")
    print(f"median time until the background reconcile finished ({args.orphans} orphans): "
          f"{rec:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
