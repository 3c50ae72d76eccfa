"""A checkpoint location Spark itself wrote on S3 through S3A (the moto server): it has
S3A's directory-marker objects (keys ending in '/') and no ``.crc`` files. Opened as
``s3://bucket/prefix`` it lists, inspects (the CLI) and verifies; gc deletes planted
orphans and nothing else; a savepoint S3 -> S3 (server-side copies), a repartition
S3 -> S3 from the 2 shuffle partitions the query records to 5 (the source's objects
unchanged) and a rollback on S3 each restart in the driver process with the rest of the
input and write what one uninterrupted run writes (the repartitioned one with its state in
5 partitions). The marker objects neither break the listing nor get deleted. One driver
process serves the four runs in turn (`ServingDriver`): the location is worked on while
its query is stopped. The uninterrupted run their rows are compared with is the
committed fixture of the same query and layout (tests/fixtures/spark/, written by this
PySpark over the same input files; test_spark_fixtures_live checks the running Spark
still writes its rows), so no other Spark run is needed.

The query keeps its state in Spark's HDFS-backed store, whose files go up through S3A's
output streams. Spark's RocksDB store uploads its snapshot files as whole local files, and
those uploads fail against the moto server here: the AWS SDK sends them with
``Expect: 100-continue`` and reads the server's interim ``100 Continue`` as the final answer
(``S3Exception: Status Code: 100``), then retries with backoff for minutes and gives up,
leaving half-written snapshot files behind. Real S3 answers as the SDK expects; RocksDB
checkpoints are covered on local files by the other tests of this package.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyspark
import pytest

from statehold.spark_checkpoints import open_spark_checkpoint
from statehold.spark_checkpoints.layout import Kind, parse
from statehold.spark_checkpoints.repartition import SHUFFLE_PARTITIONS
from tests.support.cli_process import statehold_cli
from tests.support.infra.object_store_servers import S3Server
from tests.support.spark_locations.committed_fixtures import FILES, fixture, manifests, rows
from tests.support.spark_locations.queries import (
    ServingDriver,
    all_rows,
    read_output,
    write_inputs,
)

QUERY, PROVIDER = "window", "hdfs"
#: Input files of the first run, and added before the restarts: the fixture's in all.
FIRST = 3
MORE = FILES - FIRST
#: The repartitioned location's shuffle partitions (the query records 2).
NEW_PARTITIONS = 5


def s3a_keeps_markers() -> bool:
    from tests.support.infra.jvm import hadoop_version

    return tuple(int(part) for part in hadoop_version().split(".")[:2]) >= (3, 4)


def s3_client(server: S3Server) -> Any:
    import boto3

    return boto3.client(
        "s3", endpoint_url=server.endpoint, region_name=server.region,
        aws_access_key_id=server.access_key_id, aws_secret_access_key=server.secret_access_key,
    )


def s3_keys(server: S3Server, prefix: str) -> set[str]:
    pages = s3_client(server).get_paginator("list_objects_v2").paginate(
        Bucket=server.bucket, Prefix=prefix)
    return {obj["Key"] for page in pages for obj in page.get("Contents", [])}


def copy_output(output: Path, dest: Path, up_to: int) -> None:
    """The sink's batches up to `up_to`: what the sink held when the checkpoint was at it."""
    dest.mkdir()
    for batch in read_output(output):
        if batch <= up_to:
            shutil.copy(output / f"batch-{batch}.json", dest)


def test_directory_markers_are_not_operator_files() -> None:
    """S3A's markers list as their folder's key (obstore drops the '/'): the operator
    metadata folders are no file of Spark's, so a savepoint does not try to copy them
    (it did, and failed: ``state/0/_metadata: no such file``)."""
    for folder in ("state/0/_metadata", "state/0/_metadata/v2", "state/0/_stateSchema",
                   "state/0/_stateSchema/default"):
        assert parse(folder).kind is Kind.UNKNOWN, folder
    for key in ("state/0/_metadata/metadata", "state/0/_metadata/v2/5",
                "state/0/_stateSchema/default/0_0f6c8a7e-1d2b-4c3a-9e8f-7a6b5c4d3e2f"):
        assert parse(key).kind is Kind.OPERATOR_METADATA, key


@pytest.mark.spark
@pytest.mark.matrix  # each Spark through its own hadoop-aws
@pytest.mark.timeout(900)  # a driver JVM with the AWS SDK serving four runs
def test_a_checkpoint_spark_wrote_through_s3a(
    s3_server: S3Server,
    extracted: Callable[[str], Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.support.infra import provision

    provision.require("java")  # skips, naming the install command, where it is missing
    provision.require("hadoop-aws")
    for name, value in s3_server.env.items():  # for the savepoint's and rollback's targets
        monkeypatch.setenv(name, value)
    version = pyspark.__version__
    assert version in manifests(), (
        f"no committed fixture of PySpark {version}: python -m tests.fixtures.spark.make")
    uninterrupted = fixture(extracted(version), version, QUERY, PROVIDER)
    assert uninterrupted.entry["files"] == FIRST + MORE
    expected = rows(uninterrupted)
    assert expected

    prefix = f"spark-s3a-{uuid.uuid4().hex[:12]}"
    inputs, output = tmp_path / "input", tmp_path / "output"
    write_inputs(inputs, 0, FIRST)
    with ServingDriver(QUERY, tmp_path / "driver.log", s3_server.endpoint,
                       s3_server.env) as driver:
        check_the_location(driver, s3_server, prefix, inputs, output, expected, tmp_path)


def check_the_location(driver: ServingDriver, s3_server: S3Server, prefix: str, inputs: Path,
                       output: Path, expected: list[Any], tmp_path: Path) -> None:
    """The location the driver's first run writes, then worked on between its runs."""
    bucket = s3_server.bucket
    stop = driver.run(PROVIDER, f"s3a://{bucket}/{prefix}/ckpt", inputs, output, FIRST - 1)

    keys = s3_keys(s3_server, f"{prefix}/ckpt/")
    markers = {k for k in keys if k.endswith("/")}
    # S3A's directory markers: Hadoop 3.4 keeps them (3.3, Spark 3.5's, deletes them)
    assert markers or not s3a_keeps_markers(), sorted(keys)
    assert not [k for k in keys if k.endswith(".crc")]
    uri = f"s3://{bucket}/{prefix}/ckpt"
    location = open_spark_checkpoint(uri, **s3_server.options)

    listed = location.listing()
    assert listed.newest_committed == stop and listed.restart_batch == stop
    assert listed.stores and all(s.versions for s in listed.stores)
    inspected = statehold_cli("inspect", uri, "--json")
    assert inspected.code == 0, inspected.err
    assert json.loads("\n".join(inspected.out))["restart_batch"] == stop
    verified = location.verify()
    assert verified.ok, verified.problems
    assert verified.files_checked > 0

    # gc: orphans planted (before the listing starts: S3 cannot backdate an mtime)
    client = s3_client(s3_server)
    store = f"{prefix}/ckpt/state/0/0"
    orphans = [
        f"{store}/.{stop + 1}.delta.{uuid.uuid4()}.tmp",
        f"{prefix}/ckpt/commits/.{stop}.{uuid.uuid4()}.tmp",
    ]
    for key in orphans:
        client.put_object(Bucket=bucket, Key=key, Body=b"orphan")
    foreign = f"{prefix}/ckpt/notes.txt"
    client.put_object(Bucket=bucket, Key=foreign, Body=b"not Spark's")
    time.sleep(1.5)  # S3's mtimes have whole seconds: strictly before the listing
    before = s3_keys(s3_server, f"{prefix}/ckpt/")
    found = location.scan()
    needed = {
        f"{prefix}/ckpt/{k}" for b in found.commits for k in location.restart_needs(found, b).files
    }
    report = location.gc(grace_seconds=0)
    assert report.ok, report.problems
    after = s3_keys(s3_server, f"{prefix}/ckpt/")
    gone = before - after
    # the planted orphans, and state files no batch needs: a delta whose version a snapshot
    # of Spark's maintenance also holds
    assert set(orphans) <= gone and not gone & needed, sorted(gone)
    assert all(k.endswith(".delta") for k in gone - set(orphans)), sorted(gone)
    assert markers <= after and foreign in after
    # the markers are listed (as the key of their directory, '' for the location's own)
    # and mostly reported as foreign (``state/0/_metadata`` reads as operator metadata,
    # which gc keeps): never deleted
    marker_keys = {m[len(f"{prefix}/ckpt/"):].rstrip("/") for m in markers}
    assert "notes.txt" in report.foreign_keys
    assert set(report.foreign_keys) - {"notes.txt"} <= marker_keys, report.foreign_keys
    assert open_spark_checkpoint(uri, **s3_server.options).verify().ok

    # savepoint S3 -> S3, restarted by the driver with the rest of the input
    saved = location.savepoint(f"s3://{bucket}/{prefix}/savepoint")
    assert saved.batch == stop
    assert s3_keys(s3_server, f"{prefix}/ckpt/") == after  # the source is only read
    assert open_spark_checkpoint(f"s3://{bucket}/{prefix}/savepoint").verify().ok
    write_inputs(inputs, FIRST, MORE)
    from_savepoint = tmp_path / "from-savepoint"
    copy_output(output, from_savepoint, stop)
    driver.run(PROVIDER, f"s3a://{bucket}/{prefix}/savepoint", inputs, from_savepoint, stop + 1)
    assert all_rows(from_savepoint) == expected

    # repartition S3 -> S3 at the savepoint's batch (before the rollback changes the
    # location), restarted by the driver with the new number of shuffle partitions
    recorded = location.offsets(stop).metadata.conf[SHUFFLE_PARTITIONS]
    assert recorded != str(NEW_PARTITIONS)
    moved = location.repartition(f"s3://{bucket}/{prefix}/repartitioned", batch=stop,
                                 partitions=NEW_PARTITIONS, **s3_server.options)
    assert (moved.batch, moved.partitions_before, moved.partitions) == (
        stop, int(recorded), NEW_PARTITIONS)
    assert s3_keys(s3_server, f"{prefix}/ckpt/") == after  # the source is only read
    repartitioned = open_spark_checkpoint(f"s3://{bucket}/{prefix}/repartitioned",
                                          **s3_server.options)
    assert repartitioned.verify().ok
    assert repartitioned.offsets(stop).metadata.conf[SHUFFLE_PARTITIONS] == str(NEW_PARTITIONS)
    from_repartitioned = tmp_path / "from-repartitioned"
    copy_output(output, from_repartitioned, stop)
    last = driver.run(PROVIDER, f"s3a://{bucket}/{prefix}/repartitioned", inputs,
                      from_repartitioned, stop + 1)
    assert all_rows(from_repartitioned) == expected
    # Spark ran the new batches with the new number: each partition wrote its version
    state = f"{prefix}/repartitioned/state/0"
    assert {int(k.split("/")[4]) for k in s3_keys(s3_server, f"{state}/")
            if k.endswith(f"/{last + 1}.delta")} == set(range(NEW_PARTITIONS))

    # rollback on S3 to an older batch, then the rerun
    older = [b.batch for b in listed.batches if b.restartable and b.batch < stop]
    assert older, listed.batches
    to = min(older)
    rolled = location.rollback(to, keep=f"s3://{bucket}/{prefix}/kept", grace_seconds=0)
    assert rolled.to_batch == to
    assert markers <= s3_keys(s3_server, f"{prefix}/ckpt/")
    after_rollback = open_spark_checkpoint(uri, **s3_server.options).listing()
    assert after_rollback.newest_committed == to and after_rollback.restart_batch == to
    rerun = tmp_path / "rerun"
    copy_output(output, rerun, to)
    driver.run(PROVIDER, f"s3a://{bucket}/{prefix}/ckpt", inputs, rerun, to + 1)
    assert all_rows(rerun) == expected
    assert open_spark_checkpoint(uri, **s3_server.options).verify().ok
