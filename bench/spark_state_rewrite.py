"""Spark's own state read and repartitioned offline, side by side with what it is weighed
against, in one run:

    python bench/spark_state_rewrite.py [--keys 1000000] [--value-bytes 0] [--partitions 8]
                                        [--to 32] [--provider rocksdb_changelog] [--runs 3]
                                        [--s3] [--work DIR] [--keep DIR] [--out FILE]

A local Spark session runs `bench/verify_deep.py`'s streaming aggregation (``groupBy(key)``
with a count, a sum and, with ``--value-bytes B``, the largest of a B-character payload per
key, so the state grows to about keys × B bytes) over ``--partitions`` shuffle partitions
on the chosen state store layout, then, on the location it left, in turns, ``--runs``
times each:

* **read:** statehold's ``read_state`` of the newest batch (every partition, every row
  decoded into Arrow batches, in this process) against Spark's
  ``spark.read.format("statestore")`` of the same batch written to the ``noop`` sink (every
  row loaded and materialised by Spark's own provider). Rows per second of each, and the
  ratio (issue 43: statehold's at least Spark's);
* **read on S3** (``--s3``): the same read of the same location put on S3, a moto server
  on 127.0.0.1 in a child process (tests/support/infra/object_store_servers.py's; every
  file uploaded as it is, Spark's local ``.crc`` files left out, as a location S3A writes
  has none): statehold's ``read_state`` of ``s3://bucket/ckpt`` against Spark's
  ``statestore`` of ``s3a://bucket/ckpt`` (hadoop-aws on its class path, from the cache
  tests/support/infra/jvm.py fills, with Maven the first time). Both sides' bytes come
  from the same server over loopback HTTP;
* **repartition:** ``statehold repartition`` of that batch to ``--to`` partitions, in a
  child process (its peak resident memory, its own ``VmHWM``), against ``cp -r`` of
  the whole location. The ratio (issue 43: at most 5), and each side's CPU seconds from
  the kernel (what the machine's other load does not change); the peak memory is also
  taken on a location with a quarter of the keys, so whether it grows with the state
  shows.

``--keep DIR`` writes the locations under DIR and leaves them there; a later run with the
same ``--keep DIR`` reuses them instead of running the queries again (Spark takes minutes
to write 1 GB of state), so before and after are measured on the same bytes.

Medians, ratios and the machine are printed as one JSON document (also to ``--out``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from verify_deep import _PROVIDERS, _session, add_run_options, emit  # noqa: E402 - the bench folder on the path

#: A repartition that writes its own peak resident memory (VmHWM, KiB) to argv[4]. Not
#: `wait4`'s ru_maxrss: Linux carries the parent's high-water mark across fork and exec,
#: so it reported this process's (which has read the whole state) for every child.
#: The repartition's peak: the largest of its own (`VmHWM`) and its worker processes'
#: (`RUSAGE_CHILDREN`; a worker's counts the pages it was forked with before its exec,
#: so this is an upper bound), in KiB.
_REPARTITION = """
import resource, sys
from statehold.spark_checkpoints import open_spark_checkpoint
open_spark_checkpoint(sys.argv[1]).repartition(sys.argv[2], partitions=int(sys.argv[3]))
with open("/proc/self/status") as status:
    peak = int(next(line.split()[1] for line in status if line.startswith("VmHWM:")))
workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
with open(sys.argv[4], "w") as out:
    out.write(str(max(peak, workers)))
"""

#: The tests' moto server, in its own process (in this one it would share the GIL with
#: statehold's read), serving until its stdin closes; quiet.
_MOTO = """
import logging, sys
logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
from tests.support.infra.object_store_servers import AtomicConditionalMotoServer
server = AtomicConditionalMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
print(server.get_host_and_port()[1], flush=True)
sys.stdin.read()
server.stop()
"""
BUCKET, S3_PREFIX = "statehold-bench", "ckpt"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=1_000_000, help="distinct keys in the state")
    p.add_argument("--value-bytes", type=int, default=0,
                   help="payload characters per key (0: count and sum only)")
    p.add_argument("--batches", type=int, default=2, help="batches the query runs")
    p.add_argument("--partitions", type=int, default=8, help="the query's shuffle partitions")
    p.add_argument("--to", type=int, default=32, help="partitions to repartition to")
    p.add_argument("--s3", action="store_true",
                   help="also time both reads of the location put on S3 (a moto server)")
    p.add_argument("--keep", type=Path, default=None,
                   help="write the locations under DIR and keep them; reuse them if there")
    add_run_options(p)
    return p.parse_args(argv)


def write_inputs(folder: Path, keys: int, batches: int, value_bytes: int) -> None:
    """Batch i: its share of the keys, one JSON line each; the payload, where asked, is
    random hex (distinct per key and not compressible by lz4, so the files hold about
    `value_bytes` per key)."""
    folder.mkdir(parents=True)
    share = -(-keys // batches)
    for i in range(batches):
        with (folder / f"in-{i:04d}.json").open("w") as f:
            for k in range(i * share, min(keys, (i + 1) * share)):
                payload = os.urandom(-(-value_bytes // 2)).hex()[:value_bytes]
                f.write(f'{{"key":"k{k:09d}","value":{k % 97},"payload":"{payload}"}}\n')


def run_query(spark: Any, provider: str, inputs: Path, ckpt: Path, with_payload: bool) -> int:
    """The aggregation run to the end of its input; its last committed batch."""
    from pyspark.sql import functions as F

    for key, value in _PROVIDERS[provider].items():
        spark.conf.set(key, value)
    aggregates = [F.count("*").alias("count"), F.sum("value").alias("sum")]
    if with_payload:
        aggregates.append(F.max("payload").alias("payload"))
    stream = (spark.readStream.schema("key string, value long, payload string")
              .option("maxFilesPerTrigger", 1).json(str(inputs))
              .groupBy("key").agg(*aggregates))
    query = (stream.writeStream.format("noop").outputMode("update")
             .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())
    query.awaitTermination()
    last = query.lastProgress["batchId"]
    query.stop()
    return int(last)


def time_read(ckpt: Path | str, batch: int, **options: Any) -> tuple[float, int]:
    """statehold's offline read of every row: seconds, rows."""
    from statehold.spark_checkpoints import open_spark_checkpoint

    start = time.perf_counter()
    rows = sum(b.num_rows for b in
               open_spark_checkpoint(str(ckpt), **options).read_state(batch))
    return time.perf_counter() - start, rows


def time_spark_read(spark: Any, ckpt: Path | str, batch: int) -> float:
    start = time.perf_counter()
    (spark.read.format("statestore").option("batchId", batch).load(str(ckpt))
     .write.format("noop").mode("overwrite").save())
    return time.perf_counter() - start


@contextlib.contextmanager
def moto_s3() -> Iterator[Any]:
    """The tests' moto S3 server on 127.0.0.1 in a child process, with a bucket: its
    `S3Server` coordinates."""
    from tests.support.infra.object_store_servers import S3Server

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen([sys.executable, "-c", _MOTO], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout is not None
        port = child.stdout.readline().strip()
        if not port:
            raise SystemExit("the moto server did not start")
        server = S3Server(endpoint=f"http://127.0.0.1:{port}", bucket=BUCKET)
        _s3_client(server).create_bucket(Bucket=BUCKET)
        yield server
    finally:
        assert child.stdin is not None
        child.stdin.close()
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def _s3_client(server: Any) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=server.endpoint, region_name=server.region,
                        aws_access_key_id=server.access_key_id,
                        aws_secret_access_key=server.secret_access_key)


def upload(ckpt: Path, server: Any) -> float:
    """Every file of the location under ``S3_PREFIX/``, as it is (the local file system's
    ``.crc`` files left out: S3A writes none); the seconds it took."""
    client = _s3_client(server)
    files = [p for p in ckpt.rglob("*") if p.is_file() and not p.name.endswith(".crc")]
    start = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda p: client.upload_file(
            str(p), BUCKET, f"{S3_PREFIX}/{p.relative_to(ckpt).as_posix()}"), files))
    return time.perf_counter() - start


def s3a_session_conf(server: Any) -> dict[str, str]:
    """hadoop-aws on Spark's class path and S3A pointed at `server` (path-style, plain
    HTTP, its keys)."""
    from statehold.spark.session import classpath_conf, s3a_conf
    from tests.support.infra import jvm

    jars = [str(j) for j in jvm.fetch(jvm.hadoop_aws())]
    return {**classpath_conf(jars), **s3a_conf(server.options)}


def _child(argv: list[str]) -> tuple[float, float]:
    """A child process run to its end: wall seconds and its CPU seconds (user and system,
    from the kernel, so the machine's other load does not count)."""
    start = time.perf_counter()
    pid = subprocess.Popen(argv).pid
    _pid, status, usage = os.wait4(pid, 0)
    seconds = time.perf_counter() - start
    if status != 0:
        raise SystemExit(f"{argv[0]} failed (status {status})")
    return seconds, usage.ru_utime + usage.ru_stime


def time_repartition(ckpt: Path, dest: Path, partitions: int) -> tuple[float, float, int]:
    """A repartition in a child process: wall and CPU seconds, peak resident KiB."""
    shutil.rmtree(dest, ignore_errors=True)
    peak = dest.with_name(dest.name + ".peak")
    seconds, cpu = _child([sys.executable, "-c", _REPARTITION, str(ckpt), str(dest),
                           str(partitions), str(peak)])
    return seconds, cpu, int(peak.read_text())


def time_copy(ckpt: Path, dest: Path) -> tuple[float, float]:
    """`cp -r` of the location: wall and CPU seconds."""
    shutil.rmtree(dest, ignore_errors=True)
    return _child(["cp", "-r", str(ckpt), str(dest)])


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 3)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.keep:
        work = args.keep
        work.mkdir(parents=True, exist_ok=True)
    else:
        work = Path(tempfile.mkdtemp(prefix="statehold-bench-rewrite-", dir=args.work))
    with contextlib.ExitStack() as stack:
        if not args.keep:
            stack.callback(shutil.rmtree, work, ignore_errors=True)
        server = None
        if args.s3:
            sys.path.insert(0, str(ROOT))  # tests.support: the moto server, the jars
            server = stack.enter_context(moto_s3())
        result = _run(args, work, server)
    return emit(result, args.out)


def _run(args: argparse.Namespace, work: Path, server: Any) -> dict[str, Any]:
    """The query, then the timed turns (the S3 reads too where `server` is given)."""
    import pyspark

    spark = _session(args.partitions, s3a_session_conf(server) if server else None)
    batch, small_batch = _locations(spark, args, work)
    s3_uri, s3a_uri = f"s3://{BUCKET}/{S3_PREFIX}", f"s3a://{BUCKET}/{S3_PREFIX}"
    upload_s = upload(work / "ckpt", server) if server else 0.0
    time_spark_read(spark, work / "ckpt", batch)  # warm: the JVM's classes and code
    if server:
        time_spark_read(spark, s3a_uri, batch)  # and S3A's
    ours, spark_read, s3_ours, s3_spark, repart, copies, peaks = [], [], [], [], [], [], []
    repart_cpu, copy_cpu = [], []
    rows = 0
    for _ in range(args.runs):  # in turns, so a slower phase of the machine hits both
        seconds, rows = time_read(work / "ckpt", batch)
        ours.append(seconds)
        spark_read.append(time_spark_read(spark, work / "ckpt", batch))
        if server:
            seconds, s3_rows = time_read(s3_uri, batch, **server.options)
            assert s3_rows == rows, (s3_rows, rows)
            s3_ours.append(seconds)
            s3_spark.append(time_spark_read(spark, s3a_uri, batch))
        seconds, cpu, peak = time_repartition(work / "ckpt", work / "dest", args.to)
        repart.append(seconds)
        repart_cpu.append(cpu)
        peaks.append(peak)
        seconds, cpu = time_copy(work / "ckpt", work / "copy")
        copies.append(seconds)
        copy_cpu.append(cpu)
    spark.stop()
    _s, _cpu, small_peak = time_repartition(work / "small", work / "dest-small", args.to)
    assert rows == args.keys, (rows, args.keys)
    assert small_batch >= 0
    result: dict[str, Any] = {
        "provider": args.provider,
        "keys": args.keys,
        "value_bytes": args.value_bytes,
        "partitions": args.partitions,
        "to": args.to,
        "batch": batch,
        "location_bytes": tree_bytes(work / "ckpt"),
        **_read_figures("", ours, spark_read, rows),
        "repartition_s": [round(s, 3) for s in repart],
        "cp_r_s": [round(s, 3) for s in copies],
        "repartition_median_s": _median(repart),
        "cp_r_median_s": _median(copies),
        "repartition_vs_cp_r": round(statistics.median(repart) / statistics.median(copies), 2),
        "repartition_cpu_s": [round(s, 3) for s in repart_cpu],
        "cp_r_cpu_s": [round(s, 3) for s in copy_cpu],
        "repartition_peak_rss_mib": round(max(peaks) / 1024, 1),
        "repartition_peak_rss_mib_quarter_keys": round(small_peak / 1024, 1),
    }
    if server:
        import moto

        result["s3_server"] = f"moto {moto.__version__}, a child process on 127.0.0.1"
        result["s3_upload_s"] = round(upload_s, 3)
        result.update(_read_figures("s3_", s3_ours, s3_spark, rows))
    return {**result, "pyspark": pyspark.__version__, "cpus": os.cpu_count(),
            "machine": platform.platform()}


def _locations(spark: Any, args: argparse.Namespace, work: Path) -> tuple[int, int]:
    """The full and the quarter-keys locations under `work` (kept ones reused where they
    were written for the same arguments): each one's last batch."""
    made = work / "locations.json"
    what = {"keys": args.keys, "value_bytes": args.value_bytes, "batches": args.batches,
            "partitions": args.partitions, "provider": args.provider}
    if made.exists():
        kept = json.loads(made.read_text())
        if kept["what"] == what:
            return kept["batch"], kept["small_batch"]
        raise SystemExit(f"{work} holds locations made with {kept['what']}, not {what}")
    for half_made in ("in", "in-small", "ckpt", "small"):  # an interrupted run's
        shutil.rmtree(work / half_made, ignore_errors=True)
    payload = args.value_bytes > 0
    small = max(1, args.keys // 4)
    write_inputs(work / "in", args.keys, args.batches, args.value_bytes)
    write_inputs(work / "in-small", small, args.batches, args.value_bytes)
    batch = run_query(spark, args.provider, work / "in", work / "ckpt", payload)
    small_batch = run_query(spark, args.provider, work / "in-small", work / "small", payload)
    shutil.rmtree(work / "in")
    shutil.rmtree(work / "in-small")
    made.write_text(json.dumps({"what": what, "batch": batch, "small_batch": small_batch}))
    return batch, small_batch


def _read_figures(prefix: str, ours: list[float], spark: list[float],
                  rows: int) -> dict[str, Any]:
    """Each side's seconds, rows per second (of the medians) and statehold's speed over
    Spark's, the keys named with `prefix`."""
    return {
        f"{prefix}read_s": [round(s, 3) for s in ours],
        f"{prefix}spark_read_s": [round(s, 3) for s in spark],
        f"{prefix}read_rows_per_s": round(rows / statistics.median(ours)),
        f"{prefix}spark_read_rows_per_s": round(rows / statistics.median(spark)),
        f"{prefix}read_speed_vs_spark": round(statistics.median(spark)
                                              / statistics.median(ours), 2),
    }


if __name__ == "__main__":
    main()
