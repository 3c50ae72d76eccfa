"""The HA-store contract, as plain functions any backend's tests can run.

Each `check_*` takes `make_store`: a callable returning a new client (an `HAStore`) of one
fresh, empty job — every call a separate client of the *same* job, as separate drivers
would have. Run them all with::

    @pytest.mark.parametrize("check", ALL_CHECKS, ids=lambda c: c.__name__)
    def test_contract(check, make_store):
        check(make_store)

Besides `HAStore`'s docstrings, the contract asks that `HAState.version` grows with every
successful claim or publish (it is how the concurrency checks order the winners).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest

from statehold.ha import CheckpointPointer, FencedError, HAState, HAStore, HAStoreError

StoreFactory = Callable[[], HAStore]

#: Not an assertion: only keeps a broken backend from hanging the test run.
_HANG_GUARD = 60.0


@contextmanager
def _client(make_store: StoreFactory) -> Iterator[HAStore]:
    store = make_store()
    try:
        yield store
    finally:
        store.close()


def ptr(checkpoint_id: int, epoch: int) -> CheckpointPointer:
    return CheckpointPointer(checkpoint_id, f"chk-{checkpoint_id}/_metadata", epoch)


def check_new_job_reads_epoch_zero(make_store: StoreFactory) -> None:
    with _client(make_store) as store:
        state = store.read()
        assert state.epoch == 0
        assert state.retained == ()
        assert state.latest is None


def check_claim_increments(make_store: StoreFactory) -> None:
    with _client(make_store) as a, _client(make_store) as b:
        first = a.claim_epoch()
        assert first.epoch == 1
        assert b.read().epoch == 1
        second = b.claim_epoch()
        assert second.epoch == 2
        assert second.version > first.version
        assert a.read().epoch == 2


def check_publish_read_round_trip(make_store: StoreFactory) -> None:
    with _client(make_store) as store, _client(make_store) as reader:
        epoch = store.claim_epoch().epoch
        retained = (ptr(3, epoch), ptr(4, epoch), ptr(5, epoch))
        published = store.publish(epoch, retained)
        assert published.epoch == epoch
        assert published.retained == retained
        assert published.latest == ptr(5, epoch)
        seen = reader.read()
        assert seen.epoch == epoch
        assert seen.retained == retained
        # Replacing (here: shrinking) the list works, and a claim keeps the pointers.
        store.publish(epoch, retained[1:])
        assert reader.read().retained == retained[1:]
        claimed = reader.claim_epoch()
        assert claimed.epoch == epoch + 1
        assert claimed.retained == retained[1:]


def check_second_claim_fences_first(make_store: StoreFactory) -> None:
    with _client(make_store) as old, _client(make_store) as new:
        e1 = old.claim_epoch().epoch
        old.publish(e1, [ptr(1, e1)])
        old.check_epoch(e1)  # current: no error
        taken = new.claim_epoch()
        e2 = taken.epoch
        assert e2 > e1
        assert taken.retained == (ptr(1, e1),)

        with pytest.raises(FencedError):
            old.publish(e1, [ptr(1, e1), ptr(2, e1)])
        state = new.read()
        assert state.epoch == e2
        assert state.retained == (ptr(1, e1),)  # unchanged by the fenced publish
        with pytest.raises(FencedError):
            old.check_epoch(e1)
        new.check_epoch(e2)
        # The new attempt goes on normally.
        assert new.publish(e2, [ptr(1, e1), ptr(2, e2)]).retained == (ptr(1, e1), ptr(2, e2))
        with pytest.raises(FencedError):
            old.publish(e1, [])
        assert old.read().retained == (ptr(1, e1), ptr(2, e2))


def check_concurrent_claims_distinct(make_store: StoreFactory, threads: int = 6) -> None:
    with _client(make_store) as setup:
        e0 = setup.claim_epoch().epoch
        setup.publish(e0, [ptr(7, e0)])
    barrier = threading.Barrier(threads)

    def claim(_: int) -> HAState:
        with _client(make_store) as store:
            barrier.wait(_HANG_GUARD)
            return store.claim_epoch()

    with ThreadPoolExecutor(threads) as pool:
        results = list(pool.map(claim, range(threads), timeout=_HANG_GUARD))
    epochs = [r.epoch for r in results]
    assert len(set(epochs)) == threads, f"two attempts got the same epoch: {sorted(epochs)}"
    assert min(epochs) > e0
    assert all(r.retained == (ptr(7, e0),) for r in results)
    with _client(make_store) as reader:
        final = reader.read()
    assert final.epoch == max(epochs)
    # Only the newest claim is current.
    for r in results:
        if r.epoch != final.epoch:
            with _client(make_store) as s, pytest.raises(FencedError):
                s.publish(r.epoch, [])


def check_concurrent_publishers_lose_nothing(
    make_store: StoreFactory, threads: int = 5, rounds: int = 4
) -> list[BaseException]:
    """Publishers of one epoch race; each call succeeds with its state having been the
    current one (distinct, growing versions; the final state is the newest success) or
    raises. Returns the exceptions raised, so a backend's own test can be stricter."""
    with _client(make_store) as setup:
        epoch = setup.claim_epoch().epoch
    barrier = threading.Barrier(threads)

    def publisher(t: int) -> tuple[list[HAState], list[BaseException]]:
        ok: list[HAState] = []
        errors: list[BaseException] = []
        with _client(make_store) as store:
            barrier.wait(_HANG_GUARD)
            for r in range(rounds):
                mine = (ptr(0, epoch), ptr(1000 * (t + 1) + r, epoch))
                try:
                    state = store.publish(epoch, mine)
                except (FencedError, HAStoreError) as e:
                    errors.append(e)
                    continue
                assert state.retained == mine
                assert state.epoch == epoch
                ok.append(state)
        return ok, errors

    with ThreadPoolExecutor(threads) as pool:
        results = list(pool.map(publisher, range(threads), timeout=_HANG_GUARD))
    successes = [s for ok, _ in results for s in ok]
    errors = [e for _, errs in results for e in errs]
    assert successes, f"no publish succeeded: {errors[:3]}"
    versions = [s.version for s in successes]
    assert len(set(versions)) == len(versions), "two publishes claim the same version"
    for ok, _ in results:  # one client's successive successes are ordered
        assert [s.version for s in ok] == sorted(s.version for s in ok)
    newest = max(successes, key=lambda s: s.version)
    with _client(make_store) as reader:
        final = reader.read()
    assert final.epoch == epoch
    assert final.retained == newest.retained
    return errors


ALL_CHECKS: tuple[Callable[[StoreFactory], object], ...] = (
    check_new_job_reads_epoch_zero,
    check_claim_increments,
    check_publish_read_round_trip,
    check_second_claim_fences_first,
    check_concurrent_claims_distinct,
    check_concurrent_publishers_lose_nothing,
)
