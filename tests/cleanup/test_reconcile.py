"""Reconcile after failover, offline gc, and job-end cleanup — proven by listing storage."""

from __future__ import annotations

import random
import time

from statehold.cleanup.reconcile import live_attempt, plan, referenced_by_job
from statehold.format import layout
from statehold.format.layout import Kind
from statehold.job.directory import OWNER_KEY
from statehold.job.lease import Lease, lease_key
from statehold.job.result import (
    JobOutcome,
    RetentionPolicy,
    read_result,
    write_result,
)
from statehold.storage import Storage
from tests.support.in_flight import leave_in_flight_mess, ours, start
from tests.support.simulated_tasks import (
    RANGES,
    SimulatedTask,
    listing,
    referenced_by_retained,
    run_checkpoint,
)


def test_new_attempt_reconciles_what_a_crashed_one_left(storage: Storage) -> None:
    rng = random.Random(1)
    crashed = start(storage)
    tasks = [SimulatedTask(storage, r, rng) for r in RANGES]
    for n in range(1, 5):
        run_checkpoint(crashed, tasks, n)
    mess = leave_in_flight_mess(storage, crashed, tasks, 5)
    assert mess
    storage.write("notes.txt", b"a file statehold did not make")
    crashed.cleaner.close()  # the crashed driver does nothing more, maybe not even its discards
    left_behind = ours(listing(storage)) - referenced_by_retained(storage, crashed)

    second = start(storage)
    assert second.wait_reconciled(60)
    assert second.last_reconcile is not None
    assert mess <= left_behind
    # chk-5/ names no epoch and the new attempt is about to write its own checkpoint 5:
    # it stays until that checkpoint replaces it (or a later reconcile finds it stale)
    unpublished = layout.checkpoint_metadata_key(5)
    assert {f.key for f in second.last_reconcile.orphans} == left_behind - {
        "notes.txt", unpublished
    }
    assert second.last_reconcile.protected == [unpublished]
    assert second.last_reconcile.foreign == ["notes.txt"]
    tasks = [task.restore(second) for task in tasks]
    for n in (5, 6):
        run_checkpoint(second, tasks, n)
    second.close()
    assert ours(listing(storage)) == referenced_by_retained(storage, second) | {"notes.txt"}


def test_reconcile_spares_the_live_attempts_in_flight_files(storage: Storage) -> None:
    rng = random.Random(2)
    coord = start(storage)
    tasks = [SimulatedTask(storage, r, rng) for r in RANGES]
    for n in range(1, 4):
        run_checkpoint(coord, tasks, n)
    coord.wait_reconciled(60)
    in_flight = leave_in_flight_mess(storage, coord, tasks, 4)

    # an offline `gc` while the job runs: the lease says the attempt is alive
    live = live_attempt(coord.job, coord.ha.read())
    assert live is not None and live.epoch == coord.epoch
    gc_plan = plan(coord.job, live)
    assert in_flight <= set(gc_plan.protected)
    assert not gc_plan.orphans
    # and the checkpoint completes afterwards with every file present
    coord.complete(4)
    assert referenced_by_retained(storage, coord) <= listing(storage)
    coord.close()


def test_gc_of_a_crashed_job_deletes_its_in_flight_files(storage: Storage) -> None:
    rng = random.Random(3)
    coord = start(storage, lease_ttl=60.0)
    tasks = [SimulatedTask(storage, r, rng) for r in RANGES]
    for n in range(1, 3):
        run_checkpoint(coord, tasks, n)
    coord.wait_reconciled(60)
    mess = leave_in_flight_mess(storage, coord, tasks, 3)
    coord.cleaner.close()
    assert coord.lease is not None
    coord.lease.stop(release=False)  # the driver died: nobody renews its lease
    assert live_attempt(coord.job, coord.ha.read()) is not None
    an_hour_later = time.time() + 3600
    assert live_attempt(coord.job, coord.ha.read(), now=an_hour_later) is None
    gc_plan = plan(coord.job, None)
    # chk-3/ is the one key the next attempt writes again for checkpoint 3: an outside gc
    # spares it (a delete landing after that write would take a published document);
    # the attempt that replaces it, or the job's end, removes it.
    next_chk = {k for k in mess if k.startswith("chk-3/")}
    assert next_chk, "the mess has a chk-3/ folder"
    assert {f.key for f in gc_plan.orphans} == mess - next_chk
    assert next_chk <= set(gc_plan.protected)
    # never anything a retained checkpoint references
    assert not {f.key for f in gc_plan.orphans} & referenced_by_job(coord.job)


def test_seed_1009_an_older_attempt_starting_late_keeps_a_newer_lease(storage: Storage) -> None:
    """Found by the simulation (seed 1009): an attempt of epoch 19 that got to its lease
    after epoch 20 had started removed epoch 20's lease, so an outside gc saw no running
    attempt and deleted epoch 20's in-flight files, which it then published."""
    newer = Lease(storage, 20, ttl=60).start(background=False)
    older = Lease(storage, 19, ttl=60).start(background=False)
    assert storage.exists(lease_key(20))
    assert storage.exists(lease_key(19))  # its own; the newer attempt's start removes it
    Lease(storage, 21, ttl=60).start(background=False)
    assert not storage.exists(lease_key(19)) and not storage.exists(lease_key(20))
    newer.stop(release=False)
    older.stop(release=False)


def test_lease_is_per_epoch_and_released(storage: Storage) -> None:
    lease = Lease(storage, 7, ttl=60).start()
    assert lease.is_fresh()
    assert storage.exists(lease_key(7))
    newer = Lease(storage, 8, ttl=60).start()  # a new attempt removes older leases
    assert not storage.exists(lease_key(7))
    lease.stop(release=False)
    newer.stop()
    assert not storage.exists(lease_key(8))


def test_job_end_keep_latest_leaves_exactly_the_newest_checkpoint(storage: Storage) -> None:
    rng = random.Random(4)
    coord = start(storage)
    tasks = [SimulatedTask(storage, r, rng) for r in RANGES]
    for n in range(1, 6):
        run_checkpoint(coord, tasks, n)
    leave_in_flight_mess(storage, coord, tasks, 6)
    assert coord.end(JobOutcome.FINISHED, RetentionPolicy.KEEP_LATEST)
    coord.close()
    result = read_result(storage)
    assert result is not None and result.state == "clean"
    assert [p.checkpoint_id for p in coord.ha.read().retained] == [5]
    assert ours(listing(storage)) == referenced_by_retained(storage, coord)
    assert {k for k in listing(storage) if layout.parse(k).kind is Kind.JOB} == {
        "_job/result.json",
        OWNER_KEY,  # which HA store owns the job: kept as long as the directory
    }


def test_job_end_delete_all_leaves_only_the_fence_and_the_entry(storage: Storage) -> None:
    rng = random.Random(5)
    coord = start(storage)
    tasks = [SimulatedTask(storage, r, rng) for r in RANGES]
    for n in range(1, 4):
        run_checkpoint(coord, tasks, n)
    storage.write("_spark/offsets/0", b"spark's own")
    assert coord.end(JobOutcome.CANCELLED, RetentionPolicy.DELETE_ALL)
    coord.close()
    left = listing(storage)
    assert {k for k in left if layout.parse(k).kind is not Kind.HA} == {
        "_job/result.json",
        OWNER_KEY,
    }
    assert coord.ha.read().retained == ()


def test_a_dirty_entry_is_finished_by_the_next_driver(storage: Storage) -> None:
    rng = random.Random(6)
    coord = start(storage)
    tasks = [SimulatedTask(storage, r, rng) for r in RANGES]
    for n in range(1, 5):
        run_checkpoint(coord, tasks, n)
    coord.wait_reconciled(60)
    # the driver wrote the dirty entry and died before cleaning anything
    write_result(storage, job_id="job-1", epoch=coord.epoch, outcome=JobOutcome.FAILED,
                 policy=RetentionPolicy.KEEP_LATEST, state="dirty")
    coord.cleaner.close()

    again = start(storage)
    assert [m.checkpoint_id for _, m in again.retained()] == [4]
    assert again.wait_reconciled(60)
    assert ours(listing(storage)) == referenced_by_retained(storage, again)
    assert read_result(storage) is None  # it runs again now
    again.close()


def test_a_running_attempt_reconciles_every_few_checkpoints(storage: Storage) -> None:
    """What no discard names — here the upload of a task attempt that failed after
    uploading, never acknowledged — is found by the periodic reconcile."""
    coord = start(storage, reconcile_every=3)
    tasks = [SimulatedTask(storage, r, random.Random(8)) for r in RANGES]
    run_checkpoint(coord, tasks, 1)
    assert coord.wait_reconciled(60)
    stray = layout.shared_key(coord.epoch, 2, "failed-attempt")
    storage.write(stray, b"uploaded by a task attempt that then died")
    run_checkpoint(coord, tasks, 2)
    assert coord.wait_reconciled(60)
    assert stray in listing(storage)  # two completions since the start: no reconcile yet
    run_checkpoint(coord, tasks, 3)  # the third: a reconcile runs
    assert coord.wait_reconciled(60)
    assert stray not in listing(storage)
    assert referenced_by_retained(storage, coord) <= listing(storage)
    coord.close()
