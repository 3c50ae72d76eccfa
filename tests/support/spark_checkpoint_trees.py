"""Real queries' checkpoint locations on a local disk (`tests.support.spark_checkpoint_queries`
writes them): copies that share the bytes, listings with sizes and mtimes, files planted
old, and the batches a restart can start from, for the tests that savepoint, roll back and
collect them and must compare what was there before with what is there after."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from statehold.spark_checkpoints import open_spark_checkpoint

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
