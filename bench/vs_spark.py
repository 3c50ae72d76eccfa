"""statehold vs. Spark's own state store, and the physical limits, in one run.

    python bench/vs_spark.py                                  # 100k keys, 5%, 50 batches
    python bench/vs_spark.py --keys 1000000 --fraction 0.01 --batches 20

One keyed running aggregation (see _workload.py) runs through each system on the same
local Spark session, reading the same input files through the same streaming file
source: statehold (`StatefulJob.foreach_batch`, per-key and vectorized functions) and
Spark Structured Streaming with `RocksDBStateStoreProvider` via `applyInPandasWithState`
and `transformWithStateInPandas`, changelog checkpointing off and on,
`minBatchesToRetain` = statehold's `retain`. Per system: checkpoint duration and bytes
written per checkpoint (median, p95), storage after the run, recovery (restart to first
processed batch), steady throughput; then the disk's sequential write bandwidth and the
lower bound it puts on checkpoint time, and delete rates (local; S3 on a moto server,
bulk vs. one request per object). Everything is also compared as ratios.

Batch 0 loads every key and is left out of the per-checkpoint figures and throughput.
Results (JSON) go to ``<work>/results.json``; ``--markdown`` prints the tables as
Markdown for docs/benchmarks.md; ``--plot DIR`` draws its charts (bench/plot_vs_spark.py).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _physical import (
    disk_write_bandwidth,
    fsync_latency,
    local_deletes_per_second,
    s3_deletes_per_second,
)
from _workload import RunResult, Workload, expected_totals, make_session, write_inputs

SYSTEMS = {
    "statehold": "statehold, per-key function",
    "statehold-vec": "statehold, vectorized function",
    "statehold-changelog": "statehold, per-key function, changelog commits",
    "statehold-vec-changelog": "statehold, vectorized function, changelog commits",
    "aipws": "Spark applyInPandasWithState, RocksDB",
    "aipws-changelog": "Spark applyInPandasWithState, RocksDB + changelog",
    "twsip": "Spark transformWithStateInPandas, RocksDB",
    "twsip-changelog": "Spark transformWithStateInPandas, RocksDB + changelog",
}
MIB = float(1 << 20)


def describe(name: str) -> str:
    """A system's label; ``statehold@50`` is statehold with size_amplification=50."""
    base, _, amp = name.partition("@")
    return SYSTEMS[base] + (f", size amplification {amp}%" if amp else "")


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import pyspark

    return (f"{os.cpu_count()} cores ({cpu}), "
            f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB, "
            f"{platform.system()} {platform.machine()}, Python {sys.version.split()[0]}, "
            f"PySpark {pyspark.__version__}")


def run_system(name: str, spark: Any, w: Workload, files: list[Path], work: Path,
               args: argparse.Namespace, log: Callable[[str], None] = print) -> RunResult:
    if name.startswith("statehold"):
        from _statehold_run import run_statehold

        base, _, amp = name.partition("@")
        options: dict[str, Any] = {"size_amplification": int(amp)} if amp else {}
        if base.endswith("-changelog"):
            options["changelog"] = True
        return run_statehold(spark, w, files, work, retain=args.retain,
                             partitions=args.partitions,
                             vectorized=base.startswith("statehold-vec"),
                             backend_options=options or None, log=log)
    from _spark_native import run_spark_native

    api = "applyInPandasWithState" if name.startswith("aipws") else "transformWithStateInPandas"
    return run_spark_native(spark, w, files, work, api=api, changelog=name.endswith("changelog"),
                            retain=args.retain, partitions=args.partitions, log=log)


def warm_up(spark: Any, names: list[str], work: Path, args: argparse.Namespace) -> None:
    """Run every system once on a tiny workload first, so no system's measured run pays
    for the JVM's and the Python workers' first use of its code paths. Per-batch work
    (planning, scheduling) keeps getting faster for some batches as the JIT compiles it:
    after 3 warm-up batches, the same statehold run three times in one session took 0.43,
    0.35 and 0.33 s a trigger, so the system measured first was still warming up."""
    tiny = Workload(keys=2000, fraction=0.05, batches=args.warm_batches,
                    value_size=args.value_size, seed=1)
    files = write_inputs(tiny, work / "inputs")
    for name in names:
        try:
            run_system(name, spark, tiny, files, work / name, args, log=lambda _line: None)
        except Exception as e:  # the measured run reports it
            print(f"   warm-up of {name} failed: {type(e).__name__}", flush=True)
    shutil.rmtree(work, ignore_errors=True)


def summarize(r: RunResult, w: Workload, bandwidth: float, fsync: float) -> dict[str, Any]:
    steady = r.steady()
    changed = w.changed_bytes(1)
    up_median = r.median("bytes_uploaded")
    return {
        "system": r.system,
        "ckpt_median_s": r.median("checkpoint_seconds"),
        "ckpt_p95_s": r.p95("checkpoint_seconds"),
        "batch_median_s": r.median("seconds"),
        "up_median_bytes": up_median,
        "up_p95_bytes": r.p95("bytes_uploaded"),
        "up_mean_bytes": sum(b.bytes_uploaded for b in steady) / len(steady),
        "files_median": r.median("files_uploaded"),
        "up_per_changed": up_median / changed,
        "up_mean_per_changed": sum(b.bytes_uploaded for b in steady) / len(steady) / changed,
        "lower_bound_s": up_median / bandwidth,
        # ... and if every new file is made durable on its own (statehold's local storage
        # fsyncs each file; Hadoop's local file system, which Spark uses, does not)
        "lower_bound_fsync_s": up_median / bandwidth + r.median("files_uploaded") * fsync,
        "footprint_bytes": r.footprint_bytes,
        "footprint_files": r.footprint_files,
        "footprint_per_live": r.footprint_bytes / w.live_state_bytes(),
        "footprint_mean_bytes": r.mean("footprint_bytes"),
        "footprint_max_bytes": max(b.footprint_bytes for b in steady),
        "footprint_mean_per_live": r.mean("footprint_bytes") / w.live_state_bytes(),
        "recovery_s": r.recovery_seconds,
        "events_per_s": r.throughput(),
        "totals_ok": r.totals,
        "notes": r.notes,
    }


def table(rows: list[dict[str, Any]], markdown: bool) -> str:
    cols = [
        ("system", "system", "{}"),
        ("ckpt_median_s", "ckpt s median", "{:.3f}"),
        ("ckpt_p95_s", "ckpt s p95", "{:.3f}"),
        ("lower_bound_s", "bound s", "{:.4f}"),
        ("lower_bound_fsync_s", "bound+fsync s", "{:.4f}"),
        ("up_median_bytes", "MiB/ckpt median", "mib"),
        ("up_p95_bytes", "MiB/ckpt p95", "mib"),
        ("up_mean_per_changed", "mean up/changed", "{:.2f}"),
        ("footprint_bytes", "storage MiB", "mib"),
        ("footprint_files", "files", "{}"),
        ("footprint_per_live", "storage/live", "{:.2f}"),
        ("footprint_mean_per_live", "mean storage/live", "{:.2f}"),
        ("recovery_s", "recovery s", "{:.2f}"),
        ("events_per_s", "events/s", "{:,.0f}"),
    ]

    def fmt(spec: str, v: Any) -> str:
        return f"{v / MIB:.2f}" if spec == "mib" else spec.format(v)

    head = [c[1] for c in cols]
    body = [[fmt(c[2], row[c[0]]) for c in cols] for row in rows]
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in body]
        return "\n".join(lines)
    widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(head)]
    lines = []
    for r in [head, *body]:
        cells = zip(r, widths, strict=True)
        lines.append("  ".join(v.rjust(n) if i else v.ljust(n) for i, (v, n) in enumerate(cells)))
    return "\n".join(lines)


def _ours(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["system"].startswith("statehold")]


def ratios(rows: list[dict[str, Any]], markdown: bool) -> str:
    """Every statehold variant against every Spark variant: < 1 means statehold's figure
    is lower (better for time, bytes, files; worse for throughput)."""
    keys = [("ckpt_median_s", "ckpt median"), ("ckpt_p95_s", "ckpt p95"),
            ("up_median_bytes", "bytes/ckpt median"), ("up_mean_bytes", "bytes/ckpt mean"),
            ("footprint_bytes", "storage"), ("footprint_files", "files"),
            ("recovery_s", "recovery"), ("events_per_s", "throughput")]
    head = ["statehold variant", "vs", *(k[1] for k in keys)]
    out = []
    for ours in _ours(rows):
        for other in rows:
            if other["system"].startswith("statehold"):
                continue
            out.append([ours["system"], other["system"],
                        *(f"{ours[k] / other[k]:.2f}" if other[k] else "-" for k, _ in keys)])
    if not out:
        return ""
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(lines + ["| " + " | ".join(o) + " |" for o in out])
    return "\n".join(" | ".join(x) for x in [head, *out])


def goals(rows: list[dict[str, Any]], w: Workload) -> list[str]:
    """The issue's goals, per statehold variant, against Spark's applyInPandasWithState
    (and transformWithStateInPandas where it ran)."""
    lines = []
    spark = [r for r in rows if not r["system"].startswith("statehold")]
    for sh in _ours(rows):
        lines.append(
            f"{sh['system']}: bytes per checkpoint / changed state median "
            f"{sh['up_per_changed']:.2f}, mean {sh['up_mean_per_changed']:.2f} (goal <= 1.5); "
            f"storage / live state {sh['footprint_per_live']:.2f} at the end, "
            f"{sh['footprint_mean_per_live']:.2f} on average over the run (goal <= 1.3)")
        for other in spark:
            ratio = sh["ckpt_median_s"] / other["ckpt_median_s"]
            lines.append(f"  checkpoint duration vs {other['system']}: {ratio:.2f} "
                         f"(goal <= 0.5); throughput: "
                         f"{sh['events_per_s'] / other['events_per_s']:.2f} (goal >= 1)")
    lines.append(f"live state = {w.live_state_bytes() / MIB:.1f} MiB of keys and values "
                 f"(key, two 8-byte numbers, payload)")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=100_000)
    p.add_argument("--fraction", type=float, default=0.05, help="keys updated per batch")
    p.add_argument("--batches", type=int, default=50, help="batches after the initial load")
    p.add_argument("--value-size", type=int, default=100, help="payload bytes per key")
    p.add_argument("--retain", type=int, default=3)
    p.add_argument("--warm-batches", type=int, default=15,
                   help="batches of each system's untimed warm-up run (tiny workload)")
    p.add_argument("--partitions", type=int, default=2, help="tasks holding state")
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--s3-deletes", type=int, default=5000, help="objects; 0 skips S3")
    p.add_argument("--local-deletes", type=int, default=20000)
    p.add_argument("--disk-bytes", type=int, default=1 << 30)
    p.add_argument("--work", type=Path, default=None, help="default: a new temp directory")
    p.add_argument("--driver-memory", default="8g")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--plot", type=Path, default=None, metavar="DIR",
                   help="draw the PNG charts of docs/benchmarks.md into DIR (matplotlib)")
    args = p.parse_args()
    work: Path = args.work or Path(tempfile.mkdtemp(prefix="statehold-vs-spark-"))
    work.mkdir(parents=True, exist_ok=True)
    w = Workload(args.keys, args.fraction, args.batches, args.value_size)
    names = [n for n in args.systems.split(",") if n]
    unknown = [n for n in names if n.partition("@")[0] not in SYSTEMS]
    if unknown:
        p.error(f"unknown systems {unknown}; choose from {list(SYSTEMS)}")

    started = time.time()
    print(f"# {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; machine: {machine()}")
    print(f"# command: python bench/vs_spark.py {' '.join(sys.argv[1:])}")
    print(f"# workload: {w.keys:,} keys, {w.fraction:.0%} updated per batch, 1 load + "
          f"{w.batches} batches, {w.value_size}-byte values; retain {args.retain}, "
          f"{args.partitions} state partitions; work dir {work}", flush=True)
    files = write_inputs(w, work / "inputs")
    expected = expected_totals(files, w.batches + 1)

    bandwidth = disk_write_bandwidth(work, args.disk_bytes)
    fsync = fsync_latency(work)
    print(f"disk sequential write: {bandwidth / MIB:,.0f} MiB/s (best of 3, fsync'd); "
          f"one file written and fsync'd: {fsync * 1000:.2f} ms (median)", flush=True)

    spark = make_session(args.partitions, args.driver_memory)
    spark.sparkContext.setLogLevel("ERROR")
    print(f"warming up every system on a tiny workload ({args.warm_batches} batches)", flush=True)
    warm_up(spark, names, work / "warmup", args)
    results: list[RunResult] = []
    failed: dict[str, str] = {}
    for name in names:
        label = describe(name)
        print(f"== {label}", flush=True)
        t0 = time.time()
        try:
            r = run_system(name, spark, w, files, work / "runs" / name, args)
        except Exception as e:  # report and go on with the other systems
            traceback.print_exc()
            failed[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
            continue
        r.system = label
        if r.totals is not None and r.totals != expected:
            r.notes.append(f"WRONG STATE: totals {r.totals}, expected {expected}")
        elif r.totals is not None:
            r.notes.append("state checked: keys, counts and sums as expected")
        results.append(r)
        print(f"   ({time.time() - t0:.0f} s) {'; '.join(r.notes)}", flush=True)
        shutil.rmtree(work / "runs" / name / "source", ignore_errors=True)
    spark.stop()

    local_rate = local_deletes_per_second(work, args.local_deletes)
    s3_rates = s3_deletes_per_second(args.s3_deletes) if args.s3_deletes else {}

    rows = [summarize(r, w, bandwidth, fsync) for r in results]
    print()
    print(table(rows, args.markdown))
    print()
    print(ratios(rows, args.markdown))
    print()
    for line in goals(rows, w):
        print(f"- {line}")
    print(f"- changed state per batch: {w.changed_bytes(1) / MIB:.2f} MiB; "
          f"bound = median bytes per checkpoint / {bandwidth / MIB:,.0f} MiB/s; bound+fsync "
          f"adds {fsync * 1000:.2f} ms per new file")
    print(f"- deletes/s: local {local_rate:,.0f}"
          + "".join(f"; S3 (moto) {k} {v:,.0f}" for k, v in s3_rates.items())
          + (f"; bulk / single = {s3_rates['bulk'] / s3_rates['single']:.0f}x"
             if s3_rates else ""))
    for name, why in failed.items():
        print(f"- {describe(name)}: did not run: {why}")
    print(f"- total time {time.time() - started:.0f} s")
    document = {
        "workload": asdict(w), "args": {k: str(v) for k, v in vars(args).items()},
        "machine": machine(), "disk_bytes_per_s": bandwidth, "fsync_s": fsync,
        "local_deletes_per_s": local_rate,
        "s3_deletes_per_s": s3_rates, "summary": rows, "failed": failed,
        "runs": [asdict(r) for r in results],
    }
    (work / "results.json").write_text(json.dumps(document, indent=1, default=str))
    if args.plot is not None:
        from plot_vs_spark import plot

        # the stored document, read back: the charts are exactly what results.json says
        for path in plot(json.loads((work / "results.json").read_text()), args.plot):
            print(f"- chart: {path}")


if __name__ == "__main__":
    main()
