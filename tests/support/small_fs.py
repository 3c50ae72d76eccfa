"""A small real file system for disk-full tests: a tmpfs of a few MiB mounted on a
directory (needs root, as in CI), filled with a ballast file until the kernel answers
ENOSPC, and emptied again to give the space back. Where the machine does not allow the
mount, the test is skipped with the reason (no fake ENOSPC is planted in statehold)."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


class SmallFileSystem:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.ballast = path / "ballast"

    def fill(self) -> int:
        """Write the ballast until the file system is full; return its size."""
        chunk = b"\0" * (64 * 1024)
        written = 0
        with open(self.ballast, "ab", buffering=0) as f:
            while True:
                try:
                    written += f.write(chunk)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    break
            # The last few blocks: a small write still finds room after a large one fails.
            for size in (4096, 512, 1):
                while True:
                    try:
                        written += f.write(b"\0" * size)
                    except OSError as e:
                        if e.errno != errno.ENOSPC:
                            raise
                        break
        return written

    def free(self) -> None:
        """Give the space back (the ballast goes)."""
        self.ballast.unlink(missing_ok=True)


@contextmanager
def small_fs(path: Path, size: str = "8m") -> Iterator[SmallFileSystem]:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True, text=True, check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"this machine does not allow a tmpfs mount: {done.stderr.strip()}")
    try:
        yield SmallFileSystem(path)
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
