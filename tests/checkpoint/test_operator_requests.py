"""Requests from outside to a running attempt (`statehold.checkpoint.requests`), with a
real coordinator on real storage (local and moto S3) and the embedded HA store: only the
attempt a request names acts on it, at most once; a withdrawn or stale request never is;
every request document goes through the deletion policy and none is left behind."""

from __future__ import annotations

import random

import pytest

from statehold.checkpoint.coordinator import CheckpointCoordinator
from statehold.checkpoint.requests import (
    Inbox,
    NoRunningAttemptError,
    collect,
    read_answer,
    submit,
    wait,
    withdraw,
)
from statehold.cleanup.policy import (
    ANSWER_KEEP_SECONDS,
    check_discardable,
    requests_to_remove,
)
from statehold.format import requests as fmt
from statehold.format.requests import Action, Outcome
from statehold.ha.base import FencedError
from statehold.ha.embedded import EmbeddedHAStore
from statehold.storage import Storage
from statehold.storage.base import FileInfo, UnsafePathError
from tests.support.simulated_tasks import MAX_PARALLELISM, RANGES, SimulatedTask, run_checkpoint

JOB = "job-1"


def start(storage: Storage) -> CheckpointCoordinator:
    return CheckpointCoordinator.start(
        storage, EmbeddedHAStore(storage), job_id=JOB, max_parallelism=MAX_PARALLELISM,
        retain=2,
    )


def inbox(coord: CheckpointCoordinator) -> Inbox:
    return Inbox(coord.storage, coord.epoch, coord.check_epoch, coord.discard)


def request_files(storage: Storage) -> list[str]:
    return sorted(i.key for i in storage.list(fmt.REQUESTS_DIR + "/"))


def test_a_request_is_served_once_by_its_attempt_and_leaves_nothing(storage: Storage) -> None:
    coord = start(storage)
    tasks = [SimulatedTask(storage, r, random.Random(1)) for r in RANGES]
    run_checkpoint(coord, tasks, 1)
    box = inbox(coord)
    assert box.poll() == []  # nothing asked: one empty listing
    sent = submit(storage, EmbeddedHAStore(storage), JOB, Action.SAVEPOINT, "sp1")
    assert sent.epoch == coord.epoch
    [got] = box.poll()
    assert got == sent
    assert box.accept(got)
    assert box.poll() == []  # taken: not served twice
    meta = coord.savepoint("sp1")
    box.answer(got, Outcome.DONE, "taken", savepoint_key="savepoints/sp1",
               checkpoint_id=meta.checkpoint_id)
    answer = wait(storage, sent, timeout=5)
    assert answer is not None and answer.outcome is Outcome.DONE
    assert answer.checkpoint_id == 1 and answer.epoch == coord.epoch
    assert coord.cleaner.wait_idle(30)
    assert request_files(storage) == [fmt.answer_key(sent.id)]  # the request went
    collect(storage, sent.id)
    assert request_files(storage) == []
    coord.close()


def test_no_running_attempt_is_refused_at_once(storage: Storage) -> None:
    coord = start(storage)
    coord.close()  # releases its lease
    with pytest.raises(NoRunningAttemptError, match="no running driver .* no lease"):
        submit(storage, EmbeddedHAStore(storage), JOB, Action.STOP)
    assert request_files(storage) == []


def test_a_withdrawn_request_is_never_acted_on(storage: Storage) -> None:
    coord = start(storage)
    sent = submit(storage, EmbeddedHAStore(storage), JOB, Action.STOP)
    assert wait(storage, sent, timeout=0.3) is None  # nobody polled: a timeout
    assert withdraw(storage, sent).outcome is Outcome.WITHDRAWN
    assert request_files(storage) == []  # nothing left behind
    assert inbox(coord).poll() == []
    coord.close()


def test_withdrawing_after_the_attempt_took_it_leaves_it_to_the_attempt(
    storage: Storage,
) -> None:
    coord = start(storage)
    box = inbox(coord)
    sent = submit(storage, EmbeddedHAStore(storage), JOB, Action.STOP)
    [got] = box.poll()
    assert box.accept(got)
    assert withdraw(storage, sent).outcome is Outcome.ACCEPTED  # the attempt decided first
    box.answer(got, Outcome.DONE, "stopped")
    assert coord.cleaner.wait_idle(30)
    assert read_answer(storage, sent.id).outcome is Outcome.DONE  # type: ignore[union-attr]
    assert request_files(storage) == [fmt.answer_key(sent.id)]
    coord.close()


def test_a_request_for_a_killed_attempt_is_refused_by_the_next(storage: Storage) -> None:
    first = start(storage)  # never closed: killed, its lease still looks alive
    pending = submit(storage, EmbeddedHAStore(storage), JOB, Action.SAVEPOINT, "late")
    taken = submit(storage, EmbeddedHAStore(storage), JOB, Action.STOP)
    old = inbox(first)
    got = {r.id: r for r in old.poll()}
    assert old.accept(got[taken.id])  # taken, then the driver dies before answering
    second = start(storage)
    assert second.epoch == first.epoch + 1
    assert inbox(second).poll() == []  # neither is for this attempt
    refused, failed = read_answer(storage, pending.id), read_answer(storage, taken.id)
    assert refused is not None and refused.outcome is Outcome.REFUSED
    assert f"attempt {first.epoch}, which is gone" in refused.message
    assert failed is not None and failed.outcome is Outcome.FAILED
    assert second.cleaner.wait_idle(30)
    assert request_files(storage) == sorted(
        [fmt.answer_key(pending.id), fmt.answer_key(taken.id)]
    )
    assert not storage.exists("savepoints/late/_metadata")
    with pytest.raises(FencedError):  # the old attempt cannot answer any more
        old.answer(got[taken.id], Outcome.DONE, "too late")
    for request_id in (pending.id, taken.id):
        collect(storage, request_id)
    assert request_files(storage) == []
    second.close()


def test_the_policy_removes_only_request_documents() -> None:
    rid = "r20261126230000-0123456789ab"
    assert check_discardable(fmt.request_key(rid)) == fmt.request_key(rid)
    assert check_discardable(fmt.answer_key(rid)) == fmt.answer_key(rid)
    for key in ("_job/result.json", "_job/owner.json", "_job/requests/x.json",
                "_job/requests/../result.json"):
        with pytest.raises(UnsafePathError):
            check_discardable(key)
    now = 10 * ANSWER_KEEP_SECONDS
    old, young = "r20261101000000-aaaaaaaaaaaa", "r20261126000000-bbbbbbbbbbbb"
    unanswered = "r20261101000000-cccccccccccc"
    listing = [
        FileInfo(fmt.request_key(old), 10, 0.0), FileInfo(fmt.answer_key(old), 10, 0.0),
        FileInfo(fmt.answer_key(young), 10, now - 60),
        FileInfo(fmt.request_key(unanswered), 10, 0.0),
        FileInfo("_job/result.json", 10, 0.0),
    ]
    assert requests_to_remove(listing, now=now) == [fmt.request_key(old), fmt.answer_key(old)]
    assert requests_to_remove(listing, answered=[young], now=now) == [
        fmt.request_key(old), fmt.answer_key(old)
    ]
    assert requests_to_remove(listing, collected=[young], now=now) == [
        fmt.request_key(old), fmt.answer_key(old), fmt.answer_key(young)
    ]
