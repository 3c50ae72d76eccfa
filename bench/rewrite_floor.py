"""The floor under a repartition's time: what the libraries it must use cost per GB on one
core, before any of statehold's own work per record:

    python bench/rewrite_floor.py [--mb 128] [--value-bytes 1000]

Rows of the repartition bench's kind (a 24-byte key, a random alphanumeric value), in key
order, about ``--mb`` MB, timed in this process (CPU seconds from the kernel), each step
scaled to a GB: lz4 blocks of 64 KiB decompressed (python-lz4, as the reader does a
changelog's), the rows written into an SST by rocksdict's ``SstFileWriter`` with the
options a repartition writes (lz4, the table format version 3.5's RocksDB reads; a call
per row), and Hadoop's CRC-32 of each 512-byte chunk (``relocate.hadoop_crc``, the
``.crc`` Spark writes beside a file on a local disk) over the same bytes in memory.
Prints one JSON object; docs/benchmarks.md ("the floor under the 5x goal") says what it
means against ``cp -r``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import string
import tempfile
from collections.abc import Callable
from pathlib import Path

import lz4.block
from rocksdict import SstFileWriter

from statehold.spark_checkpoints.relocate import hadoop_crc
from statehold.spark_checkpoints.rocksdb_writer import DEFAULT_FORMAT_VERSION, _options

_BLOCK = 64 << 10


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _timed(step: Callable[[], object]) -> float:
    start = _cpu()
    step()
    return _cpu() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=int, default=128, help="MB of rows to time each step on")
    p.add_argument("--value-bytes", type=int, default=1000, help="bytes of each row's value")
    args = p.parse_args()
    rng = random.Random(1)
    alphabet = (string.ascii_letters + string.digits).encode()
    values = [bytes(rng.choices(alphabet, k=args.value_bytes)) for _ in range(2000)]
    count = args.mb * 1_000_000 // (24 + args.value_bytes)
    rows = [(k, values[i % len(values)])
            for i, k in enumerate(sorted(os.urandom(24) for _ in range(count)))]
    data = b"".join(k + v for k, v in rows)
    blocks = [lz4.block.compress(data[at : at + _BLOCK], store_size=False)
              for at in range(0, len(data), _BLOCK)]

    def decompress() -> None:
        for block in blocks:
            lz4.block.decompress(block, uncompressed_size=_BLOCK)

    def sst() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            writer = SstFileWriter(_options(DEFAULT_FORMAT_VERSION))
            writer.open(str(Path(tmp) / "rows.sst"))
            for key, value in rows:
                writer[key] = value
            writer.finish()

    per_gb = 1e9 / len(data)
    steps = {
        "lz4_decompress_s_per_gb": _timed(decompress) * per_gb,
        "sst_write_s_per_gb": _timed(sst) * per_gb,
        "hadoop_crc_s_per_gb": _timed(lambda: hadoop_crc(data)) * per_gb,
    }
    print(json.dumps({**{k: round(v, 2) for k, v in steps.items()},
                      "sum_s_per_gb": round(sum(steps.values()), 2),
                      "rows": len(rows), "bytes": len(data), "cpus": os.cpu_count()},
                     indent=2))


if __name__ == "__main__":
    main()
