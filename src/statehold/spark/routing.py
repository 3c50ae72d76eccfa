"""Routing every row of task *i* to shuffle partition *i*, on every supported PySpark.

PySpark 4.1 added ``DataFrame.repartitionById(n, col)``: partition = the column's value.
PySpark 3.5 and 4.0 lack it, but ``repartition(n, col)`` places a row in partition
``pmod(murmur3_x86_32(col, seed 42), n)`` (Spark's `HashPartitioning`), so routing by a
column that holds, per task, a value hashing to that task's partition gives the same
placement. The values are found here in Python once per parallelism (Spark's Murmur3 of
an int is a few lines); tests/test_routing.py checks them against Spark's own ``hash``.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

#: The seed Spark's `HashPartitioning` gives `Murmur3Hash`.
SPARK_HASH_SEED = 42
_MASK = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK


def spark_hash_int(value: int, seed: int = SPARK_HASH_SEED) -> int:
    """Spark's ``Murmur3_x86_32.hashInt``: the signed 32-bit hash of an IntegerType value
    (what ``functions.hash`` and hash partitioning compute for an int column)."""
    k1 = (value & _MASK) * 0xCC9E2D51 & _MASK
    k1 = _rotl(k1, 15) * 0x1B873593 & _MASK
    h1 = (seed & _MASK) ^ k1
    h1 = (_rotl(h1, 13) * 5 + 0xE6546B64) & _MASK
    h1 ^= 4  # the input's length in bytes
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & _MASK
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & _MASK
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def hash_partition(value: int, partitions: int) -> int:
    """The partition ``repartition(partitions, col)`` puts an int `value` in."""
    return spark_hash_int(value) % partitions  # Python's % is Spark's pmod here


@functools.lru_cache(maxsize=64)
def routing_values(partitions: int) -> tuple[int, ...]:
    """For each partition *i*, the smallest non-negative int that hash-partitions to *i*
    (about ``partitions * ln(partitions)`` hashes to find them all)."""
    found: dict[int, int] = {}
    value = 0
    while len(found) < partitions:
        found.setdefault(hash_partition(value, partitions), value)
        value += 1
    return tuple(found[i] for i in range(partitions))


def has_repartition_by_id() -> bool:
    from pyspark.sql import DataFrame

    return hasattr(DataFrame, "repartitionById")


def route_to_partitions(df: DataFrame, partitions: int, column: str) -> DataFrame:
    """`df` in `partitions` shuffle partitions, partition *i* holding exactly the rows
    whose int `column` is *i* (values must be in ``0..partitions-1``)."""
    if has_repartition_by_id():
        by_id = df.repartitionById  # PySpark 4.1+
        routed: DataFrame = by_id(partitions, column)
        return routed
    from pyspark.sql import functions as F

    values = routing_values(partitions)
    route = "__statehold_route"
    mapping = F.create_map(*[x for i, v in enumerate(values) for x in (F.lit(i), F.lit(v))])
    routed = df.withColumn(route, mapping[F.col(column)].cast("int"))
    return routed.repartition(partitions, route).drop(route)

