"""Coordinator acceptance: simulated tasks, real storage (local and moto S3), embedded HA."""

from __future__ import annotations

import random
import time

import pytest

from statehold.checkpoint.coordinator import CheckpointCoordinator, CheckpointError
from statehold.cleanup.async_cleaner import AsyncCleaner
from statehold.format import layout
from statehold.format.layout import Kind
from statehold.format.metadata import read_metadata, referenced_keys
from statehold.ha.base import FencedError, HAStoreError
from statehold.ha.embedded import EmbeddedHAStore
from statehold.job.directory import OWNER_KEY
from statehold.storage import Storage, StorageError
from tests.support.fault_injection_storage import FaultyStorage
from tests.support.forwarding_storage import ForwardingStorage
from tests.support.simulated_tasks import (
    MAX_PARALLELISM,
    RANGES,
    SimulatedTask,
    listing,
    referenced_by_retained,
    run_checkpoint,
)


def start(storage: Storage, retain: int = 3) -> CheckpointCoordinator:
    return CheckpointCoordinator.start(
        storage, EmbeddedHAStore(storage), job_id="job-1",
        max_parallelism=MAX_PARALLELISM, retain=retain,
    )


def test_twenty_checkpoints_leave_exactly_the_retained_files(storage: Storage) -> None:
    rng = random.Random(7)
    coord = start(storage)
    tasks = [SimulatedTask(storage, r, rng) for r in RANGES]
    for n in range(1, 21):
        run_checkpoint(coord, tasks, n)
    assert coord.wait_reconciled(60)
    assert [m.checkpoint_id for _, m in coord.retained()] == [18, 19, 20]
    coord.close()  # releases the running attempt's lease (_job/)

    files = listing(storage)
    ha_docs = {k for k in files if layout.parse(k).kind is Kind.HA}
    assert ha_docs, "the embedded HA store keeps its pointers in the job directory"
    assert files - ha_docs - {OWNER_KEY} == referenced_by_retained(storage, coord)
    # shared files written long ago but still reused survived every subsume
    epochs_and_ids = {layout.parse(k).checkpoint_id for k in files if k.startswith("shared/")}
    assert min(i for i in epochs_and_ids if i is not None) < 18


def test_restart_resumes_from_the_ha_store_and_keeps_cleaning(storage: Storage) -> None:
    rng = random.Random(3)
    coord = start(storage)
    tasks = [SimulatedTask(storage, r, rng) for r in RANGES]
    for n in range(1, 6):
        run_checkpoint(coord, tasks, n)
    second = start(storage)
    assert second.epoch == coord.epoch + 1
    assert [m.checkpoint_id for _, m in second.retained()] == [3, 4, 5]
    for n in range(6, 10):
        run_checkpoint(second, tasks, n)
    second.close()
    files = listing(storage)
    ha_docs = {k for k in files if layout.parse(k).kind is Kind.HA}
    assert files - ha_docs - {OWNER_KEY} == referenced_by_retained(storage, second)


def test_second_attempt_fences_the_first(storage: Storage) -> None:
    rng = random.Random(5)
    first = start(storage)
    tasks = [SimulatedTask(storage, r, rng) for r in RANGES]
    for n in range(1, 5):
        run_checkpoint(first, tasks, n)
    assert first.wait_reconciled(60)
    second = CheckpointCoordinator.start(
        storage, EmbeddedHAStore(storage), job_id="job-1", max_parallelism=MAX_PARALLELISM,
        reconcile_in_background=False,  # so that any delete below could only be the first's
    )
    before = listing(storage)

    first.begin(5)
    for task in tasks:
        first.acknowledge(5, "agg", task.snapshot(first.epoch, 5))
    written_by_first = listing(storage) - before
    with pytest.raises(FencedError, match="fenced"):
        first.complete(5, {"batch_id": 5})
    # The fenced attempt deleted nothing: every file that existed is still there.
    after = listing(storage)
    assert before <= after
    assert after - before <= written_by_first | {layout.checkpoint_metadata_key(5)}
    # and completed nothing: the HA store still names the second attempt's view
    assert [p.checkpoint_id for p in second.ha.read().retained] == [2, 3, 4]
    assert second.ha.read().epoch == second.epoch


def test_abort_discards_only_the_aborted_checkpoints_new_files(storage: Storage) -> None:
    rng = random.Random(11)
    coord = start(storage)
    tasks = [SimulatedTask(storage, r, rng) for r in RANGES]
    for n in range(1, 4):
        run_checkpoint(coord, tasks, n)
    before = listing(storage)
    coord.begin(4)
    coord.acknowledge(4, "agg", tasks[0].snapshot(coord.epoch, 4))
    coord.abort(4, "task failed")
    # a task that finishes after the abort: its upload is discarded too
    late = tasks[1].snapshot(coord.epoch, 4)
    coord.acknowledge(4, "agg", late)
    assert coord.wait_reconciled(60)
    assert listing(storage) == before


def test_incomplete_key_group_coverage_is_refused(storage: Storage) -> None:
    coord = start(storage)
    task = SimulatedTask(storage, RANGES[0], random.Random(1))
    coord.begin(1)
    coord.acknowledge(1, "agg", task.snapshot(coord.epoch, 1))
    with pytest.raises(CheckpointError, match="missing"):
        coord.complete(1)


def test_savepoints_are_never_subsumed(storage: Storage) -> None:
    rng = random.Random(13)
    coord = start(storage, retain=1)
    tasks = [SimulatedTask(storage, r, rng) for r in RANGES]
    run_checkpoint(coord, tasks, 1)
    coord.savepoint("before-upgrade")
    for n in range(2, 8):
        run_checkpoint(coord, tasks, n)
    coord.close()
    sp_key = layout.savepoint_metadata_key("before-upgrade")
    sp = read_metadata(storage, sp_key)
    files = listing(storage)
    assert set(referenced_keys(sp, sp_key)) <= files
    ha_docs = {k for k in files if layout.parse(k).kind is Kind.HA}
    expected = referenced_by_retained(storage, coord) | set(referenced_keys(sp, sp_key))
    assert files - ha_docs - {OWNER_KEY} == expected | {sp_key}
    # the savepoint survives a restart too (the registry is rebuilt with it)
    again = start(storage, retain=1)
    run_checkpoint(again, tasks, 8)
    assert set(referenced_keys(sp, sp_key)) <= listing(storage)


class SavepointWriteTimesOut(ForwardingStorage):
    """A savepoint's `_metadata` create that lands but reports a failure."""

    def create_if_absent(self, key: str, data: bytes) -> None:
        self.inner.create_if_absent(key, data)
        if key.startswith("savepoints/"):
            raise StorageError(f"{key}: timed out (the write landed)")


def test_seed_20016_a_savepoint_whose_write_outcome_is_unknown_keeps_its_files(
    storage: Storage,
) -> None:
    """Found by the simulation (seed 20016): the savepoint's document write timed out
    after landing; the registry did not hold its shared files, and subsume deleted them."""
    rng = random.Random(17)
    flaky = SavepointWriteTimesOut(storage)
    coord = start(flaky, retain=1)
    tasks = [SimulatedTask(flaky, r, rng) for r in RANGES]
    run_checkpoint(coord, tasks, 1)
    with pytest.raises(StorageError, match="timed out"):
        coord.savepoint("sp")
    for n in range(2, 6):  # every checkpoint that shared files with it is subsumed
        run_checkpoint(coord, tasks, n)
    coord.close()
    sp_key = layout.savepoint_metadata_key("sp")
    sp = read_metadata(storage, sp_key)  # it landed
    assert set(referenced_keys(sp, sp_key)) <= listing(storage)


class FlakyHA(EmbeddedHAStore):
    """An HA store whose next publish fails: after landing (`landed`) or before."""

    def __init__(self, storage: Storage) -> None:
        super().__init__(storage)
        self.fail_next: str | None = None
        self.unreadable = False

    def publish(self, epoch, retained):  # type: ignore[no-untyped-def]
        mode, self.fail_next = self.fail_next, None
        if mode == "before":
            raise HAStoreError("connection reset before the write")
        state = super().publish(epoch, retained)
        if mode == "landed":
            raise HAStoreError("timed out waiting for the answer")
        return state

    def read(self):  # type: ignore[no-untyped-def]
        if self.unreadable:
            raise HAStoreError("unreachable")
        return super().read()


def test_an_ambiguous_publish_is_resolved_by_reading_the_ha_store(storage: Storage) -> None:
    ha = FlakyHA(storage)
    coord = CheckpointCoordinator.start(storage, ha, job_id="job-1",
                                        max_parallelism=MAX_PARALLELISM, retain=2)
    tasks = [SimulatedTask(storage, r, random.Random(21)) for r in RANGES]
    run_checkpoint(coord, tasks, 1)

    ha.fail_next = "landed"  # the publish went through; only the answer was lost
    run_checkpoint(coord, tasks, 2)
    assert [m.checkpoint_id for _, m in coord.retained()] == [1, 2]

    ha.fail_next = "before"  # the publish never happened: N is aborted, then retried
    coord.begin(3)
    for task in tasks:
        coord.acknowledge(3, "agg", task.snapshot(coord.epoch, 3))
    with pytest.raises(HAStoreError):
        coord.complete(3)
    coord.abort(3, "publish failed")
    # Kept, not deleted: a delete landing late could remove a newer attempt's document.
    leftover = storage.read(layout.checkpoint_metadata_key(3))
    tasks = [task.restore(coord) for task in tasks]
    run_checkpoint(coord, tasks, 3)  # the retry replaces the leftover with its own
    assert coord.wait_reconciled(60)
    assert referenced_by_retained(storage, coord) <= listing(storage)
    retained = ha.read().retained
    assert [p.checkpoint_id for p in retained] == [2, 3]
    assert storage.read(layout.checkpoint_metadata_key(3)) != leftover
    assert read_metadata(storage, retained[-1].metadata).checksum == retained[-1].checksum
    coord.close()


def test_an_abort_that_cannot_read_the_ha_store_deletes_nothing(storage: Storage) -> None:
    ha = FlakyHA(storage)
    coord = CheckpointCoordinator.start(storage, ha, job_id="job-1",
                                        max_parallelism=MAX_PARALLELISM, retain=2)
    tasks = [SimulatedTask(storage, r, random.Random(22)) for r in RANGES]
    run_checkpoint(coord, tasks, 1)
    assert coord.wait_reconciled(60)
    coord.begin(2)
    for task in tasks:
        coord.acknowledge(2, "agg", task.snapshot(coord.epoch, 2))
    ha.fail_next = "landed"
    ha.unreadable = True  # the publish landed, and nobody can tell
    with pytest.raises(HAStoreError):
        coord.complete(2)
    before = listing(storage)
    coord.abort(2, "publish outcome unknown")
    assert coord.cleaner.wait_idle(60)
    assert listing(storage) == before  # N may be retained: nothing of it is deleted
    ha.unreadable = False
    assert [p.checkpoint_id for p in ha.read().retained] == [1, 2]
    assert referenced_by_retained(storage, coord) | {layout.checkpoint_metadata_key(2)} <= before
    coord.cleaner.close()


def test_a_path_that_always_fails_is_reported_and_deleted_once_fixed(storage: Storage) -> None:
    """The job keeps checkpointing while one subsumed file cannot be deleted; the failure
    shows in the attempt's status; once the path is fixed the file goes."""
    faulty = FaultyStorage(storage)
    cleaner = AsyncCleaner(faulty, initial_delay=0.01, max_delay=0.05)
    coord = CheckpointCoordinator.start(faulty, EmbeddedHAStore(faulty), job_id="job-1",
                                        max_parallelism=MAX_PARALLELISM, retain=1,
                                        cleaner=cleaner)
    cleaner.guard = coord.check_epoch
    tasks = [SimulatedTask(faulty, r, random.Random(31)) for r in RANGES]
    run_checkpoint(coord, tasks, 1)
    stuck = next(k for k in listing(storage) if k.startswith("exclusive/e1-c1-"))
    faulty.fail_permanently(stuck)
    for n in range(2, 6):  # checkpoint 1 is subsumed at 2: its exclusive file can't go
        run_checkpoint(coord, tasks, n)
    assert [m.checkpoint_id for _, m in coord.retained()] == [5]
    deadline = time.monotonic() + 60
    while cleaner.status().failures < 3 and time.monotonic() < deadline:
        time.sleep(0.01)  # waits for retries to happen; asserts nothing about speed
    assert cleaner.status().failures >= 3  # retried, not dropped
    status = coord.status()["cleaner"]
    assert status["retrying_count"] >= 1 and any(stuck in e for e in status["last_errors"])
    assert stuck in listing(storage)

    faulty.heal(stuck)
    assert coord.wait_reconciled(60)
    assert stuck not in listing(storage)
    assert referenced_by_retained(storage, coord) <= listing(storage)
    coord.close()


def test_a_timed_out_checkpoint_is_aborted_and_leaves_nothing(storage: Storage) -> None:
    coord = CheckpointCoordinator.start(storage, EmbeddedHAStore(storage), job_id="job-1",
                                        max_parallelism=MAX_PARALLELISM,
                                        checkpoint_timeout=0.0)
    tasks = [SimulatedTask(storage, r, random.Random(32)) for r in RANGES]
    run_checkpoint(coord, tasks, 1)
    assert coord.wait_reconciled(60)
    before = listing(storage)
    coord.begin(2)
    coord.acknowledge(2, "agg", tasks[0].snapshot(coord.epoch, 2))  # the other task hangs
    coord.begin(3)  # checkpoint 2 is older than the timeout: aborted first
    assert coord.pending_ids() == [3]
    coord.acknowledge(2, "agg", tasks[1].snapshot(coord.epoch, 2))  # the late task's upload
    coord.abort(3, "test over")
    assert coord.wait_reconciled(60)
    assert listing(storage) == before
    coord.close()


def test_job_end_removes_a_killed_savepoints_copies(storage: Storage) -> None:
    """A driver killed while it copied a savepoint's files leaves copies without a
    `_metadata`. While the job runs they are spared for the policy's grace (they may be a
    savepoint still being made); the attempt that ends the job holds its epoch, so no
    savepoint can be in the making any more: the job end removes them, however young."""
    from statehold.job.result import JobOutcome, RetentionPolicy, read_result

    coord = start(storage)
    tasks = [SimulatedTask(storage, r, random.Random(11)) for r in RANGES]
    for n in (1, 2):
        run_checkpoint(coord, tasks, n)
    shared = sorted(k for k in listing(storage) if k.startswith("shared/"))
    leftovers = [f"savepoints/sp-2/{k.rsplit('/', 1)[-1]}" for k in shared[:2]]
    for src, dst in zip(shared, leftovers, strict=False):
        storage.copy(src, dst)  # what the killed savepoint had copied
    coord.start_reconcile()
    assert coord.wait_reconciled(60)
    assert all(storage.exists(k) for k in leftovers)  # young: maybe still in the making
    assert coord.end(JobOutcome.FINISHED, RetentionPolicy.KEEP_LATEST, timeout=60)
    assert not any(k.startswith("savepoints/") for k in listing(storage))
    result = read_result(storage)
    assert result is not None and result.state == "clean"
