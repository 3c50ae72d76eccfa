"""The Spark pipeline on Azure Blob (Azurite) and Google Cloud Storage (fake-gcs-server):
executors open the job directory from its URI and options alone, checkpoints land in the
store, and a new job resumes from them with exact results. (The storage contract itself,
on every backend, is tests/storage/test_storage_contract.py.)"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from statehold.format import layout
from statehold.spark import StatefulJob
from statehold.storage import open_storage
from tests.support.keyed_totals import (
    MAXP,
    OUT,
    Reference,
    make_batches,
    outputs,
    stored_state,
    to_df,
    totals,
)
from tests.support.storage_roots import OBJECT_STORES, object_store_server

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("backend", ["azure", "gcs"])
def test_pipeline_resumes_from_the_object_store(
    spark: SparkSession, backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    server: Any = object_store_server(request, backend)
    bucket = getattr(server, "container", None) or server.bucket
    root = f"{OBJECT_STORES[backend][1]}://{bucket}/spark-{random.getrandbits(32)}"
    ref = Reference()
    batches = list(make_batches(3, seed=11))

    def job(local: str) -> StatefulJob:
        return StatefulJob(
            spark, root, "job", max_parallelism=MAXP, parallelism=2,
            storage_options=server.options, local_dir=str(tmp_path / local),
        )

    first = job("local-1")
    for rows in batches[:2]:
        got = outputs(first.run_batch(to_df(spark, rows), totals, OUT, order_by=["seq"]))
        assert got == ref.apply(rows)
    first.close()
    # A new job with empty local directories: its state comes from the store only.
    second = job("local-2")
    got = outputs(second.run_batch(to_df(spark, batches[2]), totals, OUT, order_by=["seq"]))
    assert got == ref.apply(batches[2])
    second.close()

    storage = open_storage(root, **server.options).child("job")
    assert storage.exists(layout.checkpoint_metadata_key(2))
    assert stored_state(storage) == ref.state


def test_uri_forms_open_the_right_store() -> None:
    """No request is made: a store's client is only configured here."""
    from statehold.storage.azure import AzureStorage
    from statehold.storage.gcs import GCSStorage

    gs = open_storage("gcs://bucket/a/b/", bearer_token="t")
    assert isinstance(gs, GCSStorage) and gs.uri == "gs://bucket/a/b"
    az = open_storage("abfss://cont@acct.dfs.core.windows.net/p/q", account_key="a2V5")
    assert isinstance(az, AzureStorage) and (az.bucket, az.prefix) == ("cont", "p/q")
    assert az.uri == "az://cont/p/q" and az.endpoint == "acct"  # the account, from the host
    assert isinstance(open_storage("azure://cont", account_name="acct"), AzureStorage)


def test_abfs_uri_on_azurite(azurite_server: Any) -> None:
    """``abfs://container@account…`` names the account; the rest comes from options."""
    options = {k: v for k, v in azurite_server.options.items() if k != "account_name"}
    uri = f"abfs://{azurite_server.container}@devstoreaccount1.dfs.core.windows.net/abfs"
    storage = open_storage(uri, **options)
    storage.write("k", b"v")
    same = open_storage(f"az://{azurite_server.container}/abfs", **azurite_server.options)
    assert same.read("k") == b"v"
    assert storage.delete_prefix("") == 1
