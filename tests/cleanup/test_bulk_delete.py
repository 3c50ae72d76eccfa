"""`BulkDeleter` without workers (a local gc): batches are deleted in the caller's
thread as they are handed over; failed names are retried on backoff when the caller
hands over more or waits; a fence stops it. Proven by listing the storage."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from statehold.cleanup.bulk_delete import BulkDeleter
from statehold.ha.base import FencedError
from statehold.storage import open_storage
from tests.support.fault_injection_storage import FaultyStorage


def names(count: int) -> list[str]:
    return [f"e1-c1-{i:06d}.sst" for i in range(count)]


@pytest.mark.parametrize("workers", [0, 1])
def test_every_file_is_deleted_despite_failures(tmp_path: Path, workers: int) -> None:
    storage = open_storage(str(tmp_path / "job"))
    for name in names(300):
        storage.write(f"shared/{name}", b"x")
    storage.write("shared/other.sst", b"kept")
    faulty = FaultyStorage(storage, seed=5, delete_fail_rate=0.5)
    threads: set[str] = set()
    deleter = BulkDeleter(
        faulty, workers=workers, initial_delay=0.001, max_delay=0.01,
        on_deleted=lambda _files, _bytes: threads.add(threading.current_thread().name),
    )
    try:
        for i in range(0, 300, 50):
            deleter.discard_names("shared", names(300)[i : i + 50])
        assert deleter.wait_idle(timeout=60)
        status = deleter.status()
    finally:
        deleter.close()
    assert [f.key for f in storage.list("shared")] == ["shared/other.sst"]
    assert status.deleted == 300 and status.failures > 0 and not status.gave_up
    caller = threading.current_thread().name
    assert (threads == {caller}) if workers == 0 else (caller not in threads)


def test_a_fence_stops_the_deletes_in_the_callers_thread(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path / "job"))
    for name in names(100):
        storage.write(f"shared/{name}", b"x")
    calls = 0

    def guard() -> None:
        nonlocal calls
        calls += 1
        if calls > 1:
            raise FencedError("a new attempt started")

    deleter = BulkDeleter(storage, guard, workers=0)
    try:
        deleter.discard_names("shared", names(100)[:40])
        assert len(list(storage.list("shared"))) == 60  # deleted at once, in this thread
        deleter.discard_names("shared", names(100)[40:])  # the guard says fenced
        deleter.discard_names("shared", names(100)[40:])  # refused: fenced
        assert deleter.status().fenced and deleter.wait_idle(timeout=5)
    finally:
        deleter.close()
    assert len(list(storage.list("shared"))) == 60 and calls == 2
