"""Where a checkpoint's time goes, outside Spark: the tasks' snapshots and the driver's
completion, timed and profiled (cProfile, by own time) on vs_spark.py's shape.

    python bench/checkpoint_profile.py                   # 100,000 keys, 2 tasks, 5%
    python bench/checkpoint_profile.py --keys 1000000 --fraction 0.01
    python bench/checkpoint_profile.py --changelog       # changelog commits
    python bench/checkpoint_profile.py --split [--changelog]

`--split` times the named parts of a snapshot and of a completion per call instead (no
profiler, whose overhead weighs on many small calls), and prints their medians.

Each checkpoint: every task restores the previous checkpoint (from its local snapshot),
updates `--fraction` of its keys (two 8-byte numbers and a 100-byte payload, as the
workload), snapshots into a local job directory and hands its DB on as a Spark task does
(`close_after_compactions`, joined here so runs stay comparable); then the coordinator
completes the checkpoint (embedded HA store). The first 5 checkpoints are left out.
Also printed: the disk's bound for the median checkpoint's new files in the job
directory (their bytes over sequential bandwidth, plus one fsync'd file's latency per
file), as vs_spark.py computes it.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import random
import statistics
import string
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _physical import disk_write_bandwidth, fsync_latency

from statehold.backend import TaskStateBackend, sources_from_metadata, task_of_key, task_range
from statehold.checkpoint.coordinator import CheckpointCoordinator
from statehold.format import layout
from statehold.ha.embedded import EmbeddedHAStore
from statehold.storage import Storage, open_storage

MAXP = 128

#: The parts `--split` times: (module, attribute, label); a class's method as "Class.name".
#: Each is wrapped where its caller looks it up (the module the call site reads it from).
PARTS = [
    ("statehold.backend.snapshot", "checkpoint_locally",
     "snapshot: RocksDB's flush and checkpoint directory"),
    ("statehold.backend.snapshot", "write_marker", "snapshot: the local snapshot's marker"),
    ("statehold.backend.changelog", "ChangeLog.finish",
     "snapshot: the changelog's last chunk compressed and closed"),
    ("statehold.backend.snapshot", "_store_changelog",
     "snapshot: the changelog written into the job and fsync'd"),
    ("statehold.backend.rocks", "TaskStateBackend.snapshot", "snapshot: all"),
    ("statehold.checkpoint.coordinator", "sealed", "complete: the metadata sealed"),
    ("statehold.checkpoint.published", "write_metadata_once",
     "complete: chk-N/_metadata written and fsync'd"),
    ("statehold.checkpoint.published", "publish_settled",
     "complete: the HA store's publish"),
    ("statehold.job.history", "Recorder.record", "complete: the history record"),
    ("statehold.checkpoint.coordinator", "CheckpointCoordinator.complete", "complete: all"),
]


def _time_parts() -> dict[str, list[float]]:
    """Wrap each of PARTS with a timer; returns label -> seconds per call."""
    import importlib

    times: dict[str, list[float]] = {label: [] for _, _, label in PARTS}
    for module, attr, label in PARTS:
        owner: Any = importlib.import_module(module)
        *path, name = attr.split(".")
        for p in path:
            owner = getattr(owner, p)
        original = getattr(owner, name)

        def timed(*a: Any, _f: Any = original, _t: list[float] = times[label],
                  **k: Any) -> Any:
            started = time.perf_counter()
            try:
                return _f(*a, **k)
            finally:
                _t.append(time.perf_counter() - started)

        setattr(owner, name, timed)
    return times


def _listing(storage: Storage) -> set[tuple[str, int]]:
    return {(f.key, f.size) for f in storage.list("")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--fraction", type=float, default=0.05)
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--checkpoints", type=int, default=45)
    parser.add_argument("--top", type=int, default=15, help="profile lines per part")
    parser.add_argument("--changelog", action="store_true",
                        help="commit by changelog (backend option changelog=True)")
    parser.add_argument("--split", action="store_true",
                        help="time named parts per call instead of profiling")
    args = parser.parse_args()
    parts = _time_parts() if args.split else None
    root = Path(tempfile.mkdtemp(prefix="checkpoint-profile-"))
    storage = open_storage(str(root / "job"))
    coord = CheckpointCoordinator.start(storage, EmbeddedHAStore(storage), job_id="profile",
                                        max_parallelism=MAXP, retain=3)
    ranges = [task_range(t, args.tasks, MAXP) for t in range(args.tasks)]
    keys: list[list[str]] = [[] for _ in range(args.tasks)]
    for i in range(args.keys):
        keys[task_of_key(f"user-{i}", args.tasks, MAXP)].append(f"user-{i}")
    rng = random.Random(1)
    snapshots, completes, sizes, files = [], [], [], []
    prof_snapshot, prof_complete = cProfile.Profile(), cProfile.Profile()
    for cid in range(args.checkpoints):
        measured = cid >= 5
        coord.begin(cid)
        latest = coord.latest()
        sources = None if latest is None else sources_from_metadata(
            storage, latest[0], latest[1], "op")
        before = _listing(storage)
        for task, key_range in enumerate(ranges):
            b = TaskStateBackend.open(root / "local", "op", key_range, MAXP, sources,
                                      changelog=args.changelog)
            chosen = keys[task] if cid == 0 else rng.sample(
                keys[task], int(len(keys[task]) * args.fraction))
            for k in chosen:
                payload = "".join(rng.choices(string.ascii_letters, k=100))
                b.value_state("v", k).update([rng.randrange(10**6), rng.randrange(10**6),
                                              payload])
            started = time.perf_counter()
            if measured and parts is None:
                prof_snapshot.enable()
            state = b.snapshot(storage, coord.epoch, cid, layout.checkpoint_metadata_key(cid))
            if measured:
                prof_snapshot.disable()
                snapshots.append(time.perf_counter() - started)
            thread = b.close_after_compactions()
            if thread is not None:
                thread.join()
            coord.acknowledge(cid, "op", state)
        started = time.perf_counter()
        if measured and parts is None:
            prof_complete.enable()
        coord.complete(cid, {"checkpoint": cid})
        if measured:
            prof_complete.disable()
            completes.append(time.perf_counter() - started)
            new = _listing(storage) - before  # every file the checkpoint wrote, as vs_spark
            sizes.append(sum(size for _, size in new))
            files.append(len(new))
    coord.close()
    bandwidth, fsync = disk_write_bandwidth(root, 1 << 28), fsync_latency(root)
    per_checkpoint = statistics.median(snapshots) * args.tasks + statistics.median(completes)
    bound = statistics.median(sizes) / bandwidth + statistics.median(files) * fsync
    print(f"task snapshot median {statistics.median(snapshots) * 1000:.2f} ms; driver "
          f"complete median {statistics.median(completes) * 1000:.2f} ms; a checkpoint "
          f"(snapshots summed over {args.tasks} tasks, as Spark sums commit times) "
          f"{per_checkpoint * 1000:.1f} ms")
    print(f"disk bound {bound * 1000:.2f} ms ({statistics.median(sizes) / 2**20:.2f} MiB at "
          f"{bandwidth / 2**20:,.0f} MiB/s, {statistics.median(files)} new files at "
          f"{fsync * 1000:.2f} ms): {per_checkpoint / bound:.1f}x the bound")
    if parts is not None:
        for label, seconds in parts.items():
            kept = seconds[len(seconds) // 9:]  # about the 5 unmeasured checkpoints out
            if kept:
                print(f"{label}: median {statistics.median(kept) * 1000:.2f} ms, "
                      f"{len(kept)} calls")
        return
    for name, prof in (("tasks' snapshots", prof_snapshot), ("driver's complete", prof_complete)):
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(args.top)
        print(f"== {name}\n{out.getvalue()}")


if __name__ == "__main__":
    main()
