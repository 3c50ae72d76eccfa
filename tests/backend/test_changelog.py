"""Changelog commits (`changelog=True`): a checkpoint uploads the batch's writes, a restore
replays them onto the base, on local disk and on moto-S3 job directories."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from statehold.backend import StateBackendError, TaskStateBackend, task_of_key, task_range
from statehold.backend import changelog as changelog_module
from statehold.backend.changelog import is_changelog
from statehold.backend.rocks import RestoreSource
from statehold.format import layout
from statehold.format.metadata import KeyGroupState, read_metadata, referenced_keys
from statehold.storage import Storage
from statehold.storage.base import bytes_checksum, file_checksum
from tests.support.task_backend import MAXP, OP, checkpoint, close_as_a_task, snap


def changelogs(kgs: KeyGroupState) -> list[str]:
    return [f.name for f in kgs.files if is_changelog(f.name)]


def apply_batch(b: TaskStateBackend, model: dict[str, Any], keys: list[str],
                rng: random.Random, tag: str, share: float = 0.05) -> None:
    """Updates, deletes and map changes on `share` of `keys`, mirrored in `model`."""
    for k in rng.sample(keys, int(len(keys) * share)):
        st = b.for_key(k)
        if rng.random() < 0.15:
            st.value("v").clear()
            st.map("m").clear()
            model.pop(k, None)
            continue
        st.value("v").update([tag, k])
        st.map("m").put(tag, len(k))
        entry = model.setdefault(k, {"m": {}})
        entry["v"] = [tag, k]
        entry["m"][tag] = len(k)


def view(b: TaskStateBackend) -> dict[str, Any]:
    got: dict[str, Any] = {}
    for key, states in b.items():
        if states.get("v") is not None or states.get("m"):
            got[str(key)] = {"v": states.get("v"), "m": dict(states.get("m") or {})}
    return got


def expected(model: dict[str, Any]) -> dict[str, Any]:
    return {k: {"v": list(e["v"]), "m": dict(e["m"])} for k, e in model.items() if e.get("v")}


def spark_cycle(storage: Storage, local: Path, rounds: int, seed: int = 1,
                parallelism: int = 1) -> tuple[list[list[RestoreSource]], list[dict[str, Any]]]:
    """Checkpoints 0..rounds-1 the Spark way (open, write, snapshot, close), changelog
    commits on; the sources and the expected view after each."""
    rng = random.Random(seed)
    keys = [f"user-{i}" for i in range(2000)]
    model: dict[str, Any] = {}
    history: list[list[RestoreSource]] = []
    views: list[dict[str, Any]] = []
    sources: list[RestoreSource] | None = None
    for cid in range(rounds):
        states = []
        for task in range(parallelism):
            r = task_range(task, parallelism, MAXP)
            mine = [k for k in keys if task_of_key(k, parallelism, MAXP) == task]
            b = TaskStateBackend.open(local, OP, r, MAXP, sources, changelog=True)
            apply_batch(b, model, mine, rng, f"t{cid}", 1.0 if cid == 0 else 0.05)
            states.append(snap(b, storage, cid))
            close_as_a_task(b)
        sources = checkpoint(storage, cid, states)
        history.append(sources)
        views.append(expected(model))
    return history, views


def test_changelog_commits_restore_exactly(storage: Storage, tmp_path: Path) -> None:
    history, views = spark_cycle(storage, tmp_path / "local", 8)
    states = [s[0][2] for s in history]
    assert changelogs(states[0]) == []  # the first checkpoint has no base: a full snapshot
    assert states[0].info["format"] == 1
    for cid, kgs in enumerate(states[1:], start=1):
        # each checkpoint names the base's files and every changelog since, in order
        assert len(changelogs(kgs)) == cid and kgs.info["format"] == 2
        assert changelogs(kgs)[:-1] == changelogs(states[cid - 1])
        assert kgs.info["files_uploaded"] == 1  # only its own changelog
        assert all(f.scope == "shared" for f in kgs.files)
        meta_key = layout.checkpoint_metadata_key(cid)
        for key, f in referenced_keys(read_metadata(storage, meta_key), meta_key).items():
            assert storage.stat(key) is not None and storage.stat(key).size == f.size  # type: ignore[union-attr]
    for cid, sources in enumerate(history):
        # a fresh machine: every file downloaded, the changelogs replayed onto the base
        with TaskStateBackend.open(tmp_path / f"fresh-{cid}", OP, task_range(0, 1, MAXP),
                                   MAXP, sources) as b:
            assert b.restore_stats.files_downloaded == len(sources[0][2].files)
            assert view(b) == views[cid]
    # the Spark way: the local snapshot flushed after the task, nothing downloaded
    with TaskStateBackend.open(tmp_path / "local", OP, task_range(0, 1, MAXP), MAXP,
                               history[-1]) as b:
        assert b.restore_stats.files_downloaded == 0
        assert view(b) == views[-1]


def test_a_restored_changelog_state_commits_by_changelog_again(
    storage: Storage, tmp_path: Path
) -> None:
    """A task restored on a fresh machine extends the same chain; a rewrite of the base's
    runs, or too many changelogs, starts a new base with a full snapshot."""
    history, views = spark_cycle(storage, tmp_path / "local", 3)
    r = task_range(0, 1, MAXP)
    b = TaskStateBackend.open(tmp_path / "other", OP, r, MAXP, history[-1], changelog=True)
    b.value_state("v", "new").update(["x"])
    third = snap(b, storage, 3)
    b.close()
    assert changelogs(third)[:-1] == changelogs(history[-1][0][2]) and len(changelogs(third)) == 3
    sources = checkpoint(storage, 3, [third])
    with TaskStateBackend.open(tmp_path / "other", OP, r, MAXP, sources, changelog=True) as b:
        assert view(b) == views[-1] | {"new": {"v": ["x"], "m": {}}}
        b._require_db().compact_range(None, None)  # the base's SSTs rewritten
        b.value_state("v", "new").update(["y"])
        fourth = snap(b, storage, 4)
    assert changelogs(fourth) == [] and fourth.info["format"] == 1
    # the option turned off: the same chain restores, and the next checkpoint is full
    with TaskStateBackend.open(tmp_path / "off", OP, r, MAXP, sources) as b:
        b.value_state("v", "new").update(["z"])
        off = snap(b, storage, 5)
    assert changelogs(off) == [] and off.info["format"] == 1
    with TaskStateBackend.open(tmp_path / "off-check", OP, r, MAXP,
                               checkpoint(storage, 5, [off])) as b:
        assert view(b) == views[-1] | {"new": {"v": ["z"], "m": {}}}


def test_changelog_limit_takes_a_full_snapshot(
    storage: Storage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import statehold.backend.rocks as rocks

    monkeypatch.setattr(rocks, "MAX_CHANGELOGS", 2)
    history, views = spark_cycle(storage, tmp_path / "local", 5)
    counts = [len(changelogs(s[0][2])) for s in history]
    assert counts == [0, 1, 2, 0, 1]
    with TaskStateBackend.open(tmp_path / "fresh", OP, task_range(0, 1, MAXP), MAXP,
                               history[-1]) as b:
        assert view(b) == views[-1]


@pytest.mark.parametrize("new_parallelism", [1, 3])
def test_rescale_replays_each_sources_changelogs(
    storage: Storage, tmp_path: Path, new_parallelism: int
) -> None:
    history, views = spark_cycle(storage, tmp_path / "local", 4, parallelism=2)
    assert all(len(changelogs(s[2])) == 3 for s in history[-1])
    got: dict[str, Any] = {}
    for task in range(new_parallelism):
        r = task_range(task, new_parallelism, MAXP)
        with TaskStateBackend.open(tmp_path / f"n{task}", OP, r, MAXP, history[-1],
                                   changelog=True) as b:
            assert b.restore_stats.rescaled
            part = view(b)
            assert all(task_of_key(k, new_parallelism, MAXP) == task for k in part)
            got |= part
            # a rescaled state extends no checkpoint's chain: a full snapshot
            assert changelogs(snap(b, storage, 9)) == []
    assert got == views[-1]


def _replace_changelog(
    storage: Storage, sources: list[RestoreSource], content: bytes
) -> list[RestoreSource]:
    """The newest changelog of `sources` replaced by `content`, its size and checksum in
    the task state updated to match (as a crafted job directory would be)."""
    s, meta_key, kgs = sources[0]
    f = next(f for f in reversed(kgs.files) if is_changelog(f.name))
    key = layout.resolve(meta_key, f.path)
    storage.write(key, content)
    checksum = bytes_checksum(content)
    files = [g.model_copy(update={"size": len(content), "checksum": checksum}) if g is f else g
             for g in kgs.files]
    return [(s, meta_key, kgs.model_copy(update={"files": files}))]


def test_a_changelog_of_another_schema_is_refused(storage: Storage, tmp_path: Path) -> None:
    history, _ = spark_cycle(storage, tmp_path / "local", 2)
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, pa.schema([("x", pa.int64())])) as w:
        w.write_batch(pa.record_batch([pa.array([1])], names=["x"]))
    crafted = _replace_changelog(storage, history[-1], sink.getvalue().to_pybytes())
    with pytest.raises(StateBackendError, match="not a changelog"):
        TaskStateBackend.open(tmp_path / "fresh", OP, task_range(0, 1, MAXP), MAXP, crafted)
    crafted = _replace_changelog(storage, history[-1], b"not arrow at all")
    with pytest.raises(StateBackendError, match="unreadable changelog"):
        TaskStateBackend.open(tmp_path / "fresh2", OP, task_range(0, 1, MAXP), MAXP, crafted)
    assert not list((tmp_path / "fresh").glob("*/*/work-*"))  # a failed open leaves nothing


def test_changelogs_out_of_order_or_in_an_old_format_are_refused(
    storage: Storage, tmp_path: Path
) -> None:
    history, _ = spark_cycle(storage, tmp_path / "local", 3)
    s, meta_key, kgs = history[-1][0]
    logs = [f for f in kgs.files if is_changelog(f.name)]
    rest = [f for f in kgs.files if not is_changelog(f.name)]
    swapped = kgs.model_copy(update={"files": rest + logs[::-1]})
    with pytest.raises(StateBackendError, match="out of order"):
        TaskStateBackend.open(tmp_path / "a", OP, task_range(0, 1, MAXP), MAXP,
                              [(s, meta_key, swapped)])
    old = kgs.model_copy(update={"info": kgs.info | {"format": 1}})
    with pytest.raises(StateBackendError, match="changelogs in a state of format 1"):
        TaskStateBackend.open(tmp_path / "b", OP, task_range(0, 1, MAXP), MAXP,
                              [(s, meta_key, old)])


def test_changelog_memory_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch's writes are compressed a chunk at a time as they come, and the log moves
    from memory to the task's local disk past `_MEMORY_MAX`."""
    monkeypatch.setattr(changelog_module, "_CHUNK", 100)
    monkeypatch.setattr(changelog_module, "_MEMORY_MAX", 4000)
    log = changelog_module.ChangeLog(tmp_path)
    held = 0
    for i in range(1050):
        log.add(changelog_module.PUT, b"k%05d" % i, b"v%d" % (i * 7919))
        held = max(held, len(log._keys))
        assert log._spool.memory is None or len(log._spool.memory) <= 4000
    assert held < 100 and log.records == 1000
    finished = log.finish()
    assert finished is not None
    path, checksum = finished
    assert isinstance(path, Path)  # moved to disk: the file, not bytes
    assert checksum == file_checksum(path)
    table = ipc.open_file(pa.memory_map(str(path))).read_all()
    assert table.column("key").to_pylist() == [b"k%05d" % i for i in range(1050)]
    path.unlink()
    small = changelog_module.ChangeLog(tmp_path)
    small.add(changelog_module.DELETE, b"k", None)
    finished = small.finish()  # within _MEMORY_MAX: never written locally
    assert finished is not None
    data, checksum = finished
    assert isinstance(data, bytes) and not list(tmp_path.glob(".changes-*"))
    assert checksum == bytes_checksum(data)
    assert ipc.open_file(pa.py_buffer(data)).read_all().column("op").to_pylist() == [1]
    monkeypatch.setattr(changelog_module, "_CHUNK_BYTES", 10_000)
    big = changelog_module.ChangeLog(tmp_path)
    for i in range(30):  # large values: written out by bytes long before 100 records
        big.add(changelog_module.PUT, b"b%05d" % i, b"x" * 3000)
        assert big._held < 10_000
    assert big.records == 28
    big.discard()
    assert not list(tmp_path.glob(".changes-*"))


def test_subsumed_checkpoints_release_their_changelogs_and_nothing_named(
    storage: Storage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the coordinator (retain 1, no reconcile): a changelog stays while any
    retained checkpoint names it, and an old base and its chain go once none does, as
    listing the storage shows after every checkpoint."""
    import statehold.backend.rocks as rocks
    from statehold.checkpoint.coordinator import CheckpointCoordinator
    from statehold.ha.embedded import EmbeddedHAStore
    from tests.support.job_dir_contents import data_files, listing, referenced

    monkeypatch.setattr(rocks, "MAX_CHANGELOGS", 3)
    coord = CheckpointCoordinator.start(storage, EmbeddedHAStore(storage), job_id="job",
                                        max_parallelism=MAXP, retain=1,
                                        reconcile_in_background=False)
    rng = random.Random(5)
    keys = [f"user-{i}" for i in range(2000)]
    model: dict[str, Any] = {}
    r = task_range(0, 1, MAXP)
    chains = []
    try:
        for cid in range(9):
            coord.begin(cid)
            latest = coord.latest()
            sources = None if latest is None else rocks.sources_from_metadata(
                storage, latest[0], latest[1], OP)
            b = TaskStateBackend.open(tmp_path / "local", OP, r, MAXP, sources, changelog=True)
            apply_batch(b, model, keys, rng, f"t{cid}", 1.0 if cid == 0 else 0.05)
            state = b.snapshot(storage, coord.epoch, cid, layout.checkpoint_metadata_key(cid))
            close_as_a_task(b)
            coord.acknowledge(cid, OP, state)
            coord.complete(cid, {})
            coord.cleaner.wait_idle(30)
            chains.append(len(changelogs(state)))
            kept = referenced(storage, coord)
            assert kept <= listing(storage), "a referenced file is missing"
            assert data_files(storage) == kept, "orphans left"
        assert chains == [0, 1, 2, 3, 0, 1, 2, 3, 0]
        latest = coord.latest()
        assert latest is not None
        with TaskStateBackend.open(tmp_path / "fresh", OP, r, MAXP, rocks.sources_from_metadata(
                storage, latest[0], latest[1], OP)) as b:
            assert view(b) == expected(model)
    finally:
        coord.close()


def test_local_snapshots_after_changelog_commits_record_true_checksums(
    storage: Storage, tmp_path: Path
) -> None:
    """The thread that flushes after a changelog commit takes the checksums of the SSTs
    it knows instead of hashing the whole state: every marker still tells the truth."""
    from statehold.backend.local_snapshots import read_marker

    spark_cycle(storage, tmp_path / "local", 6)
    snaps = [p for p in (tmp_path / "local").glob("*/*/snap-*") if read_marker(p)]
    assert snaps
    for snap_dir in snaps:
        files = read_marker(snap_dir)
        assert files is not None
        for name, (size, checksum) in files.items():
            assert (snap_dir / name).stat().st_size == size
            assert file_checksum(snap_dir / name) == checksum, name
