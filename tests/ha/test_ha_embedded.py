"""The embedded HA store on real local disk and a real (moto) S3 server: the shared HA
contract, plus the zombie-with-collected-seqs races, corruption and garbage collection."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator

import pytest

from statehold.format.layout import HA_DIR
from statehold.ha import CheckpointPointer, EmbeddedHAStore, FencedError, HAState, HAStoreError
from statehold.ha.embedded import FORMAT_VERSION, pointer_key
from statehold.storage import Storage
from statehold.storage.base import FileInfo
from tests.support.forwarding_storage import ForwardingStorage
from tests.support.ha_contract import (
    ALL_CHECKS,
    StoreFactory,
    check_concurrent_publishers_lose_nothing,
    ptr,
)

_HANG_GUARD = 60.0  # not an assertion: keeps a broken store from hanging the run


@pytest.fixture
def make_store(storage: Storage) -> StoreFactory:
    return lambda: EmbeddedHAStore(storage)


@pytest.mark.parametrize("check", ALL_CHECKS, ids=lambda c: c.__name__)
def test_contract(check: Callable[[StoreFactory], object], make_store: StoreFactory) -> None:
    check(make_store)


def test_concurrent_publishers_of_one_epoch_all_succeed(make_store: StoreFactory) -> None:
    # Same epoch is never fenced, and lost races are retried rather than reported.
    assert check_concurrent_publishers_lose_nothing(make_store) == []


def ha_seqs(storage: Storage) -> list[int]:
    names = (f.key.split("/")[-1] for f in storage.list(HA_DIR + "/"))
    return sorted(int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit())


class PausingStorage(ForwardingStorage):
    """Delegates to `inner`, but after `arm(method, skip)` the (skip+1)-th call of
    `method` stops until `release()`: a driver that froze (GC pause, lost VM) there."""

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner)
        self._armed: tuple[str, int] | None = None
        self.reached = threading.Event()
        self._go = threading.Event()
        self.created: list[str] = []

    def arm(self, method: str = "create_if_absent", skip: int = 0) -> None:
        self._armed = (method, skip)

    def release(self) -> None:
        self._go.set()

    def _checkpoint(self, method: str) -> None:
        if self._armed is None or self._armed[0] != method:
            return
        if self._armed[1] > 0:
            self._armed = (method, self._armed[1] - 1)
            return
        self._armed = None
        self.reached.set()
        self._go.wait(_HANG_GUARD)

    def create_if_absent(self, key: str, data: bytes) -> None:
        self._checkpoint("create_if_absent")
        self.inner.create_if_absent(key, data)
        self.created.append(key)

    def list_pages(self, prefix: str = "", page_size: int = 1000) -> Iterator[list[FileInfo]]:
        self._checkpoint("list_pages")
        return self.inner.list_pages(prefix, page_size)


class Zombie:
    """Runs one call of an HA store in a thread that freezes right before its create."""

    def __init__(self, storage: Storage) -> None:
        self.storage = PausingStorage(storage)
        self.store = EmbeddedHAStore(self.storage)
        self.result: HAState | None = None
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def start(
        self,
        call: Callable[[EmbeddedHAStore], HAState],
        method: str = "create_if_absent",
        skip: int = 0,
    ) -> None:
        def run() -> None:
            try:
                self.result = call(self.store)
            except BaseException as e:  # noqa: BLE001 - handed to the test
                self.error = e

        self.storage.arm(method, skip)
        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        assert self.storage.reached.wait(_HANG_GUARD), f"the zombie never reached {method}"

    def wake(self) -> None:
        assert self._thread is not None
        self.storage.release()
        self._thread.join(_HANG_GUARD)
        assert not self._thread.is_alive()


# keep=3: after 3 publishes seq s+1 is just collected but its successor s+2 is still
# there (only its `parent` tells the zombie it was never the head); after 8 both are gone.
@pytest.mark.parametrize("publishes", [3, 8])
def test_zombie_publish_after_its_seq_was_collected_is_fenced(
    storage: Storage, publishes: int
) -> None:
    old = EmbeddedHAStore(storage)
    e1 = old.claim_epoch().epoch
    s = old.publish(e1, [ptr(1, e1)]).version

    zombie = Zombie(storage)
    zombie.start(lambda z: z.publish(e1, [ptr(1, e1), ptr(2, e1)]))  # read seq s, froze

    new = EmbeddedHAStore(storage, keep=3)
    e2 = new.claim_epoch().epoch  # seq s+1
    assert e2 > e1
    for i in range(publishes):
        last = new.publish(e2, [ptr(10 + i, e2)])
    assert s + 1 not in ha_seqs(storage), "the scenario needs seq s+1 collected"

    zombie.wake()
    assert isinstance(zombie.error, FencedError), zombie.error
    assert zombie.storage.created == [pointer_key(s + 1)]
    # Its create of the collected seq did happen, but that stale document is not the head.
    stale = json.loads(storage.read(pointer_key(s + 1)))
    assert stale["epoch"] == e1
    assert EmbeddedHAStore(storage).read() == last
    assert EmbeddedHAStore(storage).read().version == last.version
    # The next collection removes the stale document.
    new.publish(e2, [ptr(20, e2)])
    assert s + 1 not in ha_seqs(storage)


def test_zombie_publish_losing_the_race_writes_nothing(storage: Storage) -> None:
    old = EmbeddedHAStore(storage)
    e1 = old.claim_epoch().epoch
    old.publish(e1, [ptr(1, e1)])

    zombie = Zombie(storage)
    zombie.start(lambda z: z.publish(e1, [ptr(2, e1)]))
    claimed = EmbeddedHAStore(storage).claim_epoch()
    before = ha_seqs(storage)
    zombie.wake()
    assert isinstance(zombie.error, FencedError), zombie.error
    assert zombie.storage.created == []
    assert ha_seqs(storage) == before
    assert EmbeddedHAStore(storage).read() == claimed


@pytest.mark.parametrize("publishes", [3, 6])
def test_zombie_claim_after_its_seq_was_collected_gets_a_fresh_epoch(
    storage: Storage, publishes: int
) -> None:
    first = EmbeddedHAStore(storage)
    claimed = first.claim_epoch()
    e1, s = claimed.epoch, claimed.version

    zombie = Zombie(storage)
    zombie.start(lambda z: z.claim_epoch())  # read (seq s, epoch e1), froze

    new = EmbeddedHAStore(storage, keep=3)
    e2 = new.claim_epoch().epoch  # the epoch the zombie is about to write too
    assert e2 == e1 + 1
    for i in range(publishes):
        last = new.publish(e2, [ptr(i, e2)])

    assert s + 1 not in ha_seqs(storage), "the scenario needs seq s+1 collected"
    zombie.wake()
    assert zombie.error is None, zombie.error
    assert zombie.storage.created[0] == pointer_key(s + 1)  # its stale create succeeded
    assert zombie.result is not None
    assert zombie.result.epoch > e2, "the zombie must not get the epoch another attempt holds"
    assert zombie.result.retained == last.retained
    assert EmbeddedHAStore(storage).read() == zombie.result
    with pytest.raises(FencedError):
        new.publish(e2, [])


@pytest.mark.parametrize("successor", ["same-epoch", "new-attempt"])
def test_writer_frozen_before_confirming_keeps_its_success(
    storage: Storage, successor: str
) -> None:
    """A writer whose document was the head, but which froze before its confirming
    listing, must not mistake a successor built on its document for a lost race: no
    FencedError, and no re-publish of its older list on top of the successor's."""
    store = EmbeddedHAStore(storage)
    e = store.claim_epoch().epoch
    slow = Zombie(storage)
    # publish = list (head), read, create, list (confirm): freeze at the second listing.
    slow.start(lambda z: z.publish(e, [ptr(1, e)]), method="list_pages", skip=1)
    assert slow.storage.created == [pointer_key(2)]
    if successor == "same-epoch":
        after = store.publish(e, [ptr(2, e)])
    else:
        after = EmbeddedHAStore(storage).claim_epoch()
        assert after.retained == (ptr(1, e),)  # it read the slow writer's document
    slow.wake()
    assert slow.error is None, slow.error
    assert slow.result is not None and slow.result.version == 2
    assert slow.storage.created == [pointer_key(2)]
    assert EmbeddedHAStore(storage).read() == after


def _corrupt_cases(doc: bytes) -> dict[str, bytes]:
    raw = json.loads(doc)
    altered = dict(raw, epoch=raw["epoch"] + 5)  # checksum left as it was
    wrong_format = dict(raw, format="something.else")
    newer = dict(raw, version=FORMAT_VERSION + 1)
    return {
        "truncated": doc[: len(doc) // 2],
        "garbage": b"\x00\xffnot json",
        "altered": json.dumps(altered).encode(),
        "wrong-format": json.dumps(wrong_format).encode(),
        "newer-version": json.dumps(newer).encode(),
    }


@pytest.mark.parametrize(
    "case", ["truncated", "garbage", "altered", "wrong-format", "newer-version", "moved"]
)
def test_corrupt_head_is_a_clear_error(storage: Storage, case: str) -> None:
    store = EmbeddedHAStore(storage)
    e = store.claim_epoch().epoch
    head = store.publish(e, [ptr(1, e)]).version
    key = pointer_key(head)
    good = storage.read(key)
    if case == "moved":  # a valid document under another seq's name
        bad, key = good, pointer_key(head + 1)
    else:
        bad = _corrupt_cases(good)[case]
    storage.write(key, bad)

    name = key.split("/")[-1]
    with pytest.raises(HAStoreError, match=name):
        store.read()
    with pytest.raises(HAStoreError, match=name):
        store.claim_epoch()
    with pytest.raises(HAStoreError, match=name):
        store.publish(e, [])
    assert storage.read(key) == bad  # nothing "repaired" it behind our back


def test_ha_dir_stays_bounded(storage: Storage) -> None:
    store = EmbeddedHAStore(storage)
    e = store.claim_epoch().epoch
    for i in range(50):
        last = store.publish(e, [ptr(i, e), ptr(i + 1, e)])
    seqs = ha_seqs(storage)
    assert len(seqs) <= store.keep
    assert seqs[-1] == last.version == 51
    assert store.read().retained == (ptr(49, e), ptr(50, e))


def test_documents_hold_only_pointers(storage: Storage) -> None:
    store = EmbeddedHAStore(storage)
    e = store.claim_epoch().epoch
    state = store.publish(e, [ptr(4, e), ptr(5, e)])
    data = storage.read(pointer_key(state.version))
    doc = json.loads(data)
    assert set(doc) == {
        "format",
        "version",
        "seq",
        "epoch",
        "nonce",
        "parent",
        "written_at",
        "retained",
        "checksum",
    }
    assert doc["seq"] == state.version and doc["epoch"] == e
    assert doc["retained"] == [  # each pointer: id, where, who, and the document's checksum
        {"checkpoint_id": 4, "metadata": "chk-4/_metadata", "epoch": e, "checksum": ""},
        {"checkpoint_id": 5, "metadata": "chk-5/_metadata", "epoch": e, "checksum": ""},
    ]
    assert len(data) < 1024


def test_ignores_foreign_files_and_rejects_unsafe_pointers(storage: Storage) -> None:
    store = EmbeddedHAStore(storage)
    e = store.claim_epoch().epoch
    storage.write(f"{HA_DIR}/.99999999999999999999.json.tmp-abc", b"partial")
    storage.write(f"{HA_DIR}/README", b"x")
    assert store.publish(e, [ptr(1, e)]).retained == (ptr(1, e),)
    assert store.read().retained == (ptr(1, e),)
    bad = CheckpointPointer(2, "../other-job/chk-2/_metadata", e)
    with pytest.raises(ValueError):
        store.publish(e, [bad])
    assert store.read().retained == (ptr(1, e),)


def test_publish_needs_a_claimed_current_epoch(storage: Storage) -> None:
    store = EmbeddedHAStore(storage)
    with pytest.raises(ValueError):
        store.publish(0, [])
    e = store.claim_epoch().epoch
    with pytest.raises(FencedError):
        store.publish(e + 1, [])  # never claimed
    assert ha_seqs(storage) == [1]
