"""Physical limits the benchmark's results are read against: the disk's sequential write
bandwidth and how fast files can be deleted locally and on S3 (moto on 127.0.0.1).

    python bench/_physical.py [--dir DIR]

Cleanup cost is dominated by the number of files, not their size, so deletes are counted
per second; the S3 numbers compare statehold's bulk DeleteObjects with one request per
object (what a client without bulk deletes pays). Moto is a Python server sharing this
machine's cores, so its absolute rates say little about AWS; the ratios are the point.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import obstore
from obstore.store import S3Store

from statehold.storage import open_storage
from statehold.storage.s3 import S3Storage

SMALL_FILE = b"x" * 128  # the size of a small checkpoint file; deletes don't care


def disk_write_bandwidth(directory: Path, size_bytes: int = 1 << 30, block: int = 8 << 20) -> float:
    """Sequential write bandwidth (bytes/s) of the filesystem holding `directory`.

    Writes `size_bytes` of random (incompressible) data, one block generated once and
    reused, to a temp file and fsyncs before stopping the clock, so the page cache cannot
    hide the device. Best of 3 runs: interference from other processes only ever slows a
    run down, so the fastest run is the closest to the device's limit.
    """
    data = os.urandom(block)
    blocks, rest = divmod(size_bytes, block)
    best = 0.0
    for _ in range(3):
        fd, name = tempfile.mkstemp(dir=directory, prefix=".bench-write-")
        try:
            t0 = time.perf_counter()
            for _ in range(blocks):
                os.write(fd, data)
            if rest:
                os.write(fd, data[:rest])
            os.fsync(fd)
            elapsed = time.perf_counter() - t0
        finally:
            os.close(fd)
            os.unlink(name)
        best = max(best, size_bytes / elapsed)
    return best


def fsync_latency(directory: Path, n: int = 50) -> float:
    """Median seconds to create, write 4 KiB to and fsync one new file in `directory`:
    what making one more file durable costs, whatever its size. A checkpoint of a small
    change is bound by this more than by bandwidth."""
    data = os.urandom(4096)
    times = []
    for _ in range(n):
        fd, name = tempfile.mkstemp(dir=directory, prefix=".bench-fsync-")
        try:
            t0 = time.perf_counter()
            os.write(fd, data)
            os.fsync(fd)
            times.append(time.perf_counter() - t0)
        finally:
            os.close(fd)
            os.unlink(name)
    return sorted(times)[len(times) // 2]


def local_deletes_per_second(directory: Path, n: int = 20000) -> float:
    """Files deleted per second by `LocalStorage.delete_many` (creating them is not timed).

    The n small files are spread over a checkpoint-like layout (``shared/`` and
    ``chk-1/``) in a fresh subdirectory of `directory`, which is removed afterwards.
    """
    root = Path(tempfile.mkdtemp(dir=directory, prefix=".bench-delete-"))
    try:
        keys = [f"{'shared' if i % 2 else 'chk-1'}/{uuid.uuid4().hex}.sst" for i in range(n)]
        for sub in ("shared", "chk-1"):
            (root / sub).mkdir()
        for key in keys:
            (root / key).write_bytes(SMALL_FILE)
        storage = open_storage(str(root))
        t0 = time.perf_counter()
        storage.delete_many(keys)
        elapsed = time.perf_counter() - t0
        left = sum(len(files) for _, _, files in os.walk(root))
        if left:
            raise RuntimeError(f"{left} files left after delete_many")
        return n / elapsed
    finally:
        shutil.rmtree(root, ignore_errors=True)


def s3_deletes_per_second(n: int = 5000) -> dict[str, float]:
    """Objects deleted per second on a local moto S3 server, three ways (PUTs not timed).

    - ``bulk``: `S3Storage.delete_many` (DeleteObjects, up to 1000 keys per request);
    - ``single``: one DeleteObject request per object, sequentially;
    - ``single_8_threads``: one request per object from 8 threads, a fairer per-object
      client. Each variant deletes its own n objects and checks by listing that none is left.
    Moto handles requests in Python under the GIL, on the same cores as the client, so
    threads barely help here; against AWS they would (latency-bound, not CPU-bound).
    """
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        creds = {"aws_access_key_id": "bench", "aws_secret_access_key": "bench"}
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", **creds).create_bucket(
            Bucket="bench"
        )
        opts = {
            "endpoint": endpoint,
            "region": "us-east-1",
            "access_key_id": "bench",
            "secret_access_key": "bench",
            "allow_http": True,
        }
        store = S3Store(
            "bench",
            config={k: v for k, v in opts.items() if k != "allow_http"},  # type: ignore[arg-type]
            client_options={"allow_http": True},
        )
        pool = ThreadPoolExecutor(8)

        def seed(paths: list[str]) -> None:
            """Moto serves ~300 PUTs/s here, so objects go straight into its in-process
            backend (the server runs in this process); over HTTP if its internals moved."""
            try:
                from moto.core.models import DEFAULT_ACCOUNT_ID
                from moto.s3.models import s3_backends

                backend = s3_backends[DEFAULT_ACCOUNT_ID]["global"]
                for p in paths:
                    backend.put_object("bench", p, SMALL_FILE)
            except (ImportError, AttributeError, KeyError, TypeError):
                list(pool.map(lambda p: obstore.put(store, p, SMALL_FILE), paths))

        keys = [f"shared/{i:06d}.sst" for i in range(n)]

        def run(prefix: str, delete: Callable[[list[str]], None]) -> float:
            paths = [f"{prefix}/{key}" for key in keys]
            seed(paths)
            stored = sum(len(chunk) for chunk in obstore.list(store, prefix + "/"))
            if stored != n:
                raise RuntimeError(f"{prefix}: {stored} objects stored, expected {n}")
            t0 = time.perf_counter()
            delete(paths)
            elapsed = time.perf_counter() - t0
            left = sum(len(chunk) for chunk in obstore.list(store, prefix + "/"))
            if left:
                raise RuntimeError(f"{prefix}: {left} objects left after deleting")
            return n / elapsed

        bulk = open_storage("s3://bench/bulk", **opts)
        assert isinstance(bulk, S3Storage)

        def one_by_one(paths: list[str]) -> None:
            for p in paths:
                obstore.delete(store, p)

        def threaded(paths: list[str]) -> None:
            list(pool.map(lambda p: obstore.delete(store, p), paths))

        result = {
            "bulk": run("bulk", lambda _paths: bulk.delete_many(keys)),
            "single": run("single", one_by_one),
            "single_8_threads": run("single8", threaded),
        }
        pool.shutdown()
        return result
    finally:
        server.stop()


def _timed(label: str, fn: Callable[[], object]) -> None:
    t0 = time.perf_counter()
    value = fn()
    print(f"{label}: {value}  ({time.perf_counter() - t0:.1f} s)", flush=True)


def main() -> None:
    """Print every limit for the directory given (default: the system temp directory)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    args = parser.parse_args()
    t0 = time.perf_counter()
    print(f"# {os.cpu_count()} cores; directory {args.dir}")
    _timed("disk write MB/s", lambda: round(disk_write_bandwidth(args.dir) / 1e6))
    _timed("local deletes/s", lambda: round(local_deletes_per_second(args.dir)))
    _timed(
        "s3 (moto) deletes/s",
        lambda: {k: round(v) for k, v in s3_deletes_per_second().items()},
    )
    print(f"# total {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
