"""The ZooKeeper HA store against a real ZooKeeper server (Debian's `zookeeper` package)."""

from __future__ import annotations

import pickle
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from kazoo.client import KazooClient

from statehold.format import layout
from statehold.ha import CheckpointPointer, HAStoreError
from statehold.ha.zookeeper import ZooKeeperHAStore, parse_uri
from tests.support.ha_contract import ALL_CHECKS, check_concurrent_publishers_lose_nothing
from tests.support.zk import ZooKeeperServer, free_port

pytestmark = pytest.mark.zookeeper

ROOT = "/statehold-test"
StoreFactory = Callable[..., ZooKeeperHAStore]


def pointers(*ids: int, epoch: int = 1) -> tuple[CheckpointPointer, ...]:
    return tuple(CheckpointPointer(i, layout.checkpoint_metadata_key(i), epoch) for i in ids)


@pytest.fixture
def job_id() -> str:
    return f"job-{uuid.uuid4().hex}"


@pytest.fixture
def make_store(
    zk_server: ZooKeeperServer,
    job_id: str,
) -> Iterator[StoreFactory]:
    """Opens stores (each with its own ZooKeeper session) on one fresh job."""
    stores: list[ZooKeeperHAStore] = []

    def make(**kwargs: float) -> ZooKeeperHAStore:
        store = ZooKeeperHAStore.from_uri(f"zookeeper://{zk_server.hosts}{ROOT}", job_id, **kwargs)
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()


@pytest.fixture
def raw_client(zk_server: ZooKeeperServer) -> Iterator[KazooClient]:
    """A plain kazoo client, to look at and tamper with znodes behind the store's back."""
    client = KazooClient(hosts=zk_server.hosts)
    client.start(timeout=30)
    yield client
    client.stop()
    client.close()


# -- the HA contract --------------------------------------------------------------------


@pytest.mark.parametrize("check", ALL_CHECKS, ids=lambda c: c.__name__)
def test_contract(check: Callable[[StoreFactory], object], make_store: StoreFactory) -> None:
    check(make_store)


def test_concurrent_publishers_of_one_epoch_all_succeed(make_store: StoreFactory) -> None:
    # Stricter than the contract: a lost compare-and-set is retried, not reported.
    assert check_concurrent_publishers_lose_nothing(make_store) == []


# -- format and validation --------------------------------------------------------------


def test_bytes_per_job_stay_small_at_retain_10(
    make_store: StoreFactory, raw_client: KazooClient, job_id: str
) -> None:
    store = make_store()
    epoch = 0
    for _ in range(3):
        epoch = store.claim_epoch().epoch
    # Large ids make the pointers as long as a long-running job's.
    ids = [10**12 + n for n in range(10)]
    store.publish(epoch, pointers(*ids, epoch=epoch))

    sizes: dict[str, int] = {}
    pending = [f"{ROOT}/{job_id}"]
    while pending:
        path = pending.pop()
        data, _ = raw_client.get(path)
        sizes[path] = len(data)
        pending.extend(f"{path}/{child}" for child in raw_client.get_children(path))
    assert sizes[f"{ROOT}/{job_id}"] > 0
    assert sum(sizes.values()) < 4096


@pytest.mark.parametrize(
    "data, message",
    [
        (b"\x80\x04not json", "not JSON"),
        (pickle.dumps({"epoch": 3}), "not JSON"),
        (b'{"format": "statehold.ha", "version": 1, "epoch": "3", "retained": []}', "invalid"),
        (b'{"format": "other", "version": 1, "epoch": 3, "retained": []}', "invalid"),
        (
            b'{"format": "statehold.ha", "version": 1, "epoch": 3, "retained": '
            b'[{"checkpoint_id": 1, "metadata": "../x/_metadata", "epoch": 1}]}',
            "unsafe",
        ),
        (b'{"format": "statehold.ha", "version": 99, "epoch": 3, "retained": []}', "newer"),
    ],
)
def test_unreadable_state_is_refused_clearly(
    make_store: StoreFactory, raw_client: KazooClient, job_id: str, data: bytes, message: str
) -> None:
    store = make_store()
    store.claim_epoch()
    raw_client.set(f"{ROOT}/{job_id}", data)
    for call in (store.read, store.claim_epoch, lambda: store.publish(1, pointers(1))):
        with pytest.raises(HAStoreError, match=message):
            call()
    assert raw_client.get(f"{ROOT}/{job_id}")[0] == data


def test_publish_refuses_unsafe_pointer_and_changes_nothing(make_store: StoreFactory) -> None:
    store = make_store()
    epoch = store.claim_epoch().epoch
    store.publish(epoch, pointers(1))
    with pytest.raises(ValueError, match="unsafe"):
        store.publish(epoch, (CheckpointPointer(2, "/etc/passwd", epoch),))
    assert store.read().retained == pointers(1)


def test_parse_uri() -> None:
    assert parse_uri("zookeeper://a:2181,b:2182/x/y/") == ("a:2181,b:2182", "/x/y")
    assert parse_uri("zookeeper://a:2181") == ("a:2181", "/statehold")
    for bad in ("zk://a:2181/x", "zookeeper:///x", "zookeeper://a:1/x/../y", "zookeeper://a/x?q"):
        with pytest.raises(ValueError):
            parse_uri(bad)


def test_unreachable_server_raises_store_error() -> None:
    with pytest.raises(HAStoreError, match="cannot connect"):
        ZooKeeperHAStore(f"127.0.0.1:{free_port()}", ROOT, "job", timeout=1.0)


# -- connection loss --------------------------------------------------------------------


def test_session_loss_blocks_writes_until_reconnected(
    zk_server: ZooKeeperServer,
    make_store: StoreFactory,
) -> None:
    store = make_store(timeout=1.5)
    epoch = store.claim_epoch().epoch
    store.publish(epoch, pointers(1, 2, epoch=epoch))

    zk_server.stop()
    try:
        with pytest.raises(HAStoreError):
            store.publish(epoch, pointers(1, 2, 3, epoch=epoch))
        with pytest.raises(HAStoreError):
            store.check_epoch(epoch)
        with pytest.raises(HAStoreError):
            store.claim_epoch()
    finally:
        zk_server.start()

    # The same store reconnects by itself; wait (bounded) for its first successful call.
    deadline = time.monotonic() + 60
    while True:
        try:
            state = store.read()
            break
        except HAStoreError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    assert (state.epoch, state.retained) == (epoch, pointers(1, 2, epoch=epoch))
    store.check_epoch(epoch)
    store.publish(epoch, pointers(1, 2, 3, epoch=epoch))
    assert make_store().read().retained == pointers(1, 2, 3, epoch=epoch)
