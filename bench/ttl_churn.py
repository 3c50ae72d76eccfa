"""Storage under TTL churn in one task's RocksDB backend, without Spark: where the bytes go
and where storage levels off, for each way of deciding when to compact.

    python bench/ttl_churn.py                          # 2000 users/cohort, 40 batches
    python bench/ttl_churn.py --users 500 --batches 20 --policy none,garbage
    python bench/ttl_churn.py --resident 50000         # + users written once, never expiring

The workload is bench/sessions.py's, driven through the processor handle directly: a
cohort of users arrives every batch, stays `active` batches (per batch a session value,
its event-time timer moved, a profile with a TTL), then goes silent; its timers clear the
sessions and the TTL sweep the profiles. `--resident` users are written in the first
batch and never again (state that outlives the churn). Every batch runs in a task of its
own restored from the previous checkpoint, as on Spark, and ends as a task's does:
timers, sweep, compaction decision, snapshot into a local job directory, `commit_local`.
Per batch: bytes uploaded, the newest checkpoint's files, the files of the last `retain`
checkpoints together (what a job directory keeps), and the live state (`compacted_bytes`:
the same entries fully compacted, the least a checkpoint could hold). Policies: `none`
(universal compaction alone), `garbage` (what a task runs:
`statehold.backend.ttl.expire_and_compact`), `garbage=F` (with the backend option
`max_garbage` F instead of its default).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

from statehold.backend import TaskStateBackend, sources_from_metadata, task_range
from statehold.backend.rocks import RestoreSource
from statehold.backend.ttl import MAX_GARBAGE, expire_and_compact, sweep_expired
from statehold.format import layout
from statehold.format.metadata import (
    CheckpointMetadata,
    KeyGroupState,
    OperatorState,
    encode,
    read_metadata,
)
from statehold.processor.api import TimeMode
from statehold.processor.handle import StatefulProcessorHandle
from statehold.storage import Storage, open_storage

MAXP = 128
OP = "sessions"
STEP_MS = 60_000


def compacted_bytes(storage: Storage, metadata_key: str, scratch: Path) -> int:
    """The live state of a checkpoint: the bytes it would hold with every range's DB fully
    compacted (nothing shadowed, no tombstones), plus its other files (RocksDB's OPTIONS),
    the least any checkpoint of the same entries holds. Restores each range into
    `scratch` (deleted after)."""
    meta = read_metadata(storage, metadata_key)
    total = 0
    try:
        for op in meta.operators:
            sources = sources_from_metadata(storage, metadata_key, meta, op.operator)
            for kg in op.ranges:
                with TaskStateBackend.open(scratch, op.operator, kg.key_groups,
                                           meta.max_parallelism, sources) as b:
                    db = b._require_db()
                    db.compact_range(None, None)
                    total += sum(int(f["size"]) for f in db.live_files())
                total += sum(f.size for f in kg.files if not (f.name or "").endswith(".sst"))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return total


def _checkpoint(storage: Storage, cid: int, state: KeyGroupState) -> list[RestoreSource]:
    """Write chk-<cid>/_metadata and read it back as the next batch's restore sources."""
    key = layout.checkpoint_metadata_key(cid)
    meta = CheckpointMetadata(job_id="ttl-churn", checkpoint_id=cid, epoch=1,
                              max_parallelism=MAXP,
                              operators=[OperatorState(operator=OP, ranges=[state])])
    storage.write(key, encode(meta, key))
    return sources_from_metadata(storage, key, read_metadata(storage, key), OP)


def _batch(b: TaskStateBackend, n: int, users: int, active: int, resident: int,
           policy: str) -> dict[str, Any]:
    """Batch `n` of the workload in `b`, ended as a task ends it (timers, sweep, the
    compaction decision)."""
    now = (n + 1) * STEP_MS
    gap = ttl = STEP_MS * 3 // 2
    h = StatefulProcessorHandle(b._require_kv(), b.key_groups, MAXP, TimeMode.EVENT_TIME,
                                now, now)
    session = h.get_value_state("session")
    profile = h.get_value_state("profile", ttl=ttl)
    if n == 0:
        home = h.get_value_state("home")
        for u in range(resident):
            h._bind(f"resident-u{u:07d}")
            home.update([u, f"/p/{u % 1000}", "x" * 20])
    for cohort in range(max(0, n - active + 1), n + 1):
        for u in range(users):
            h._bind(f"c{cohort:04d}-u{u:06d}")
            current = session.get()
            if current is not None:
                h.delete_timer(current[1] + gap)
            session.update([current[0] if current else now, now, n])
            h.register_timer(now + gap)
            old = profile.get() or [0, ""]
            profile.update([old[0] + 1, f"/p/{(u * 7 + n) % 1000}"])
    fired = 0
    for expiry, group, key in h.timers.due(now):
        h.timers.delete(group, key, expiry)
        h._bind(key, group)
        session.clear()
        fired += 1
    if policy.startswith("garbage"):  # what a task runs; garbage=F: max_garbage F
        limit = float(policy.partition("=")[2] or MAX_GARBAGE)
        expired, compacted = expire_and_compact(b._require_kv(), b._require_db(),
                                                b.key_groups, now, limit)
    else:
        expired, compacted = sweep_expired(b._require_kv(), b.key_groups, now), False
    return {"timers_fired": fired, "ttl_expired": expired, "compacted": bool(compacted)}


def run(policy: str, users: int, active: int, resident: int, batches: int, retain: int,
        work: Path) -> list[dict[str, Any]]:
    """Every batch in a task of its own, restored from the previous checkpoint (as on
    Spark: from the executor's local snapshot, nothing downloaded)."""
    storage = open_storage(str(work / "job"))
    steps: list[dict[str, Any]] = []
    held: list[dict[str, int]] = []  # per retained checkpoint: file key -> size
    sources: list[RestoreSource] | None = None
    for n in range(batches):
        cid = n + 1
        b = TaskStateBackend.open(work / "local", OP, task_range(0, 1, MAXP), MAXP, sources)
        step: dict[str, Any] = {"batch": n, **_batch(b, n, users, active, resident, policy)}
        key = layout.checkpoint_metadata_key(cid)
        state = b.snapshot(storage, 1, cid, key)
        b.commit_local(cid)
        compaction = b.close_after_compactions()  # as a Spark task closes
        if compaction is not None:
            compaction.join()  # repeatable: the next batch opens its result
        sources = _checkpoint(storage, cid, state)
        step["live_bytes"] = compacted_bytes(storage, key, work / "scratch")
        files = {layout.resolve(key, f.path): f.size for f in state.files}
        held = [*held, files][-retain:]
        retained = {k: s for fs in held for k, s in fs.items()}
        steps.append({
            **step,
            "bytes_uploaded": int(state.info["bytes_uploaded"]),
            "newest_checkpoint_bytes": int(state.info["state_size"]),
            "retained_bytes": sum(retained.values()),
        })
    return steps


def summary(steps: list[dict[str, Any]], active: int) -> dict[str, Any]:
    """From the first batch where the live set is whole and expiry runs (users of the
    first cohort expired) on."""
    steady = steps[active + 2:]
    newest = [s["newest_checkpoint_bytes"] / s["live_bytes"] for s in steady]
    kept = [s["retained_bytes"] / s["live_bytes"] for s in steady]
    up = [s["bytes_uploaded"] for s in steady]
    return {
        "batches": len(steady),
        "compactions": sum(s["compacted"] for s in steady),
        "live_bytes_median": statistics.median(s["live_bytes"] for s in steady),
        "newest_over_live_median": round(statistics.median(newest), 3),
        "newest_over_live_max": round(max(newest), 3),
        "retained_over_live_median": round(statistics.median(kept), 3),
        "retained_over_live_max": round(max(kept), 3),
        "uploaded_median": statistics.median(up),
        "uploaded_mean": round(statistics.mean(up)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--users", type=int, default=2000, help="users per cohort")
    ap.add_argument("--active", type=int, default=3, help="batches a cohort stays active")
    ap.add_argument("--resident", type=int, default=0,
                    help="users written in the first batch, never expiring")
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--retain", type=int, default=3)
    ap.add_argument("--policy", default="none,garbage")
    ap.add_argument("--out", default=None, help="write every batch's figures here (JSON)")
    ap.add_argument("--verbose", action="store_true", help="print every batch")
    args = ap.parse_args()
    results = {}
    for policy in args.policy.split(","):
        with tempfile.TemporaryDirectory(prefix="ttl-churn-") as tmp:
            steps = run(policy, args.users, args.active, args.resident, args.batches,
                        args.retain, Path(tmp))
        if args.verbose:
            for s in steps:
                print(policy, json.dumps(s))
        results[policy] = {"summary": summary(steps, args.active), "steps": steps}
        print(policy, json.dumps(results[policy]["summary"]))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
