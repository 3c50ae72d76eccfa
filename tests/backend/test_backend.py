"""The executor-side keyed state backend, on real local disk + real RocksDB, against local
and moto-S3 job directories."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from rocksdict import AccessType, Options, Rdict

from statehold.backend import (
    StateBackendError,
    TaskStateBackend,
    all_ranges,
    key_group_of,
    task_of,
    task_of_key,
    task_range,
)
from statehold.backend.keys import decode_key
from statehold.backend.local_snapshots import LOCAL_MARKER
from statehold.backend.rocks import RestoreSource
from statehold.format import layout
from statehold.format.metadata import KeyGroupRange, read_metadata, referenced_keys
from statehold.storage import Storage, open_storage
from tests.support.paths import SRC
from tests.support.task_backend import (
    MAXP,
    OP,
    CountingStorage,
    checkpoint,
    close_as_a_task,
    fill,
    snap,
)


def keys_of(task: int, parallelism: int, n: int) -> list[str]:
    return [f"key-{i}" for i in range(n) if task_of_key(f"key-{i}", parallelism, MAXP) == task]


# -- key groups --------------------------------------------------------------------------


@pytest.mark.parametrize("maxp", [1, 7, 64, 128])
def test_task_ranges_cover_all_key_groups_contiguously(maxp: int) -> None:
    for parallelism in {1, 2, 3, 5, maxp}:
        if parallelism > maxp:
            continue
        ranges = all_ranges(parallelism, maxp)
        assert ranges[0].start == 0 and ranges[-1].end == maxp - 1
        for a, b in zip(ranges, ranges[1:], strict=False):
            assert b.start == a.end + 1
        sizes = [r.end - r.start + 1 for r in ranges]
        assert max(sizes) - min(sizes) <= 1
        for kg in range(maxp):
            assert kg in task_range(task_of(kg, parallelism, maxp), parallelism, maxp)


def test_key_group_is_stable_across_processes() -> None:
    keys = [f"user-{i}" for i in range(50)] + ["", "ünïcode"]
    here = [key_group_of(k, MAXP) for k in keys]
    assert len(set(here)) > 10  # spreads keys
    assert key_group_of("abc", MAXP) == key_group_of(b"abc", MAXP)
    code = (
        "import json,sys; from statehold.backend import key_group_of;"
        "print(json.dumps([key_group_of(k, 64) for k in json.loads(sys.argv[1])]))"
    )
    for seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", code, json.dumps(keys)],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            check=True,
            text=True,
        )
        assert json.loads(out.stdout) == here


# -- state primitives --------------------------------------------------------------------


def test_state_primitives(tmp_path: Path) -> None:
    with TaskStateBackend.open(tmp_path, OP, task_range(0, 1, MAXP), MAXP) as b:
        v = b.value_state("v", "a")
        assert v.get() is None and v.get(7) == 7
        v.update({"n": [1, 2.5, None, True]})
        assert b.value_state("v", "a").get() == {"n": [1, 2.5, None, True]}
        assert b.value_state("v", "b").get() is None  # per key
        assert b.value_state("w", "a").get() is None  # per state name
        v.clear()
        assert v.get() is None

        lst = b.list_state("l", b"raw-key")
        assert lst.get() == []
        lst.append(1)
        lst.extend(["two", 3])
        assert lst.get() == [1, "two", 3]
        lst.update([9])
        assert b.list_state("l", b"raw-key").get() == [9]
        assert b.list_state("l", "raw-key").get() == []  # str and bytes keys differ
        lst.clear()
        assert lst.get() == []

        m = b.map_state("m", "a")
        assert m.is_empty()
        m.put("x", 1)
        m.put(2, [2])
        m.put_all({"y": None})
        assert m.get("x") == 1 and m.get(2) == [2] and m.get("2") is None
        assert m.contains("y") and "x" in m and not m.contains("z")
        assert dict(m.items()) == {"x": 1, 2: [2], "y": None}
        assert set(m.keys()) == {"x", 2, "y"} and sorted(map(str, m.values())) == [
            "1",
            "None",
            "[2]",
        ]
        m.remove("x")
        assert not m.contains("x")
        assert b.map_state("m", "b").is_empty()
        m.clear()
        assert m.is_empty() and list(m.items()) == []

        with pytest.raises(TypeError):
            b.value_state("v", "a").update({1, 2})  # not JSON
        with pytest.raises(TypeError):
            m.put((1, 2), 1)  # not a scalar map key
        with pytest.raises(ValueError):
            b.value_state("bad\x00name", "a")


def test_key_outside_range_is_refused(tmp_path: Path) -> None:
    r = task_range(0, 2, MAXP)
    foreign = keys_of(1, 2, 50)[0]
    with (
        TaskStateBackend.open(tmp_path, OP, r, MAXP) as b,
        pytest.raises(ValueError, match="key group"),
    ):
        b.for_key(foreign)


# -- snapshot and restore ----------------------------------------------------------------


def test_snapshot_restore_round_trip(storage: Storage, tmp_path: Path) -> None:
    r = task_range(0, 1, MAXP)
    b = TaskStateBackend.open(tmp_path / "a", OP, r, MAXP)
    expected = fill(b, [f"k{i}" for i in range(300)], "t")
    expected["k0"]["count"] = "changed"
    b.value_state("count", "k0").update("changed")
    kgs = snap(b, storage, 1)
    b.close()
    assert not list((tmp_path / "a").glob("*/*/work-*"))  # close removes the work copy
    sources = checkpoint(storage, 1, [kgs])
    # Every referenced file is inside the job dir, relative to _metadata, and exists.
    refs = referenced_keys(read_metadata(storage, "chk-1/_metadata"), "chk-1/_metadata")
    assert len(refs) == len(kgs.files) > 1
    assert not [f.name for f in kgs.files if (f.name or "").endswith(".log")]  # empty WAL
    # RocksDB's small bookkeeping files travel inside _metadata, not as files of their own.
    assert {i.name.split("-")[0] for i in kgs.inline} == {"CURRENT", "MANIFEST"}
    assert all(f.scope == "shared" for f in kgs.files)
    for key, f in refs.items():
        assert key.split("/")[0] == ("shared" if f.scope == "shared" else "exclusive")
        assert storage.stat(key) is not None and storage.stat(key).size == f.size  # type: ignore[union-attr]

    counting = CountingStorage(storage)
    fresh = [(counting, m, s) for _, m, s in sources]
    with TaskStateBackend.open(tmp_path / "fresh", OP, r, MAXP, fresh) as b2:
        assert dict(b2.items()) == expected
        assert b2.value_state("count", "k0").get() == "changed"
        assert len(counting.downloads) == len(kgs.files)
        assert b2.restore_stats.files_downloaded == len(kgs.files)


def test_incremental_snapshot_uploads_only_new_files(storage: Storage, tmp_path: Path) -> None:
    r = task_range(0, 1, MAXP)
    rng = random.Random(7)
    counting = CountingStorage(storage)
    keys = [f"user-{i}" for i in range(5000)]
    b = TaskStateBackend.open(tmp_path, OP, r, MAXP)
    for k in keys:  # ~5 MB of hex strings, ~2.8 MB stored (ZSTD halves hex)
        b.value_state("blob", k).update(rng.randbytes(500).hex())
    first = snap(b, counting, 1)
    total = first.info["state_size"]
    assert total > 2_000_000 and first.info["bytes_uploaded"] == total
    b.commit_local(1)  # the driver completed checkpoint 1

    changed = rng.sample(keys, len(keys) // 20)
    for k in changed:
        b.value_state("blob", k).update("new-" + k)
    counting.uploads.clear()
    second = snap(b, counting, 2)
    assert second.info["bytes_uploaded"] < 0.5 * total
    assert second.info["files_reused"] >= 1
    # Unchanged SSTs are referenced (same job-directory key), not uploaded again.
    k1 = {f.name or "": layout.resolve("chk-1/_metadata", f.path) for f in first.files}
    k2 = {f.name or "": layout.resolve("chk-2/_metadata", f.path) for f in second.files}
    reused = [n for n in k2 if n.endswith(".sst") and k1.get(n) == k2[n]]
    # RocksDB's OPTIONS (same bytes every time) is shared and reused by checksum too.
    same = [n for n in k2 if not n.endswith(".sst") and k2[n] in k1.values()]
    assert any(n.startswith("OPTIONS-") for n in same)
    assert all(k2[n].startswith("shared/") for n in same)
    assert len(reused) + len(same) == second.info["files_reused"]
    assert not set(counting.uploads) & set(k1.values())
    assert len(counting.uploads) == second.info["files_uploaded"]
    b.close()

    # The Spark way: a new task restores checkpoint 2, changes a little, snapshots 3.
    sources = checkpoint(storage, 2, [second])
    with TaskStateBackend.open(tmp_path, OP, r, MAXP, sources) as b3:
        assert b3.restore_stats.files_downloaded == 0  # local snapshot 2 is reused
        assert b3.value_state("blob", changed[0]).get() == "new-" + changed[0]
        b3.value_state("blob", keys[0]).update("third")
        third = snap(b3, storage, 3)
    assert third.info["bytes_uploaded"] < 0.5 * third.info["state_size"]
    with TaskStateBackend.open(
        tmp_path / "other", OP, r, MAXP, checkpoint(storage, 3, [third])
    ) as b4:
        assert b4.value_state("blob", keys[0]).get() == "third"
        assert b4.value_state("blob", changed[1]).get() == "new-" + changed[1]
        assert len(dict(b4.items())) == len(keys)


def test_uploads_stay_near_changed_state_across_restores(storage: Storage, tmp_path: Path) -> None:
    """The Spark cycle (restore, change 5% of keys, snapshot, close) never re-uploads the
    whole state: no compaction at open rewrites everything (universal compaction)."""
    r = task_range(0, 1, MAXP)
    rng = random.Random(3)
    keys = [f"user-{i}" for i in range(8000)]
    sources: list[RestoreSource] | None = None
    uploaded, total = [], 0
    for cid in range(13):
        b = TaskStateBackend.open(tmp_path, OP, r, MAXP, sources)
        for k in keys if cid == 0 else rng.sample(keys, len(keys) // 20):
            b.value_state("v", k).update(rng.randbytes(100).hex())
        kgs = snap(b, storage, cid)
        close_as_a_task(b)
        sources = checkpoint(storage, cid, [kgs])
        if cid == 0:
            total = kgs.info["bytes_uploaded"]
        else:
            uploaded.append(kgs.info["bytes_uploaded"])
    assert total > 500_000  # 8000 x 200 hex chars, ZSTD-compressed
    assert max(uploaded) < 0.5 * total
    assert sorted(uploaded)[len(uploaded) // 2] < 0.08 * total  # median: ~the changed 5%
    with TaskStateBackend.open(tmp_path / "check", OP, r, MAXP, sources) as b:
        assert len(dict(b.items())) == len(keys)
        assert b.state_names() == {"v"}


def test_unconfirmed_snapshot_files_are_not_referenced(storage: Storage, tmp_path: Path) -> None:
    """Checkpoint 1 may still abort and be discarded: checkpoint 2 must not depend on it."""
    with TaskStateBackend.open(tmp_path, OP, task_range(0, 1, MAXP), MAXP) as b:
        fill(b, [f"k{i}" for i in range(100)])
        first = snap(b, storage, 1)
        b.value_state("count", "k1").update(0)
        second = snap(b, storage, 2)
    assert second.info["files_reused"] == 0
    assert not {f.path.split("/")[-1] for f in first.files} & {
        f.path.split("/")[-1] for f in second.files
    }


def test_restore_downloads_only_missing_files(storage: Storage, tmp_path: Path) -> None:
    r = task_range(0, 1, MAXP)
    b = TaskStateBackend.open(tmp_path, OP, r, MAXP)
    expected = fill(b, [f"k{i}" for i in range(2000)], "one")
    first = snap(b, storage, 1)
    b.commit_local(1)
    expected |= fill(b, [f"k{i}" for i in range(100)], "two")
    second = snap(b, storage, 2)
    b.close()
    src1, src2 = checkpoint(storage, 1, [first]), checkpoint(storage, 2, [second])

    # A local dir seeded with checkpoint 1's files only.
    seeded = tmp_path / "seeded"
    for snap_dir in tmp_path.glob("*/kg-*/snap-1-*"):
        dst = seeded / snap_dir.relative_to(tmp_path)
        dst.mkdir(parents=True)
        for p in snap_dir.iterdir():
            (dst / p.name).write_bytes(p.read_bytes())
    # Exactly this range at this checkpoint locally: nothing is downloaded.
    counting = CountingStorage(storage)
    with TaskStateBackend.open(seeded, OP, r, MAXP, [(counting, m, s) for _, m, s in src1]) as b3:
        assert b3.restore_stats.files_local == len(first.files)
        assert len(dict(b3.items())) == 2000
    assert counting.downloads == []

    # A newer checkpoint: only the files checkpoint 1 has not got are downloaded.
    with TaskStateBackend.open(seeded, OP, r, MAXP, [(counting, m, s) for _, m, s in src2]) as b2:
        assert dict(b2.items()) == expected
    have = {(f.name, f.checksum) for f in first.files}
    missing = [f for f in second.files if (f.name, f.checksum) not in have]
    assert 0 < len(missing) < len(second.files)
    assert sorted(counting.downloads) == sorted(
        layout.resolve("chk-2/_metadata", f.path) for f in missing
    )
    # Restoring checkpoint 2 pruned the older local snapshot.
    assert not list(seeded.glob("*/kg-*/snap-1-*"))


def test_damaged_local_snapshot_is_ignored(storage: Storage, tmp_path: Path) -> None:
    r = task_range(0, 1, MAXP)
    with TaskStateBackend.open(tmp_path, OP, r, MAXP) as b:
        expected = fill(b, [f"k{i}" for i in range(500)])
        sources = checkpoint(storage, 1, [snap(b, storage, 1)])
    (snap_dir,) = tmp_path.glob("*/kg-*/snap-1-*")
    sst = next(snap_dir.glob("*.sst"))
    data = sst.read_bytes()
    sst.unlink()  # replace, don't modify: other dirs may hard-link the same inode
    sst.write_bytes(data[: len(data) // 2])
    counting = CountingStorage(storage)
    with TaskStateBackend.open(
        tmp_path, OP, r, MAXP, [(counting, m, s) for _, m, s in sources]
    ) as b2:
        assert dict(b2.items()) == expected
    assert len(counting.downloads) == len(sources[0][2].files)

    (snap_dir / LOCAL_MARKER).write_text("{half a marker")  # a crash mid-write
    counting.downloads.clear()
    with TaskStateBackend.open(
        tmp_path, OP, r, MAXP, [(counting, m, s) for _, m, s in sources]
    ) as b3:
        assert dict(b3.items()) == expected
    assert len(counting.downloads) == len(sources[0][2].files)


@pytest.mark.parametrize(
    "bad", [{"name": "../CURRENT"}, {"name": "x/y"}, {"data": "not base64!"}]
)
def test_bad_inline_file_is_refused(
    storage: Storage, tmp_path: Path, bad: dict[str, str]
) -> None:
    r = task_range(0, 1, MAXP)
    with TaskStateBackend.open(tmp_path / "a", OP, r, MAXP) as b:
        fill(b, ["k1", "k2"])
        kgs = snap(b, storage, 1)
    broken = kgs.model_copy(
        update={"inline": [kgs.inline[0].model_copy(update=bad), *kgs.inline[1:]]}
    )
    before = sorted(p for p in tmp_path.rglob("*"))
    with pytest.raises(StateBackendError, match="inline"):
        TaskStateBackend.open(tmp_path / "b", OP, r, MAXP, [(storage, "chk-1/_metadata", broken)])
    # Nothing was written outside the new task's local directory, which holds no DB.
    new = [p for p in tmp_path.rglob("*") if p not in before]
    assert all(p == tmp_path / "b" or tmp_path / "b" in p.parents for p in new)
    assert not list(tmp_path.rglob("b/**/CURRENT")) and not (tmp_path / "CURRENT").exists()


def test_corrupt_stored_file_is_refused(storage: Storage, tmp_path: Path) -> None:
    r = task_range(0, 1, MAXP)
    with TaskStateBackend.open(tmp_path / "a", OP, r, MAXP) as b:
        fill(b, ["a", "b"])
        sources = checkpoint(storage, 1, [snap(b, storage, 1)])
    sst = next(f for f in sources[0][2].files if (f.name or "").endswith(".sst"))
    key = layout.resolve(sources[0][1], sst.path)
    storage.write(key, b"x" * sst.size)
    with pytest.raises(StateBackendError, match="checksum"):
        TaskStateBackend.open(tmp_path / "b", OP, r, MAXP, sources)
    assert not list((tmp_path / "b").glob("*/*/work-*"))  # failed open leaves no work dir


@pytest.mark.parametrize("new_parallelism", [3, 1])
def test_rescale(storage: Storage, tmp_path: Path, new_parallelism: int) -> None:
    expected: dict[str, dict[str, Any]] = {}
    states = []
    for task in range(2):
        with TaskStateBackend.open(tmp_path / f"w{task}", OP, task_range(task, 2, MAXP), MAXP) as b:
            expected |= fill(b, keys_of(task, 2, 400), f"t{task}")
            states.append(snap(b, storage, 1))
    sources = checkpoint(storage, 1, states)

    got: dict[str, dict[str, Any]] = {}
    rescaled = []
    for task in range(new_parallelism):
        r = task_range(task, new_parallelism, MAXP)
        with TaskStateBackend.open(tmp_path / f"n{task}", OP, r, MAXP, sources) as b:
            assert b.restore_stats.rescaled
            # No key of another task's range is left in this task's DB.
            raw = b._require_kv().range(b"", None)
            assert all(decode_key(k).key_group in r for k, _ in raw)
            part = dict(b.items())
            assert all(task_of_key(k, new_parallelism, MAXP) == task for k in part)
            assert not set(part) & set(got)
            got |= part  # type: ignore[arg-type]
            rescaled.append(snap(b, storage, 2))
    assert got == expected

    # The rescaled state snapshots and restores like any other (back to 2 tasks).
    again: dict[str, dict[str, Any]] = {}
    sources2 = checkpoint(storage, 2, rescaled)
    for task in range(2):
        with TaskStateBackend.open(
            tmp_path / f"z{task}", OP, task_range(task, 2, MAXP), MAXP, sources2
        ) as b:
            again |= dict(b.items())  # type: ignore[arg-type]
    assert again == expected


def test_restore_checks_sources(storage: Storage, tmp_path: Path) -> None:
    with TaskStateBackend.open(tmp_path, OP, task_range(0, 2, MAXP), MAXP) as b:
        fill(b, keys_of(0, 2, 20))
        half = checkpoint(storage, 1, [snap(b, storage, 1)])
    with pytest.raises(StateBackendError, match="no state for key groups"):
        TaskStateBackend.open(tmp_path, OP, task_range(0, 1, MAXP), MAXP, half)
    with pytest.raises(StateBackendError, match="max parallelism"):
        TaskStateBackend.open(tmp_path, OP, KeyGroupRange(start=0, end=31), 32, half)


def test_concurrent_opens_of_one_range(storage: Storage, tmp_path: Path) -> None:
    r = task_range(1, 2, MAXP)
    keys = keys_of(1, 2, 300)
    with TaskStateBackend.open(tmp_path, OP, r, MAXP) as b:
        expected = fill(b, keys)
        sources = checkpoint(storage, 1, [snap(b, storage, 1)])

    results: dict[int, Any] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(2, timeout=60)  # a failing thread must not hang the other

    def attempt(i: int) -> None:
        try:
            barrier.wait()
            with TaskStateBackend.open(tmp_path, OP, r, MAXP, sources) as t:
                barrier.wait()  # both are open at the same time
                assert dict(t.items()) == expected
                t.value_state("count", keys[0]).update(i)
                results[i] = snap(t, storage, 2)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    paths = [{f.path for f in results[i].files if f.scope == "exclusive"} for i in range(2)]
    assert not paths[0] & paths[1]  # each attempt wrote its own files
    for i in range(2):
        with TaskStateBackend.open(
            tmp_path / f"check{i}", OP, r, MAXP, checkpoint(storage, 2, [results[i]])
        ) as c:
            assert c.value_state("count", keys[0]).get() == i


def test_stored_state_is_json_never_pickle(storage: Storage, tmp_path: Path) -> None:
    r = task_range(0, 1, MAXP)
    with TaskStateBackend.open(tmp_path, OP, r, MAXP) as b:
        fill(b, [f"k{i}" for i in range(50)], "x")
        b.value_state("obj", "k1").update({"nested": [1, "a", None]})
        kgs = snap(b, storage, 1)
    # Download the checkpoint's DB files and read them with a plain raw-mode RocksDB.
    db_dir = tmp_path / "raw"
    db_dir.mkdir()
    for f in kgs.files:
        assert f.name is not None
        storage.download(layout.resolve("chk-1/_metadata", f.path), db_dir / f.name)
    for small in kgs.inline:
        (db_dir / small.name).write_bytes(small.content())
    db = Rdict(str(db_dir), Options(raw_mode=True), access_type=AccessType.read_only())
    n = 0
    try:
        for raw_key, raw_value in db.items():
            assert isinstance(raw_key, bytes) and isinstance(raw_value, bytes)
            d = decode_key(raw_key)
            assert d.key_group == key_group_of(d.key, MAXP)
            json.loads(raw_value.decode("utf-8"))  # every value is plain JSON
            assert not raw_value.startswith(b"\x80")  # no pickle protocol header
            n += 1
    finally:
        db.close()
    assert n == 50 * 5 + 1  # value, 2 list elements (an entry each), 2 map entries; obj
    src = SRC / "statehold" / "backend"
    uses_pickle = re.compile(r"\bimport\s+(c?pickle|dill|cloudpickle)\b|pickle\.(loads?|dumps?)")
    for py in src.glob("*.py"):
        assert not uses_pickle.search(py.read_text()), py


def _cycle(root: Path, size_amplification: int, batches: int = 60) -> tuple[int, int]:
    """(bytes uploaded over batches 1.., mean state size of their checkpoints) for the
    Spark cycle with 5% of the keys rewritten per batch."""
    storage = open_storage(str(root / "job"))
    r = task_range(0, 1, MAXP)
    rng = random.Random(5)
    keys = [f"user-{i}" for i in range(3000)]
    sources: list[RestoreSource] | None = None
    uploaded = size = 0
    for cid in range(batches + 1):
        b = TaskStateBackend.open(
            root / "local", OP, r, MAXP, sources, size_amplification=size_amplification
        )
        for k in keys if cid == 0 else rng.sample(keys, len(keys) // 20):
            b.value_state("v", k).update(rng.randbytes(100).hex())
        kgs = snap(b, storage, cid)
        close_as_a_task(b)
        sources = checkpoint(storage, cid, [kgs])
        if cid:
            uploaded += kgs.info["bytes_uploaded"]
            size += kgs.info["state_size"]
    return uploaded, size // batches


def test_size_amplification_trades_storage_for_upload(tmp_path: Path) -> None:
    """A low setting rewrites the big run sooner: less stored, more uploaded."""
    tight_up, tight_size = _cycle(tmp_path / "tight", 20)
    loose_up, loose_size = _cycle(tmp_path / "loose", 400)
    assert tight_size < 0.9 * loose_size
    assert tight_up > 1.1 * loose_up
    with pytest.raises(ValueError, match="size_amplification"):
        TaskStateBackend.open(tmp_path / "bad", OP, task_range(0, 1, MAXP), MAXP,
                              size_amplification=0)
