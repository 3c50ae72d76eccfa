"""Repartition, key deletion and transform S3 -> S3 on the committed fixtures, without
Spark: a location PySpark 4.3.0 wrote (transformWithState's column families, a
stream-stream join's four stores, a window's RocksDB store) uploaded to the moto server,
its state schema paths as Spark through S3A records them, then rewritten into a DEST on
the same bucket. DEST, listed and read back from the bucket, holds what the same
operation writes on local disk from the same fixture: the same files (the SSTs' and
checkpoint format v2's snapshots' unique ids aside) and the same decoded rows per store
or state variable and partition; DEST verifies; the source's objects keep their sizes
and ETags; no object outside DEST is written and no scratch file is left behind. These
paths read and write RocksDB's files through `Storage.download_to_read` and
`Storage.hand_over`, whose object store forms (a download, an upload) only S3 runs.
Spark restarting on S3 through S3A: test_spark_s3a.py."""

from __future__ import annotations

import collections
import json
import re
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from statehold.spark_checkpoints import open_spark_checkpoint
from statehold.spark_checkpoints.relocate import relocate
from statehold.spark_checkpoints.tws_state import tws_operator
from tests.support.infra.object_store_servers import S3Server
from tests.support.spark_locations.committed_fixtures import TWS_GROUPING, Fixture, copy_of

VERSION = "4.3.0"
#: An operation: (the opened source, DEST's URI, DEST's storage options) -> its report.
Operation = Callable[[Any, str, dict[str, Any]], Any]
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _client(server: S3Server) -> Any:
    import boto3

    return boto3.client(
        "s3", endpoint_url=server.endpoint, region_name=server.region,
        aws_access_key_id=server.access_key_id, aws_secret_access_key=server.secret_access_key,
    )


def _objects(server: S3Server, prefix: str = "") -> dict[str, tuple[int, str]]:
    """Every object under `prefix`: key -> (size, ETag)."""
    pages = _client(server).get_paginator("list_objects_v2").paginate(
        Bucket=server.bucket, Prefix=prefix)
    return {o["Key"]: (o["Size"], o["ETag"]) for page in pages for o in page.get("Contents", [])}


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def _unnamed(names: set[str]) -> set[str]:
    """File names with their unique ids (an SST's, a v2 snapshot's) replaced."""
    return {_UUID.sub("U", n) for n in names}


def _decoded(location: Any, query: str) -> dict[tuple[int, str, int], collections.Counter[str]]:
    """Every store's rows (transformWithState's: each state variable's), per partition."""
    found = location.scan()
    rows = {}
    for sid in sorted(found.stores):
        tws = tws_operator(location, found, sid.operator, sid.name)
        assert (tws is not None) == (query == "transform"), sid
        for var in TWS_GROUPING if tws is not None else [None]:
            read = location.read_state(operator=sid.operator, store=sid.name,
                                       partition=sid.partition, state_var=var)
            rows[(sid.operator, var or sid.name, sid.partition)] = collections.Counter(
                json.dumps(r, sort_keys=True, default=str) for b in read for r in b.to_pylist())
    return rows


def _on_s3_as_locally(
    extracted: Callable[[str], Path], tmp_path: Path, server: S3Server, query: str,
    provider: str, operation: Operation, monkeypatch: pytest.MonkeyPatch, *,
    s3a_paths: bool = True,
) -> tuple[Any, Any]:
    """`operation` run on `query`'s `provider` fixture, uploaded to S3, into a DEST on S3,
    and on the same fixture locally into a local DEST: checks that the two DESTs are the
    same and that nothing but DEST changed; returns both reports (S3's first).
    `s3a_paths`: the fixture's absolute paths rewritten to where it is uploaded, as
    Spark through S3A writes them (else as the local Spark wrote them, as a copy made
    by hand has them)."""
    run = f"ops-{uuid.uuid4().hex[:12]}"
    src_uri, dest_uri = f"s3://{server.bucket}/{run}/src", f"s3://{server.bucket}/{run}/dest"
    fx: Fixture = copy_of(extracted(VERSION), VERSION, query, provider, tmp_path / "fx")
    if s3a_paths:  # as Spark writes them through S3A (the plain path matches file: URIs)
        moved = relocate(open_spark_checkpoint(str(fx.checkpoint)), fx.written_at,
                         f"s3a://{server.bucket}/{run}/src", force=True)
        assert bool(moved.paths) == (query == "transform"), moved
    client = _client(server)
    for rel in sorted(_files(fx.checkpoint)):
        client.put_object(Bucket=server.bucket, Key=f"{run}/src/{rel}",
                          Body=(fx.checkpoint / rel).read_bytes())
    local_report = operation(open_spark_checkpoint(str(fx.checkpoint)), str(tmp_path / "dest"),
                             {})
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    before = _objects(server)

    s3_report = operation(open_spark_checkpoint(src_uri, **server.options), dest_uri,
                          server.options)

    after = _objects(server)
    assert not list(scratch.iterdir())  # no scratch file left behind
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)
               and k.startswith(f"{run}/")}
    assert changed and all(k.startswith(f"{run}/dest/") for k in changed), sorted(
        k for k in changed if not k.startswith(f"{run}/dest/"))
    # elsewhere in the bucket nothing made or removed (other tests' jobs, run earlier in
    # this process, may still renew their leases there)
    assert {k for k in after.keys() ^ before.keys() if not k.startswith(f"{run}/")} == set()
    assert {k: v for k, v in after.items() if k.startswith(f"{run}/src/")} == {
        k: v for k, v in before.items() if k.startswith(f"{run}/src/")}  # the source only read
    dest_keys = {k.removeprefix(f"{run}/dest/") for k in after if k.startswith(f"{run}/dest/")}
    local_files = _files(tmp_path / "dest")
    assert _unnamed(dest_keys) == _unnamed(local_files)
    assert len(dest_keys) == len(local_files)
    on_s3 = open_spark_checkpoint(dest_uri, **server.options)
    locally = open_spark_checkpoint(str(tmp_path / "dest"))
    assert on_s3.verify(deep=True).ok and locally.verify(deep=True).ok
    assert on_s3.listing().newest_committed == locally.listing().newest_committed
    decoded = _decoded(on_s3, query)
    assert decoded == _decoded(locally, query) and any(decoded.values())
    # transformWithState's operator metadata names DEST's own state schema objects
    named = []
    for key in sorted(k for k in dest_keys if re.fullmatch(r"state/0/_metadata/v2/\d+", k)):
        text = client.get_object(Bucket=server.bucket, Key=f"{run}/dest/{key}")["Body"].read()
        doc = json.loads(text.decode().split("\n", 1)[1])
        named += [p for info in doc["stateStoreInfo"] for p in info.get("stateSchemaFilePaths", [])]
    prefix = f"s3a://{server.bucket}/{run}/dest/"
    assert all(p.startswith(prefix) and p.removeprefix(prefix) in dest_keys for p in named), named
    assert bool(named) == (query == "transform")
    return s3_report, local_report


#: (query, provider, s3a_paths): transformWithState's also copied to S3 as it is, its
#: state schema paths ``file:`` ones.
REPARTITIONED = [("transform", "rocksdb", True), ("transform", "rocksdb_changelog", True),
                 ("transform", "rocksdb_v2", False), ("window", "rocksdb", True),
                 ("join", "rocksdb_v2", True)]


@pytest.mark.parametrize(("query", "provider", "s3a_paths"), REPARTITIONED,
                         ids=[f"{q}-{p}{'' if a else '-file-paths'}"
                              for q, p, a in REPARTITIONED])
def test_repartitioned_s3_to_s3_as_on_local_disk(
    extracted: Callable[[str], Path], tmp_path: Path, s3_server: S3Server,
    monkeypatch: pytest.MonkeyPatch, query: str, provider: str, s3a_paths: bool,
) -> None:
    """2 -> 5 partitions: each new partition's zip and its SSTs written through
    `Storage.hand_over`, the source's read through `Storage.download_to_read`. DEST's
    operator metadata names its state schema objects by S3A's scheme also where the
    source names its own by ``file:`` (it named ``file://bucket/...``, no file)."""
    def repartition(source: Any, dest: str, options: dict[str, Any]) -> Any:
        return source.repartition(dest, partitions=5, **options)

    s3, local = _on_s3_as_locally(extracted, tmp_path, s3_server, query, provider,
                                  repartition, monkeypatch, s3a_paths=s3a_paths)
    assert (s3.partitions_before, s3.partitions) == (2, 5)
    assert [p.stores for p in s3.operators] == [p.stores for p in local.operators]
    assert {len(s.per_partition) for p in s3.operators for s in p.stores} == {5}


DELETED = [("join", "rocksdb", None), ("join", "rocksdb", "left"),
           ("join", "rocksdb_v2", "right"), ("transform", "rocksdb", None),
           ("transform", "rocksdb_changelog", None)]


@pytest.mark.parametrize(("query", "provider", "side"), DELETED,
                         ids=[f"{q}-{p}-{s or 'both'}" for q, p, s in DELETED])
def test_keys_deleted_s3_to_s3_as_on_local_disk(
    extracted: Callable[[str], Path], tmp_path: Path, s3_server: S3Server,
    monkeypatch: pytest.MonkeyPatch, query: str, provider: str, side: str | None,
) -> None:
    """A join key deleted from both sides or one (`side`); transformWithState's grouping
    keys deleted from every column family."""
    column = "field0" if query == "join" else "key"
    keys = [{column: "k1"}, {column: "k2"}, {column: "nobody"}]

    def delete(source: Any, dest: str, options: dict[str, Any]) -> Any:
        return source.delete_keys(dest, operator=0, keys=keys, side=side, **options)

    s3, local = _on_s3_as_locally(extracted, tmp_path, s3_server, query, provider, delete,
                                  monkeypatch)
    assert s3.deleted > 0 and s3.not_found == 1
    assert s3.model_dump(exclude={"source", "dest", "bytes"}) == local.model_dump(
        exclude={"source", "dest", "bytes"})


TRANSFORMED = [("window", "rocksdb"), ("window", "rocksdb_changelog")]


@pytest.mark.parametrize(("query", "provider"), TRANSFORMED,
                         ids=[f"{q}-{p}" for q, p in TRANSFORMED])
def test_transformed_s3_to_s3_as_on_local_disk(
    extracted: Callable[[str], Path], tmp_path: Path, s3_server: S3Server,
    monkeypatch: pytest.MonkeyPatch, query: str, provider: str,
) -> None:
    """A key deleted and a value column added (a schema migration: DEST's schema file
    says it), into 3 partitions."""
    value = pa.schema([("count", pa.int64()), ("sum", pa.int64()), ("max", pa.int64())])

    def migrate(b: pa.RecordBatch) -> pa.RecordBatch:
        kept = b.filter(pc.not_equal(b.column("key"), "k1"))
        return kept.append_column("max", pc.add(kept.column("sum"), 1))

    def transform(source: Any, dest: str, options: dict[str, Any]) -> Any:
        return source.transform(dest, operator=0, fn=migrate, value_schema=value,
                                partitions=3, **options)

    s3, local = _on_s3_as_locally(extracted, tmp_path, s3_server, query, provider, transform,
                                  monkeypatch)
    assert s3.value_schema_changed and 0 < s3.rows_written < s3.rows_read
    assert s3.model_dump(exclude={"source", "dest", "bytes"}) == local.model_dump(
        exclude={"source", "dest", "bytes"})
    dest = open_spark_checkpoint(s3.dest, **s3_server.options)
    assert [f.name for f in dest.state_schema().value.fields] == ["count", "sum", "max"]
