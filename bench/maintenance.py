"""Maintenance at scale: gc, du and verify over many files, on local disk and S3 (moto).

    python bench/maintenance.py                          # 1,000,000 local, 100,000 on S3
    python bench/maintenance.py --files 20000 --s3-files 2000 --no-spark   # a smoke run

Local disk: a job directory with `--files` orphans in ``shared/`` beside a live job (a
running coordinator: three completed checkpoints and a fourth in flight, its lease
renewed throughout). An identical tree of the same file names is deleted with
``find DIR -type f -delete`` in the same run; then ``statehold gc`` runs as a child
process. Reported: gc time over find time, files per second, and the child's own peak
RSS (its ``VmHWM`` at exit) of gc, du and verify. Afterwards every live file is checked
by listing and the in-flight checkpoint must complete.

S3 (moto, in this process): `--s3-files` orphans beside a live job; gc's bulk deletes
(DeleteObjects, 1,000 keys a request) against one DELETE per object (measured on a
sample), and the local gc against ``statehold gc --spark`` on ``local-cluster[2,1,1024]``
(its wall time includes starting Spark). The orphans are written straight into moto's
in-process backend (`--populate direct`, the default: the same objects a PUT makes, in
seconds); `--populate put` PUTs them over HTTP, many in flight, which moto's server caps
at a few hundred a second. The live job's files always go through statehold over HTTP.

Each measured child records the 1-minute load average before and after it ran.

Prints one JSON document (also written to `--out`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from statehold.checkpoint.coordinator import CheckpointCoordinator
from statehold.format import layout
from statehold.format.layout import Scope
from statehold.format.metadata import KeyGroupRange, KeyGroupState, StateFile
from statehold.job.directory import open_job
from statehold.storage import Storage, open_storage

RANGES = [KeyGroupRange(start=0, end=3), KeyGroupRange(start=4, end=7)]
SPARK_MASTER = "local-cluster[2,1,1024]"


def snapshot(
    storage: Storage, coord: CheckpointCoordinator, n: int, kg: KeyGroupRange
) -> KeyGroupState:
    """One task's checkpoint: a new shared file and an exclusive one."""
    metadata_key = layout.checkpoint_metadata_key(n)
    files = []
    for scope, key in (
        (Scope.SHARED, layout.shared_key(coord.epoch, n, f"kg{kg.start}")),
        (Scope.EXCLUSIVE, layout.exclusive_key(coord.epoch, n, "manifest")),
    ):
        data = os.urandom(64)
        storage.write(key, data)
        files.append(
            StateFile(path=layout.relativize(metadata_key, key), scope=scope, size=len(data),
                      checksum="sha256:" + hashlib.sha256(data).hexdigest())
        )
    return KeyGroupState(key_groups=kg, files=files)


def live_job(storage: Storage) -> CheckpointCoordinator:
    """A running attempt: checkpoints 1-3 completed, 4 begun with its uploads done."""
    coord = CheckpointCoordinator.start(
        open_job(storage, "embedded", job_id="job", create=True), max_parallelism=8, retain=2
    )
    coord.wait_reconciled(60)
    for n in (1, 2, 3, 4):
        coord.begin(n)
        for kg in RANGES:
            coord.acknowledge(n, "agg", snapshot(storage, coord, n, kg))
        if n < 4:
            coord.complete(n, {"batch_id": n})
    coord.cleaner.wait_idle(60)  # checkpoint 1, subsumed, is gone: the rest is live
    return coord


def orphan_names(epoch: int, count: int) -> Iterator[str]:
    """Data-file names of finished checkpoints (1-3) nobody references: deletable."""
    for i in range(count):
        yield f"e{epoch}-c{1 + i % 3}-{i:016x}"


def make_files(directory: Path, names: Iterator[str]) -> int:
    directory.mkdir(parents=True, exist_ok=True)
    fd_dir = os.open(directory, os.O_RDONLY)
    count = 0
    try:
        for name in names:
            os.close(os.open(name, os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd_dir))
            count += 1
    finally:
        os.close(fd_dir)
    return count


def count_files(root: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(root))


#: Runs `python -m statehold ARGS` and, at exit, writes its own peak RSS (VmHWM, kB) to
#: $BENCH_PEAK_FILE. Not `wait4`'s ru_maxrss: Linux carries the parent's high-water mark
#: across fork and exec, so a child of this process (which holds moto and its objects)
#: would report this process's memory, not its own.
_PEAK = """
import atexit, os, runpy, sys
def _peak():
    with open("/proc/self/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    with open(os.environ["BENCH_PEAK_FILE"], "w") as out:
        out.write(str(kb))
atexit.register(_peak)
sys.argv = ["statehold", *sys.argv[1:]]
runpy.run_module("statehold", run_name="__main__", alter_sys=True)
"""


def load() -> float:
    return round(os.getloadavg()[0], 1)


def run_measured(cmd: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run a child to completion: wall time and (for statehold) its own peak RSS (MB),
    and the load average before and after it."""
    load_before = load()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile(suffix=".peak") as peak:
        env = {**(env or os.environ), "BENCH_PEAK_FILE": peak.name}
        start = time.perf_counter()
        proc = subprocess.run(cmd, stdout=out, stderr=err, env=env, check=False)
        elapsed = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        kb = Path(peak.name).read_text().strip()
        result = {
            "seconds": round(elapsed, 3),
            "peak_mb": round(int(kb) / 1024, 1) if kb else None,
            "rc": proc.returncode,
            "stdout": out.read().decode(),
            "stderr": err.read().decode()[-2000:],
            "load": [load_before, load()],
        }
    if result["rc"] != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({result['rc']}): {result['stderr']}")
    return result


def statehold(*args: str) -> list[str]:
    return [sys.executable, "-c", _PEAK, *args]


def check_live(
    storage: Storage, coord: CheckpointCoordinator, live_before: set[str]
) -> set[str]:
    """Every file the live job had is still listed, and checkpoint 4 completes; the
    listing after the gc."""
    listed = {i.key for i in storage.list()}
    lost = live_before - listed
    if lost:
        raise SystemExit(f"gc deleted live files: {sorted(lost)[:5]}")
    coord.complete(4, {"batch_id": 4})
    return listed


def bench_local(work: Path, files: int) -> dict[str, Any]:
    job_dir = work / "job"
    storage = open_storage(str(job_dir))
    coord = live_job(storage)
    try:
        live_before = {i.key for i in storage.list()}
        t = time.perf_counter()
        make_files(job_dir / layout.SHARED_DIR, orphan_names(coord.epoch, files))
        build = time.perf_counter() - t
        twin = work / "find-tree"
        make_files(twin / layout.SHARED_DIR, orphan_names(coord.epoch, files))
        for name in live_before:  # the live job's few files too: an identical tree
            (twin / name).parent.mkdir(parents=True, exist_ok=True)
            (twin / name).write_bytes((job_dir / name).read_bytes())
        du_sb = run_measured(["du", "-sb", str(job_dir)])
        du = run_measured(statehold("du", str(job_dir), "--json"))
        if json.loads(du["stdout"])["total_files"] < files:
            raise SystemExit("statehold du counted fewer files than the tree holds")
        verify = run_measured(statehold("verify", str(job_dir), "--json"))
        find = run_measured(["find", str(twin), "-type", "f", "-delete"])
        gc = run_measured(statehold("gc", str(job_dir), "--json"))
        report = json.loads(gc["stdout"])
        check_live(storage, coord, live_before)
        left = count_files(job_dir / layout.SHARED_DIR)
    finally:
        coord.close()
    deleted = report["deleted"]
    if deleted != files:
        raise SystemExit(f"gc deleted {deleted} of {files} orphans")
    return {
        "files": files,
        "build_seconds": round(build, 1),
        "find_delete_seconds": find["seconds"],
        "gc_seconds": gc["seconds"],
        "gc_over_find": round(gc["seconds"] / find["seconds"], 2),
        "gc_files_per_second": round(files / gc["seconds"]),
        "find_files_per_second": round(files / find["seconds"]),
        "gc_peak_mb": gc["peak_mb"],
        "du_seconds": du["seconds"],
        "du_sb_seconds": du_sb["seconds"],
        "du_over_du_sb": round(du["seconds"] / du_sb["seconds"], 2),
        "du_peak_mb": du["peak_mb"],
        "verify_seconds": verify["seconds"],
        "verify_peak_mb": verify["peak_mb"],
        "load": {k: r["load"] for k, r in
                 (("du_sb", du_sb), ("du", du), ("verify", verify), ("find", find), ("gc", gc))},
        "live_files_kept": len(live_before),
        "shared_files_left": left,
    }


@contextmanager
def moto() -> Iterator[dict[str, str]]:
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_ALLOW_HTTP": "true",
    }
    boto3.client(
        "s3", endpoint_url=env["AWS_ENDPOINT_URL"], aws_access_key_id="testing",
        aws_secret_access_key="testing", region_name="us-east-1",
    ).create_bucket(Bucket="bench")
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield env
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


#: How the S3 orphans are made: "direct" into the in-process moto backend, or "put".
POPULATE = "direct"
#: PUTs in flight when populating over HTTP (asyncio through obstore was no faster than
#: this many threads: moto's server is the bound, about 500 PUTs a second on a quiet
#: 2-core machine).
PUT_CONCURRENCY = 32


def put_many(storage: Storage, keys: list[str]) -> None:
    """Empty objects at `keys` (under `storage`'s S3 prefix): concurrent PUTs, or
    straight into moto's backend, which is what a PUT ends in."""
    if POPULATE == "direct":
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.s3.models import s3_backends

        backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
        bucket, prefix = storage.bucket, storage.prefix  # type: ignore[attr-defined]
        for key in keys:
            backend.put_object(bucket, f"{prefix}/{key}" if prefix else key, b"")
        return
    with ThreadPoolExecutor(PUT_CONCURRENCY) as pool:
        list(pool.map(lambda k: storage.write(k, b""), keys))


def s3_gc(uri: str, files: int, spark: bool, env: dict[str, str]) -> dict[str, Any]:
    storage = open_storage(uri)
    coord = live_job(storage)
    try:
        live_before = {i.key for i in storage.list()}
        names = [f"{layout.SHARED_DIR}/{n}" for n in orphan_names(coord.epoch, files)]
        t = time.perf_counter()
        put_many(storage, names)
        build = time.perf_counter() - t
        args = ["gc", uri, "--json"]
        if spark:
            args += ["--spark", "--master", SPARK_MASTER]
        run = run_measured(statehold(*args), env={**os.environ, **env})
        report = json.loads(run["stdout"])
        left = check_live(storage, coord, live_before).intersection(names)
        if left:
            raise SystemExit(f"S3 gc left {len(left)} orphans, e.g. {sorted(left)[:3]}")
    finally:
        coord.close()
    if report["deleted"] != files:
        raise SystemExit(f"S3 gc deleted {report['deleted']} of {files}")
    return {
        "seconds": run["seconds"],
        "files_per_second": round(files / run["seconds"]),
        "peak_mb": run["peak_mb"],
        "build_seconds": round(build, 1),
        "load": run["load"],
    }


def bench_s3(files: int, per_object_sample: int, spark: bool) -> dict[str, Any]:
    with moto() as env:
        result: dict[str, Any] = {"files": files}
        result["gc"] = s3_gc("s3://bench/local-job", files, False, env)
        print(json.dumps({"s3_gc": result["gc"]}), file=sys.stderr, flush=True)
        # one DELETE per object, on a sample
        storage = open_storage("s3://bench/per-object")
        keys = [f"{layout.SHARED_DIR}/{n}" for n in orphan_names(1, per_object_sample)]
        put_many(storage, keys)
        t = time.perf_counter()
        for key in keys:
            storage.delete_many([key])
        per_object = per_object_sample / (time.perf_counter() - t)
        put_many(storage, keys)
        t = time.perf_counter()
        storage.delete_many(keys)
        bulk = per_object_sample / (time.perf_counter() - t)
        result["per_object_files_per_second"] = round(per_object)
        result["bulk_files_per_second_same_sample"] = round(bulk)
        result["bulk_over_per_object"] = round(bulk / per_object, 1)
        result["gc_over_per_object"] = round(result["gc"]["files_per_second"] / per_object, 1)
        if spark:
            result["spark_gc"] = s3_gc("s3://bench/spark-job", files, True, env)
            result["spark_over_local"] = round(
                result["spark_gc"]["seconds"] / result["gc"]["seconds"], 2
            )
        return result


def machine() -> dict[str, Any]:
    mem = 0
    try:
        with open("/proc/meminfo") as f:
            mem = int(f.readline().split()[1]) // 1024
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "memory_mb": mem,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_at_start": [round(x, 1) for x in os.getloadavg()],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=1_000_000, help="local orphans")
    ap.add_argument("--s3-files", type=int, default=100_000, help="S3 orphans (0: skip S3)")
    ap.add_argument("--per-object-sample", type=int, default=2000)
    ap.add_argument("--no-spark", action="store_true", help="skip the --spark run")
    ap.add_argument("--populate", choices=("direct", "put"), default="direct",
                    help="S3 orphans: into moto's backend (default) or PUT over HTTP")
    ap.add_argument("--work", type=Path, default=None, help="work directory (default: temp)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    global POPULATE
    POPULATE = args.populate
    work = Path(tempfile.mkdtemp(prefix="statehold-maint-", dir=args.work))
    try:
        result: dict[str, Any] = {"machine": machine(), "command": " ".join(sys.argv)}
        if args.files:
            result["local"] = bench_local(work, args.files)
            print(json.dumps({"local": result["local"]}), file=sys.stderr, flush=True)
        if args.s3_files:
            sample = min(args.per_object_sample, args.s3_files)
            result["s3"] = bench_s3(args.s3_files, sample, not args.no_spark)
        result["load_at_end"] = [round(x, 1) for x in os.getloadavg()]
        text = json.dumps(result, indent=2)
        print(text)
        if args.out:
            args.out.write_text(text + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
