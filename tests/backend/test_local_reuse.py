"""A task that comes back to an executor which ran its range before restores from that
executor's older local snapshot: it downloads only the files written since (what Spark's
moving of tasks between executors costs), and the other ranges' stale snapshots are kept
for the same reason, within `STALE_KEEP_CHECKPOINTS`."""

from __future__ import annotations

from pathlib import Path

from statehold.backend.keys import task_range
from statehold.backend.local_snapshots import (
    STALE_KEEP_CHECKPOINTS,
    local_pool,
    prune_snapshots,
)
from statehold.backend.rocks import TaskStateBackend
from statehold.format import layout
from statehold.format.metadata import StateFile, read_metadata
from statehold.storage import Storage, open_storage
from tests.support.task_backend import MAXP, OP, CountingStorage, checkpoint, fill, snap


def test_moved_task_downloads_only_what_its_executor_lacks(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path / "job"))
    a, b = tmp_path / "executor-a", tmp_path / "executor-b"
    r0, r1 = task_range(0, 2, MAXP), task_range(1, 2, MAXP)
    keys0 = [k for k in (f"k{i}" for i in range(4000)) if r0.start <= _kg(k) <= r0.end]
    keys1 = [k for k in (f"k{i}" for i in range(4000)) if r1.start <= _kg(k) <= r1.end]
    # checkpoint 1: range 0 on executor A, range 1 on executor B
    with TaskStateBackend.open(a, OP, r0, MAXP) as t:
        expected = fill(t, keys0, "one")
        s0 = snap(t, storage, 1)
    with TaskStateBackend.open(b, OP, r1, MAXP) as t:
        expected |= fill(t, keys1, "one")
        s1 = snap(t, storage, 1)
    src = checkpoint(storage, 1, [s0, s1])
    # checkpoint 2: the tasks swap executors (full downloads: the first time there)
    with TaskStateBackend.open(b, OP, r0, MAXP, src) as t:
        assert t.restore_stats.files_downloaded > 0  # its SSTs were not here
        expected |= fill(t, keys0[:50], "two")
        s0 = snap(t, storage, 2)
    with TaskStateBackend.open(a, OP, r1, MAXP, src) as t:
        expected |= fill(t, keys1[:50], "two")
        s1 = snap(t, storage, 2)
    src = checkpoint(storage, 2, [s0, s1])
    # executor A kept its snapshot of range 0 (checkpoint 1) beside range 1's
    assert list(a.glob("*/kg-*/snap-1-*")) and list(a.glob("*/kg-*/snap-2-*"))

    # checkpoint 3: range 0 back on A: only the files written at checkpoint 2 come down
    (op_dir,) = a.iterdir()
    local = set(local_pool(op_dir))  # (name, checksum) of every file A holds
    counting = CountingStorage(storage)
    moved = [(counting, m, s) for _, m, s in src]
    with TaskStateBackend.open(a, OP, r0, MAXP, moved) as t:
        assert t.restore_stats.files_local > 0
        got = dict(t.items())
    assert got == {k: v for k, v in expected.items() if k in set(keys0)}
    before = {(f.name, f.checksum) for f in checkpoint_files(storage, 1, 0)}
    now = checkpoint_files(storage, 2, 0)
    assert {(f.name, f.checksum) for f in now} & before  # SSTs of checkpoint 1 still used
    metadata_key = layout.checkpoint_metadata_key(2)
    assert sorted(counting.downloads) == sorted(
        layout.resolve(metadata_key, f.path) for f in now if (f.name, f.checksum) not in local
    )
    # the restore of range 0 dropped A's older snapshot of it, not range 1's newer one
    assert not list(a.glob(f"*/kg-{r0.start}-{r0.end}/snap-1-*"))
    assert list(a.glob(f"*/kg-{r1.start}-{r1.end}/snap-2-*"))


def test_stale_snapshots_expire(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path / "job"))
    everything = task_range(0, 1, MAXP)
    with TaskStateBackend.open(tmp_path / "x", OP, everything, MAXP) as t:
        fill(t, ["k1"])
        snap(t, storage, 1)
    (op_dir,) = (tmp_path / "x").iterdir()
    prune_snapshots(op_dir, 1 + STALE_KEEP_CHECKPOINTS)
    assert list(op_dir.glob("kg-*/snap-1-*"))
    prune_snapshots(op_dir, 2 + STALE_KEEP_CHECKPOINTS)
    assert not list(op_dir.glob("kg-*/snap-1-*"))


def checkpoint_files(storage: Storage, cid: int, task: int) -> list[StateFile]:
    meta = read_metadata(storage, layout.checkpoint_metadata_key(cid))
    return list(meta.operators[0].ranges[task].files)


def _kg(key: str) -> int:
    from statehold.backend.keys import key_group_of

    return key_group_of(key, MAXP)


def test_rerun_of_a_task_restores_the_previous_checkpoint(tmp_path: Path) -> None:
    """A lost cached result makes Spark run a finished task again on the same executor:
    the re-run must restore checkpoint N-1, not the N its first run left in the local
    snapshots, and upload its own files; the checkpoint that completes with the first
    run's handle must restore that run's state, though the re-run's local snapshot holds
    RocksDB files of the same names."""
    storage = open_storage(str(tmp_path / "job"))
    a = tmp_path / "executor-a"
    r0 = task_range(0, 2, MAXP)
    keys = [k for k in (f"k{i}" for i in range(2000)) if r0.start <= _kg(k) <= r0.end]
    with TaskStateBackend.open(a, OP, r0, MAXP) as t:
        before = fill(t, keys, "one")
        src = checkpoint(storage, 1, [snap(t, storage, 1)])
    with TaskStateBackend.open(a, OP, r0, MAXP, src) as t:  # checkpoint 2, first run
        first = before | fill(t, keys[:40], "first")
        first_run = snap(t, storage, 2)
    with TaskStateBackend.open(a, OP, r0, MAXP, src) as t:  # checkpoint 2, the re-run
        assert dict(t.items()) == before  # checkpoint 1's state, not the first run's
        fill(t, keys[20:60], "re-run")
        re_run = snap(t, storage, 2)
    new_first = {f.name: f.path for f in first_run.files if "-c2-" in f.path}
    new_re_run = {f.name: f.path for f in re_run.files if "-c2-" in f.path}
    assert set(new_first) & set(new_re_run)  # the same RocksDB names, uploaded apart ...
    assert not set(new_first.values()) & set(new_re_run.values())
    src = checkpoint(storage, 2, [first_run])  # ... the first run's handle completes 2
    with TaskStateBackend.open(a, OP, r0, MAXP, src) as t:
        assert dict(t.items()) == first
