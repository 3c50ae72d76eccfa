"""Spark's own checkpoint locations, owned: read, verify, measure, savepoint, roll back,
repair, relocate, repartition and garbage-collect the ``checkpointLocation`` of any
Structured Streaming query, without Spark and without changing the query.

    layout.py     what each key of a location is (`parse`), from its name alone
    errors.py     the error family's members for checkpoint locations
    logs.py       the offsets, commit and file logs, parsed (newer versions refused)
    state_files.py snapshot zips' file lists, compressed streams proven whole, lineage
    stores.py     which files a version of a store needs (the one resolution)
    spark_types.py Spark SQL's JSON data types, parsed, and their Arrow types
    unsafe_row.py Spark's UnsafeRow (state keys and values) decoded, bounds checked
    state_schema.py a store's ``_metadata/schema``: its key and value schemas
    state_records.py the key/value records of HDFS-backed deltas and snapshots, changelogs
    rocksdb_snapshot.py a RocksDB snapshot zip and its SSTs rebuilt, opened read-only
    state_reader.py one store's rows at a batch, offline, as Arrow record batches
    unsafe_row_writer.py Spark's UnsafeRow written, byte for byte as Spark writes it
    state_writer.py HDFS-backed snapshots written (records, lz4-java's block stream)
    spark_hash.py Spark SQL's Murmur3 hash and HashPartitioning's partition of a key
    repartition.py a new location whose state is in M partitions (the one writing path)
    transform.py  a new location whose operator's state a caller's function changed
    scan.py       one listing, every key named and grouped
    location.py   `SparkCheckpoint`: reading a location, and what a restart at a batch needs
    savepoint.py  a new location holding exactly what a restart at a batch needs
    rollback.py   make the next start reprocess from a batch (what it removes kept first)
    deep_verify.py each store version a restart needs loaded (`verify --deep`)
    repair.py     a damaged location brought back to its newest batch that can be whole
    relocate.py   the absolute paths that bind a location to its place, rewritten
    reports.py    read-only views: list, inspect, verify, du
    history.py    per batch: time, watermark, offsets, state bytes per operator
    policy.py     the deletion rule: gc's verdict per file, the last-line checks, and
                  what a rollback may delete (the `Verdict`s of `statehold.cleanup.policy`)
    gc.py         delete what no batch Spark may restart from needs, beside the query
    api.py        `SparkLocation`: the location opened once, every operation a method
"""

from statehold.spark_checkpoints.api import (
    SparkCheckpointLocation,
    SparkLocation,
    open_spark_checkpoint,
)
from statehold.spark_checkpoints.errors import NotASparkCheckpointError, SparkCheckpointError
from statehold.spark_checkpoints.location import (
    RestartNeeds,
    SparkCheckpoint,
    looks_like_spark_checkpoint,
)

__all__ = [
    "NotASparkCheckpointError",
    "RestartNeeds",
    "SparkCheckpoint",
    "SparkCheckpointError",
    "SparkCheckpointLocation",
    "SparkLocation",
    "looks_like_spark_checkpoint",
    "open_spark_checkpoint",
]
