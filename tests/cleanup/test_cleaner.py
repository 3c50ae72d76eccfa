"""AsyncCleaner against real storage (local disk and moto S3) behind the fault injector."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from statehold.cleanup.async_cleaner import AsyncCleaner
from statehold.cleanup.cleaner import SyncCleaner
from statehold.cleanup.discard import Discard
from statehold.ha.base import FencedError, HAStoreError
from statehold.storage import LocalStorage, Storage
from tests.support.fault_injection_storage import FaultyStorage

FAST: dict[str, Any] = {"initial_delay": 0.001, "max_delay": 0.02, "jitter": 0.5, "seed": 3}


def _fill(storage: Storage, keys: list[str]) -> None:
    for k in keys:
        storage.write(k, b"x")


def _keys(storage: Storage) -> set[str]:
    return {f.key for f in storage.list()}


def _wait_for(cond: Callable[[], bool], timeout: float = 20.0) -> None:
    """Wait (not a timing assertion: the timeout only stops a broken test hanging)."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition never became true"
        time.sleep(0.002)


class Gate:
    """A storage hook that holds every delete until released, and records its thread."""

    def __init__(self) -> None:
        self.received = threading.Event()
        self.release = threading.Event()
        self.threads: list[threading.Thread] = []

    def __call__(self, method: str, kind: str) -> None:
        if kind == "delete":
            self.threads.append(threading.current_thread())
            self.received.set()
            self.release.wait(20)


@pytest.fixture
def cleaners() -> Iterator[list[AsyncCleaner]]:
    made: list[AsyncCleaner] = []
    yield made
    for c in made:
        c.close(timeout=20)


def test_transient_failures_all_discards_eventually_succeed(
    storage: Storage, cleaners: list[AsyncCleaner]
) -> None:
    discarded = [f"exclusive/e1-c{i // 10}-{i:03d}" for i in range(60)]
    chk_dirs = [f"chk-{n}" for n in (1, 2, 3)]
    in_dirs = [f"{d}/{name}" for d in chk_dirs for name in ("_metadata", "a", "sub/b")]
    kept = ["shared/e1-c4-keep", "exclusive/e1-c4-keep", "chk-4/_metadata", "taskowned/t"]
    _fill(storage, discarded + in_dirs + kept)
    faulty = FaultyStorage(storage, seed=11, delete_fail_rate=0.3)
    cleaner = AsyncCleaner(faulty, batch_size=7, **FAST)
    cleaners.append(cleaner)

    for i in range(0, len(discarded), 20):
        cleaner.discard(Discard(keys=tuple(discarded[i : i + 20]), reason="subsumed"))
    cleaner.discard(Discard(dirs=tuple(chk_dirs), reason="subsumed"))
    cleaner.discard(Discard(keys=tuple(discarded[:5])))  # a repeated discard is harmless

    assert cleaner.wait_idle(timeout=30)
    assert _keys(storage) == set(kept)
    status = cleaner.status()
    assert status.failures > 0 and sum(faulty.injected.values()) >= status.failures
    assert (status.pending_keys, status.pending_dirs, status.retrying_count) == (0, 0, 0)
    assert status.deleted >= len(discarded) + len(in_dirs)


def test_permanent_failure_is_retried_reported_and_healed(
    storage: Storage, cleaners: list[AsyncCleaner], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="statehold.cleanup.cleaner")
    bad = "exclusive/e1-c1-bad"
    others = [f"exclusive/e1-c1-{i}" for i in range(5)]
    _fill(storage, [bad, *others, "shared/keep"])
    faulty = FaultyStorage(storage)
    faulty.fail_permanently(bad)
    cleaner = AsyncCleaner(faulty, **FAST)
    cleaners.append(cleaner)

    cleaner.discard(Discard(keys=(others[0], bad, *others[1:])))
    _wait_for(lambda: cleaner.status().failures >= 4)  # it keeps retrying

    assert _keys(storage) == {bad, "shared/keep"}  # the others were not held up
    status = cleaner.status()
    assert (status.pending_keys, status.retrying, status.retrying_count) == (1, [bad], 1)
    assert any(bad in e for e in status.last_errors)
    assert not cleaner.wait_idle(timeout=0.05)
    assert any(
        r.name == "statehold.cleanup.cleaner"
        and r.levelno == logging.WARNING
        and bad in r.getMessage()
        for r in caplog.records
    )

    faulty.heal(bad)
    assert cleaner.wait_idle(timeout=20)
    assert _keys(storage) == {"shared/keep"}
    status = cleaner.status()
    assert (status.pending_keys, status.retrying, status.gave_up) == (0, [], 0)


def test_discard_returns_without_waiting_for_storage(
    storage: Storage, cleaners: list[AsyncCleaner]
) -> None:
    _fill(storage, ["exclusive/a", "exclusive/b", "chk-1/_metadata", "shared/keep"])
    gate = Gate()
    faulty = FaultyStorage(storage, hook=gate)
    cleaner = AsyncCleaner(faulty, **FAST)
    cleaners.append(cleaner)

    cleaner.discard(Discard(keys=("exclusive/a",)))
    assert gate.received.wait(20)  # the worker is now stuck inside the storage call
    cleaner.discard(Discard(keys=("exclusive/b",), dirs=("chk-1",)))

    # the second discard returned while the storage had not even received it
    assert faulty.calls["delete_many"] == 1 and faulty.calls["delete_prefix"] == 0
    assert _keys(storage) == {"exclusive/a", "exclusive/b", "chk-1/_metadata", "shared/keep"}
    status = cleaner.status()
    assert (status.pending_keys, status.pending_dirs) == (2, 1)

    gate.release.set()
    assert cleaner.wait_idle(timeout=20)
    assert _keys(storage) == {"shared/keep"}
    assert gate.threads and threading.main_thread() not in gate.threads
    assert threading.current_thread() not in gate.threads


def test_directory_discards_remove_the_whole_checkpoint_dir(
    storage: Storage, cleaners: list[AsyncCleaner]
) -> None:
    gone = ["chk-3/_metadata", "chk-3/a", "chk-3/deep/er/b", "chk-4/_metadata"]
    kept = ["chk-30/_metadata", "chk-3x/_metadata", "shared/chk-3"]
    _fill(storage, gone + kept)
    cleaner = AsyncCleaner(FaultyStorage(storage), **FAST)
    cleaners.append(cleaner)
    cleaner.discard(Discard(dirs=("chk-3", "chk-4/", "chk-99")))  # chk-99 never existed
    assert cleaner.wait_idle(timeout=20)
    assert _keys(storage) == set(kept)
    assert cleaner.status().deleted == len(gone)
    if isinstance(storage, LocalStorage):
        assert not (storage.root / "chk-3").exists() and not (storage.root / "chk-4").exists()


def test_fenced_cleaner_deletes_nothing_more(
    storage: Storage, cleaners: list[AsyncCleaner]
) -> None:
    fenced = threading.Event()
    guard_calls: list[bool] = []

    def guard() -> None:
        guard_calls.append(fenced.is_set())
        if fenced.is_set():
            raise FencedError("epoch 1 is fenced: the job's current epoch is 2")

    bad = "exclusive/e1-c1-bad"
    _fill(storage, ["exclusive/e1-c1-a", bad, "exclusive/e1-c2-x", "chk-2/_metadata"])
    faulty = FaultyStorage(storage)
    faulty.fail_permanently(bad)
    cleaner = AsyncCleaner(faulty, guard, **FAST)
    cleaners.append(cleaner)

    cleaner.discard(Discard(keys=("exclusive/e1-c1-a", bad)))
    _wait_for(lambda: cleaner.status().failures >= 2)
    assert _keys(storage) == {bad, "exclusive/e1-c2-x", "chk-2/_metadata"}

    fenced.set()
    faulty.heal(bad)  # would succeed now, but the attempt is fenced
    cleaner.discard(Discard(keys=("exclusive/e1-c2-x",), dirs=("chk-2",)))
    assert cleaner.wait_idle(timeout=20)  # the queue was dropped
    status = cleaner.status()
    assert status.fenced and (status.pending_keys, status.pending_dirs) == (0, 0)
    assert any("fenced" in e for e in status.last_errors)
    assert guard_calls[-1] is True
    assert _keys(storage) == {bad, "exclusive/e1-c2-x", "chk-2/_metadata"}

    calls = faulty.calls
    cleaner.discard(Discard(keys=(bad,)))  # dropped at once
    assert cleaner.wait_idle(timeout=20)
    assert faulty.calls == calls
    assert _keys(storage) == {bad, "exclusive/e1-c2-x", "chk-2/_metadata"}


def test_guard_errors_other_than_fencing_pause_deletes(
    storage: Storage, cleaners: list[AsyncCleaner]
) -> None:
    outages = [HAStoreError("zookeeper unreachable")] * 3

    def guard() -> None:
        if outages:
            raise outages.pop()

    _fill(storage, ["exclusive/a", "shared/keep"])
    cleaner = AsyncCleaner(FaultyStorage(storage), guard, **FAST)
    cleaners.append(cleaner)
    cleaner.discard(Discard(keys=("exclusive/a",)))
    assert cleaner.wait_idle(timeout=20)
    assert _keys(storage) == {"shared/keep"}
    status = cleaner.status()
    assert not status.fenced and status.deleted == 1
    assert sum("unreachable" in e for e in status.last_errors) == 3


def test_bulk_deletes_are_batched(storage: Storage, cleaners: list[AsyncCleaner]) -> None:
    discarded = [f"exclusive/e1-c1-{i:04d}" for i in range(2500)]
    existing = discarded[::50]  # the rest are already gone: deleting them is a success
    _fill(storage, existing + ["shared/keep"])
    faulty = FaultyStorage(storage)
    cleaner = AsyncCleaner(faulty, **FAST)
    cleaners.append(cleaner)
    cleaner.discard(Discard(keys=tuple(discarded)))
    assert cleaner.wait_idle(timeout=30)
    assert faulty.calls["delete_many"] == 3
    assert _keys(storage) == {"shared/keep"}
    assert cleaner.status().deleted == len(discarded)


def test_max_attempts_gives_up_and_leaves_the_file(
    storage: Storage, cleaners: list[AsyncCleaner], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="statehold.cleanup.cleaner")
    _fill(storage, ["exclusive/bad", "exclusive/ok"])
    faulty = FaultyStorage(storage)
    faulty.fail_permanently("exclusive/bad")
    cleaner = AsyncCleaner(faulty, max_attempts=3, **FAST)
    cleaners.append(cleaner)
    cleaner.discard(Discard(keys=("exclusive/bad", "exclusive/ok")))
    assert cleaner.wait_idle(timeout=20)
    status = cleaner.status()
    assert (status.failures, status.gave_up, status.retrying_count) == (3, 1, 0)
    assert _keys(storage) == {"exclusive/bad"}
    assert any("gave up" in r.getMessage() for r in caplog.records)


def test_backlog_bound(
    storage: Storage, cleaners: list[AsyncCleaner], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="statehold.cleanup.cleaner")
    keys = [f"exclusive/k{i}" for i in range(8)]
    _fill(storage, keys)
    gate = Gate()
    cleaner = AsyncCleaner(
        FaultyStorage(storage, hook=gate),
        batch_size=2,
        max_backlog=5,
        **FAST,
    )
    cleaners.append(cleaner)
    cleaner.discard(Discard(keys=tuple(keys[:4])))
    assert not cleaner.backlogged()
    assert gate.received.wait(20)
    cleaner.discard(Discard(keys=tuple(keys[4:])))
    assert cleaner.backlogged() and cleaner.status().backlogged
    assert any("backlog" in r.getMessage() for r in caplog.records)
    gate.release.set()
    assert cleaner.wait_idle(timeout=20)
    assert not cleaner.backlogged()
    assert _keys(storage) == set()


def test_closed_cleaner_drops_new_discards(storage: Storage) -> None:
    _fill(storage, ["exclusive/a"])
    cleaner = AsyncCleaner(storage, **FAST)
    cleaner.close(timeout=20)
    cleaner.discard(Discard(keys=("exclusive/a",)))
    assert cleaner.wait_idle(timeout=1)
    assert _keys(storage) == {"exclusive/a"}


def test_unsafe_paths_are_refused_in_the_caller(storage: Storage) -> None:
    with AsyncCleaner(storage, **FAST) as cleaner:
        with pytest.raises(ValueError):
            cleaner.discard(Discard(keys=("../outside",)))
        with pytest.raises(ValueError):
            cleaner.discard(Discard(dirs=("",)))  # never the whole root
        assert cleaner.status().pending_keys == 0


def test_sync_cleaner_still_deletes_in_the_caller(storage: Storage) -> None:
    _fill(storage, ["exclusive/a", "chk-1/_metadata", "shared/keep"])
    cleaner = SyncCleaner(storage)
    cleaner.discard(Discard(keys=("exclusive/a",), dirs=("chk-1",)))
    assert _keys(storage) == {"shared/keep"}
    assert cleaner.status().deleted == 2


def test_backoff_grows_is_capped_and_spread() -> None:
    import random

    from statehold.cleanup.retry import Backoff

    plain = Backoff(0.1, 1.0, 2.0, jitter=0.0)
    assert [plain.delay(n) for n in (1, 2, 3, 4, 5, 50)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    spread = Backoff(0.1, 1.0, 2.0, jitter=0.5)
    rng = random.Random(1)
    delays = [spread.delay(3, rng) for _ in range(200)]
    assert all(0.2 <= d <= 0.6 for d in delays) and len(set(delays)) > 100
    assert spread.delay(3) == 0.4  # no generator, no jitter
    for bad in ({"initial": -1.0}, {"cap": 0.01}, {"multiplier": 0.5}, {"jitter": 2.0}):
        with pytest.raises(ValueError):
            Backoff(**bad)  # type: ignore[arg-type]
