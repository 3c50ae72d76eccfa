"""No-claim restore vs. a full re-upload: time to the first completed checkpoint.

    python bench/no_claim.py [--keys 200000] [--repeat 3] [--backends local,s3]

Both variants start a new job from the same source checkpoint and complete its first
checkpoint after changing 1% of the keys, with a fresh local disk (so both download the
state once):
- no-claim: `restore_into` copies the source's files into the new job directory by hard
  link (local) or server-side copy (S3), then the tasks snapshot incrementally;
- re-upload: the tasks restore straight from the source and upload every file into the
  new job directory (what a restore without statehold's copy step costs).
Prints medians of the first checkpoint's time — copying the source's files (no-claim
only), snapshots, uploads, `_metadata`, HA publish — and the ratio no-claim / re-upload
(the goal is <= 0.2); the last column is the ratio of the whole restart, which also
includes opening the state (download) and applying the batch, the same in both.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from statehold.backend import (
    TaskStateBackend,
    key_group_of,
    sources_from_metadata,
    task_range,
)
from statehold.checkpoint.coordinator import CheckpointCoordinator
from statehold.checkpoint.restore import restore_into
from statehold.format.metadata import RestoreMode, read_metadata
from statehold.ha.embedded import EmbeddedHAStore
from statehold.storage import Storage, open_storage

OPERATOR = "bench"
MAX_PARALLELISM = 32
PARALLELISM = 2
PAYLOAD_BYTES = 64  # random hex, so compression cannot hide the state's size


def run_checkpoint(
    coord: CheckpointCoordinator,
    restore_from: tuple[Storage, str] | None,
    local: Path,
    keys: range,
    checkpoint_id: int,
) -> float:
    """One checkpoint: every task restores (from `restore_from`, else the job's own
    latest), writes `keys` in its range, snapshots into the job directory. Returns the
    seconds spent checkpointing: snapshots, uploads, `_metadata` and HA publish (opening
    and updating the state cost the same in both variants and are left out)."""
    checkpointing = 0.0
    rng = random.Random(checkpoint_id)
    coord.begin(checkpoint_id)
    restore = None
    if restore_from is not None:
        storage, key = restore_from
        restore = sources_from_metadata(storage, key, read_metadata(storage, key), OPERATOR)
    elif (latest := coord.latest()) is not None:
        restore = sources_from_metadata(coord.storage, latest[0], latest[1], OPERATOR)
    for task in range(PARALLELISM):
        kg = task_range(task, PARALLELISM, MAX_PARALLELISM)
        with TaskStateBackend.open(local, OPERATOR, kg, MAX_PARALLELISM, restore) as backend:
            for i in keys:
                k = f"key-{i}"
                if key_group_of(k, MAX_PARALLELISM) in kg:
                    backend.for_key(k).value("v").update(rng.randbytes(PAYLOAD_BYTES).hex())
            t0 = time.perf_counter()
            handle = backend.snapshot(
                coord.storage, coord.epoch, checkpoint_id, f"chk-{checkpoint_id}/_metadata"
            )
            checkpointing += time.perf_counter() - t0
        coord.acknowledge(checkpoint_id, OPERATOR, handle)
    t0 = time.perf_counter()
    coord.complete(checkpoint_id)
    return checkpointing + time.perf_counter() - t0


def start(job: Storage, job_id: str) -> CheckpointCoordinator:
    return CheckpointCoordinator.start(
        job, EmbeddedHAStore(job), job_id=job_id, max_parallelism=MAX_PARALLELISM,
        reconcile_in_background=False,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--backends", default="local,s3")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="statehold-bench-"))
    server = None
    roots: dict[str, Callable[[str], Storage]] = {
        "local": lambda name: open_storage(str(work / "jobs" / name)),
    }
    if "s3" in args.backends:
        import boto3
        from moto.server import ThreadedMotoServer

        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        opts = dict(endpoint=f"http://{host}:{port}", region="us-east-1",
                    access_key_id="bench", secret_access_key="bench", allow_http=True)
        boto3.client("s3", endpoint_url=opts["endpoint"], region_name="us-east-1",
                     aws_access_key_id="bench", aws_secret_access_key="bench"
                     ).create_bucket(Bucket="bench")
        roots["s3"] = lambda name: open_storage(f"s3://bench/{name}", **opts)  # type: ignore[arg-type]

    print(f"# machine: {os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
          f"Python {sys.version.split()[0]}; keys={args.keys}, 1% changed")
    print("| storage | state bytes | no-claim s | re-upload s | ratio | whole-restart ratio |")
    print("|---|---|---|---|---|---|")
    for backend_name in args.backends.split(","):
        make = roots[backend_name]
        source = make("source")
        coord = start(source, "source")
        run_checkpoint(coord, None, work / "local-src", range(args.keys), 1)
        coord.close()
        source_key = "chk-1/_metadata"
        state_bytes = sum(i.size for i in source.list("shared"))
        changed = range(0, args.keys, 100)
        times: dict[str, list[float]] = {"no-claim": [], "re-upload": []}
        totals: dict[str, list[float]] = {"no-claim": [], "re-upload": []}
        for rep in range(args.repeat):
            for variant in ("no-claim", "re-upload"):
                local = work / f"local-{backend_name}-{variant}-{rep}"
                target = make(f"{variant}-{rep}")
                t0 = time.perf_counter()
                if variant == "no-claim":
                    restore_into(source, source_key, target, EmbeddedHAStore(target),
                                 job_id=variant, mode=RestoreMode.NO_CLAIM)
                    copying = time.perf_counter() - t0
                    job = start(target, variant)
                    checkpointing = copying + run_checkpoint(job, None, local, changed, 2)
                else:
                    job = start(target, variant)
                    checkpointing = run_checkpoint(job, (source, source_key), local, changed, 2)
                totals[variant].append(time.perf_counter() - t0)
                times[variant].append(checkpointing)
                job.close()
                shutil.rmtree(local, ignore_errors=True)
        a, b = statistics.median(times["no-claim"]), statistics.median(times["re-upload"])
        ta, tb = statistics.median(totals["no-claim"]), statistics.median(totals["re-upload"])
        print(f"| {backend_name} | {state_bytes} | {a:.2f} | {b:.2f} | {a / b:.2f} "
              f"| {ta / tb:.2f} |")
    if server is not None:
        server.stop()
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
