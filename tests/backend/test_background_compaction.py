"""Compaction off the commit path: a snapshot does not wait for the compaction its flush
starts; the task hands the DB to a thread that lets it finish and keeps the result as a
local snapshot equivalent to the checkpoint; the next restore of exactly that state opens
it, and that checkpoint uploads the compaction's output. Real RocksDB, real local job
directory."""

from __future__ import annotations

import random
from pathlib import Path

from statehold.backend import TaskStateBackend, task_range
from statehold.backend.engine import RUNS_TRIGGER
from statehold.backend.local_snapshots import equivalent_snapshot, read_marker, state_digest
from statehold.backend.rocks import RestoreSource
from statehold.format.metadata import KeyGroupState
from statehold.storage import Storage
from tests.support.task_backend import MAXP, OP, checkpoint, snap

KEYS = [f"user-{i}" for i in range(4000)]


def ssts(state: KeyGroupState) -> int:
    return sum(1 for f in state.files if (f.name or "").endswith(".sst"))


def batch(
    tmp_path: Path, storage: Storage, cid: int, sources: list[RestoreSource] | None,
    model: dict[str, str], rng: random.Random, epoch: int = 1,
) -> tuple[TaskStateBackend, KeyGroupState]:
    """One task's batch as Spark runs it: restore, change 5% of the keys, snapshot."""
    b = TaskStateBackend.open(tmp_path, OP, task_range(0, 1, MAXP), MAXP, sources)
    for k in KEYS if cid == 0 else rng.sample(KEYS, len(KEYS) // 20):
        model[k] = f"{cid}-{epoch}-{rng.random()}"
        b.value_state("v", k).update(model[k])
    return b, snap(b, storage, cid, epoch)


def test_compaction_finishes_after_the_task_and_the_next_checkpoint_uploads_it(
    storage: Storage, tmp_path: Path
) -> None:
    rng = random.Random(7)
    model: dict[str, str] = {}
    sources: list[RestoreSource] | None = None
    compacted_at = None
    for cid in range(3 * RUNS_TRIGGER):
        b, state = batch(tmp_path, storage, cid, sources, model, rng)
        thread = b.close_after_compactions()
        sources = checkpoint(storage, cid, [state])
        if thread is not None:
            compacted_at = cid
            # the snapshot did not wait: the checkpoint holds every run the flush made
            assert ssts(state) >= RUNS_TRIGGER
            thread.join()
            break
    assert compacted_at is not None, "no compaction was started within 48 checkpoints"
    assert not list(b.work_dir.parent.glob("work-*"))  # the thread closed and deleted it
    equivalent = equivalent_snapshot(b.range_dir, compacted_at, state_digest(state))
    assert equivalent is not None
    kept = read_marker(equivalent)
    assert kept is not None
    assert sum(1 for n in kept if n.endswith(".sst")) < ssts(state)

    # the next task opens the compacted copy (nothing downloaded) and uploads its output
    nxt, after = batch(tmp_path, storage, compacted_at + 1, sources, model, rng)
    assert nxt.restore_stats.compacted and nxt.restore_stats.files_downloaded == 0
    nxt.close()
    assert ssts(after) < ssts(state)
    assert after.info["bytes_uploaded"] > 0.5 * after.info["state_size"]

    # the checkpoint restores elsewhere, from storage alone, to exactly the model
    final = checkpoint(storage, compacted_at + 1, [after])
    with TaskStateBackend.open(tmp_path / "elsewhere", OP, task_range(0, 1, MAXP), MAXP,
                               final) as fresh:
        assert not fresh.restore_stats.compacted
        assert {k: s["v"] for k, s in fresh.items()} == model


def test_a_compacted_copy_of_another_attempt_is_not_opened(
    storage: Storage, tmp_path: Path
) -> None:
    """A retried batch writes another state under the same checkpoint id: the compacted
    copy of the first attempt's state does not stand in for it."""
    rng = random.Random(11)
    model: dict[str, str] = {}
    sources: list[RestoreSource] | None = None
    for cid in range(3 * RUNS_TRIGGER):
        restored = dict(model)
        b, state = batch(tmp_path, storage, cid, sources, model, rng)
        thread = b.close_after_compactions()
        if thread is not None:
            thread.join()
            break
        sources = checkpoint(storage, cid, [state])
    assert thread is not None, "no compaction was started within 48 checkpoints"
    assert equivalent_snapshot(b.range_dir, cid, state_digest(state)) is not None
    # attempt 2 of checkpoint `cid`, from the same restored state, writes other values
    retry, retried = batch(tmp_path, storage, cid, sources, restored, rng, epoch=2)
    retry.close()
    assert state_digest(retried) != state_digest(state)
    with TaskStateBackend.open(tmp_path, OP, task_range(0, 1, MAXP), MAXP,
                               checkpoint(storage, cid, [retried], epoch=2)) as b2:
        assert not b2.restore_stats.compacted
        assert {k: s["v"] for k, s in b2.items()} == restored


def test_a_db_written_after_its_snapshot_is_not_kept_as_equivalent(
    storage: Storage, tmp_path: Path
) -> None:
    """Through compactions due and running, a DB written to after its snapshot is closed
    as it is: it no longer holds the checkpoint's state."""
    rng = random.Random(5)
    model: dict[str, str] = {}
    sources: list[RestoreSource] | None = None
    for cid in range(2 * RUNS_TRIGGER):
        b, state = batch(tmp_path, storage, cid, sources, model, rng)
        b.value_state("v", KEYS[0]).update("after the snapshot")
        assert b.close_after_compactions() is None
        sources = checkpoint(storage, cid, [state])
    assert not [m for m in b.range_dir.glob("snap-*/statehold-local.json")
                if "equivalent_to" in m.read_text()]
