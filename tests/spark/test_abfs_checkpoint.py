"""Spark's own checkpoint of an ``az://`` job directory written through Hadoop's ABFS
connector: ``abfss://<container>@devstoreaccount1.dfs.core.windows.net/<prefix>/_spark``
against Azurite over TLS (hadoop-azure on the Blob endpoint, `statehold.spark.abfs_conf`).

The processor tests' Structured Streaming driver (``job.foreach_batch`` with the sessions
processor) runs on the job directory, is killed with kill -9 after a checkpoint completed
but before Spark committed its batch, and is restarted to the end: Spark replays the batch
from the offsets ABFS wrote, and the results are exact. The job directory is then listed
through statehold's Azure backend (Spark's offsets and commits in ``_spark/``, the retained
checkpoints complete; statehold's gc deletes none of Spark's files), and ``_spark/`` is
opened as a Spark checkpoint location: ABFS's directory-marker blobs are unknown names
there, never problems.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from statehold.cleanup.gc import gc
from statehold.format import layout
from statehold.job.directory import open_job
from statehold.spark_checkpoints import open_spark_checkpoint
from statehold.spark_checkpoints.layout import Kind, parse
from statehold.storage import open_storage
from tests.support.example_runs import check_retained_intact
from tests.support.infra.object_store_servers import AZURITE_ACCOUNT
from tests.support.processor_stream_runs import scenario

pytestmark = [pytest.mark.spark, pytest.mark.crash]

#: The first hadoop-azure that speaks to a Blob endpoint (``fs.azure.fns.account.service.
#: type``; 3.4.1 has no such key): Azurite serves no DFS endpoint.
BLOB_ENDPOINT_SINCE = (3, 4, 2)


def hadoop_speaks_blob() -> bool:
    from tests.support.infra import jvm

    version = tuple(int(p) for p in jvm.hadoop_version().split(".")[:3] if p.isdigit())
    return version >= BLOB_ENDPOINT_SINCE


@pytest.mark.timeout(1800)  # two Spark drivers; slow on a shared machine
def test_abfss_spark_checkpoint_on_azurite(tmp_path: Path, azurite_tls_server: Any) -> None:
    if not hadoop_speaks_blob():
        pytest.skip("Spark's bundled Hadoop is older than 3.4.2: its hadoop-azure cannot "
                    "use a Blob endpoint, and Azurite serves no DFS endpoint")
    server = azurite_tls_server
    assert server.endpoint.startswith("https://") and server.ca_certificate is not None
    prefix = f"abfs-{os.getpid()}-{tmp_path.name}"
    uri = f"az://{server.container}/{prefix}"
    job = open_storage(f"{uri}/sessions", **server.options)
    stdout = scenario(
        tmp_path, uri, job, [("after-complete:2", 2)], server.env,
        driver_args=["--azure-ca", str(server.ca_certificate),
                     "--java-options", server.jvm_options],
    )
    location = (f"abfss://{server.container}@{AZURITE_ACCOUNT}.dfs.core.windows.net/"
                f"{prefix}/sessions/{layout.SPARK_DIR}")
    assert f"spark checkpoint: {location}\n" in stdout
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("abfs")]  # not local

    # The job directory through statehold's Azure backend: Spark's files in _spark/.
    keys = {f.key: f.size for f in job.list("")}
    spark = {k[len(layout.SPARK_DIR) + 1 :]: size for k, size in keys.items()
             if k.startswith(f"{layout.SPARK_DIR}/")}
    names = {key: parse(key) for key in spark}
    kinds = {n.kind for n in names.values()}
    assert {Kind.QUERY_METADATA, Kind.OFFSETS, Kind.COMMITS, Kind.SOURCE_LOG} <= kinds, spark
    # ABFS over the Blob endpoint marks directories with empty blobs named like them.
    markers = {k for k, n in names.items() if n.kind is Kind.UNKNOWN}
    assert markers and all(spark[k] == 0 and any(o.startswith(k + "/") for o in spark)
                           for k in markers), sorted(markers)
    check_retained_intact(job)
    # statehold's gc of the job directory leaves Spark's files and the markers alone.
    with open_job(job) as opened_job:
        collected = gc(opened_job)
    assert not [k for k in collected.orphans if k.split("/", 1)[0] == layout.SPARK_DIR]
    after = {f.key: f.size for f in job.list("")}
    assert {k: v for k, v in after.items() if k.split("/", 1)[0] == layout.SPARK_DIR} == {
        k: v for k, v in keys.items() if k.split("/", 1)[0] == layout.SPARK_DIR}
    check_retained_intact(job)

    # statehold's tools for Spark checkpoint locations read what ABFS wrote.
    opened = open_spark_checkpoint(f"{uri}/sessions/{layout.SPARK_DIR}", **server.options)
    listed = opened.listing()
    committed = max(n.batch for n in names.values() if n.kind is Kind.COMMITS
                    and n.batch is not None)
    assert listed.newest_committed == committed and listed.restart_batch == committed
    assert committed >= 3  # one file per batch: four files
    verified = opened.verify()
    assert verified.ok, verified.problems
    assert verified.files_checked > 0
