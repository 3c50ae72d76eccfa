"""Real queries' checkpoint locations on a local disk (`tests.support.spark_locations.queries`
writes them): copies that share the bytes, listings with sizes and mtimes, files planted
old, and the batches a restart can start from, for the tests that savepoint, roll back and
collect them and must compare what was there before with what is there after."""

from __future__ import annotations

import os
import shutil
import time
import uuid
from pathlib import Path

from statehold.spark_checkpoints import open_spark_checkpoint
from statehold.spark_checkpoints.layout import Kind, StoreId

TWO_HOURS = 7200.0


def copy_tree(src: Path, dst: Path, *, link: bool = True) -> Path:
    """A copy of a checkpoint location with `src`'s mtimes. Its files are hard links to
    `src`'s unless `link` is false: Spark and statehold replace a file (a new one renamed
    over it) rather than write into it, so only a test that damages a file in place needs
    bytes of its own."""
    shutil.copytree(src, dst, symlinks=True, copy_function=os.link if link else shutil.copy2)
    return dst


def listing(root: Path) -> dict[str, tuple[int, float]]:
    """Every file and symbolic link below `root`: relative path -> (size, mtime)."""
    found = {}
    for dirpath, dirs, files in os.walk(root):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(dirpath, d))]:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            found[os.path.relpath(path, root)] = (st.st_size, st.st_mtime)
    return found


def backdate(root: Path, seconds: float) -> None:
    """Every file below `root` made `seconds` older (links left as they are)."""
    for rel in listing(root):
        path = root / rel
        if not path.is_symlink():
            st = path.stat()
            os.utime(path, (st.st_atime - seconds, st.st_mtime - seconds))


def plant(path: Path, data: bytes = b"x" * 100, age: float = TWO_HOURS) -> Path:
    """A file `age` seconds old."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    t = time.time() - age
    os.utime(path, (t, t))
    return path


def needs_of_restartable(ckpt: Path) -> dict[int, set[str]]:
    """The files a restart after each committed batch reads, for the batches a restart
    can start after."""
    checkpoint = open_spark_checkpoint(str(ckpt))
    found = checkpoint.scan()
    out = {}
    for batch in sorted(found.commits):
        needs = checkpoint.restart_needs(found, batch)
        if needs.ok:
            out[batch] = set(needs.files)
    return out


def restartable_batches(ckpt: Path) -> list[int]:
    """The batches `listing` says a restart can start after, oldest first."""
    return sorted(b.batch for b in open_spark_checkpoint(str(ckpt)).listing().batches
                  if b.restartable)


def newest_log(ckpt: Path, log: str) -> int:
    """The newest batch id in ``offsets/`` or ``commits/``."""
    return max(int(p.name) for p in (ckpt / log).iterdir() if p.name.isdigit())


def versions_held(ckpt: Path) -> dict[tuple[StoreId, int], int]:
    """The versions of the stores that retained batches (those with a commit) start from
    and that are held whole, with the version each starts from (its snapshot; 0: an empty
    store): what gc keeps, whether or not the batch's logs are still there."""
    location = open_spark_checkpoint(str(ckpt))
    found = location.scan()
    return {
        (needs.store, needs.version): needs.base
        for batch in found.commits
        for needs in location.restart_needs(found, batch).stores
        if needs.ok
    }


def plant_orphans(ckpt: Path, provider: str) -> tuple[set[str], set[str]]:
    """In every store, what gc must delete: a random SST name (RocksDB), a checksum whose
    subject is gone, and a stale zip, delta or HDFS snapshot (a copy of one Spark wrote)
    of a version below those the retained versions start from, where one is free and the
    file makes no retained version whole; all two hours old. Returns them all, and the
    stale ones."""
    found = open_spark_checkpoint(str(ckpt)).scan()
    held = versions_held(ckpt)
    doomed, stale_files = set(), set()
    for store, files in found.stores.items():
        directory = ckpt / store.prefix
        if provider == "hdfs":
            doomed.add(plant(directory / ".97.delta.crc"))
        else:
            sst = f"{uuid.uuid4().int % 10**6:06d}-{uuid.uuid4()}.sst"
            doomed.add(plant(directory / "SSTs" / sst))
            doomed.add(plant(directory / ".97.changelog.crc"))
        lowest = min(base or 1 for (s, _v), base in held.items() if s == store)
        unique_id = str(uuid.uuid4()) if provider == "rocksdb_v2" else None
        kinds = [Kind.DELTA, Kind.HDFS_SNAPSHOT] if provider == "hdfs" else [Kind.ZIP]
        candidates = [
            (kind, version, like)
            for kind in kinds
            for like in sorted(i.key for (k, _v, _u), i in files.versions.items() if k is kind)[:1]
            for version in range(1, lowest)
            if not files.has(kind, version, unique_id)
        ]
        for kind, version, like in candidates:
            stale = plant(ckpt / files.key(kind, version, unique_id), (ckpt / like).read_bytes())
            if versions_held(ckpt) == held:
                stale_files.add(stale)
                break
            stale.unlink()  # it would make a retained version whole: gc must keep it
    rel = {str(p.relative_to(ckpt)) for p in doomed | stale_files}
    return rel, {str(p.relative_to(ckpt)) for p in stale_files}


def gc_removes_only_orphans(ckpt: Path, provider: str) -> None:
    """Orphans planted in every store of `ckpt` (a location whose batch 0 Spark already
    purged), then gc with no grace: it deletes every planted file, nothing a restartable
    batch needs, and leaves the location verified and each batch restartable as before."""
    from statehold.spark_checkpoints.gc import gc

    assert not (ckpt / "commits" / "0").exists(), "batch 0 is still retained"
    needs = needs_of_restartable(ckpt)
    doomed, stale = plant_orphans(ckpt, provider)
    # A stale version file needs a free version below every retained one's snapshot; a
    # store whose retained versions all replay from an empty store (no snapshot made
    # yet: it depends on when Spark's maintenance ran) has none.
    room = all(base > 1 for base in versions_held(ckpt).values())
    assert stale or not room, f"no stale file planted: {sorted(versions_held(ckpt).items())}"
    assert needs_of_restartable(ckpt) == needs, "a planted file made a batch restartable"
    before = listing(ckpt)

    report = gc(open_spark_checkpoint(str(ckpt)), grace_seconds=0)

    gone = set(before) - set(listing(ckpt))
    assert report.ok, report.problems
    assert doomed <= gone, sorted(doomed - gone)
    needed = set().union(*needs.values())
    assert not needed & gone, sorted(needed & gone)[:5]
    assert needs_of_restartable(ckpt) == needs
    assert open_spark_checkpoint(str(ckpt)).verify().ok
