"""Choosing the HA store by URI: embedded (default) or ZooKeeper, anything else refused."""

from __future__ import annotations

import uuid

import pytest

from statehold.ha import EmbeddedHAStore, ZooKeeperHAStore
from statehold.ha.open import open_ha_store
from statehold.storage import Storage
from tests.support.zk import ZooKeeperServer


@pytest.mark.parametrize("uri", [None, "embedded", " embedded "])
def test_embedded_is_the_default_and_keeps_pointers_on_the_job_storage(
    storage: Storage, uri: str | None
) -> None:
    store = open_ha_store(uri, storage, "job-1")
    assert isinstance(store, EmbeddedHAStore)
    epoch = store.claim_epoch().epoch
    assert epoch == 1
    # A second store opened the same way sees the same job state: it lives in _ha/.
    assert open_ha_store("embedded", storage, "job-1").read().epoch == epoch
    assert any(info.key.startswith("_ha/") for info in storage.list())


@pytest.mark.parametrize(
    "uri",
    ["", "zk://127.0.0.1:2181/x", "ZooKeeper", "s3://bucket/ha", "embedded://", "zookeeper:/x"],
)
def test_unknown_uri_is_refused_clearly(storage: Storage, uri: str) -> None:
    with pytest.raises(ValueError, match="HA store|zookeeper"):
        open_ha_store(uri, storage, "job-1")
    assert list(storage.list()) == []


def test_bad_zookeeper_uri_is_refused(storage: Storage) -> None:
    with pytest.raises(ValueError):
        open_ha_store("zookeeper://127.0.0.1:1/a/../b", storage, "job-1")


@pytest.mark.zookeeper
def test_zookeeper_uri_opens_the_job_znode(
    storage: Storage,
    zk_server: ZooKeeperServer,
) -> None:
    job_id = f"job-{uuid.uuid4().hex}"
    uri = f"zookeeper://{zk_server.hosts}/statehold-open-test"
    store = open_ha_store(uri, storage, job_id)
    try:
        assert isinstance(store, ZooKeeperHAStore)
        assert store.path == f"/statehold-open-test/{job_id}"
        assert store.uri == uri
        assert store.claim_epoch().epoch == 1
        # Nothing of the HA state went to the job storage.
        assert not any(info.key.startswith("_ha/") for info in storage.list())
        other = open_ha_store(uri, storage, job_id)
        try:
            assert other.claim_epoch().epoch == 2  # same job node: fencing works across them
        finally:
            other.close()
    finally:
        store.close()
