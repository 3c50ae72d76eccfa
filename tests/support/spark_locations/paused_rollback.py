"""statehold's rollback of a Spark checkpoint location in a process of its own, paused
before one of its deletes so a test can kill it there (kill -9).

    python -m tests.support.spark_locations.paused_rollback

reads one rollback a line on standard input, ``CKPT TO_BATCH KEEP STEP MARK``, and runs
each in a child process forked for it (statehold is imported once, so a test can kill a
rollback at each of dozens of steps in seconds). The child pauses before delete number
STEP (0: the first, after the savepoint and the mark are written), writes ``paused PID``
to MARK and sleeps until killed; with fewer deletes than STEP it finishes and writes
``done``. The parent prints ``ended STATUS`` (the child's wait status) as each ends.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable

from statehold.spark_checkpoints import open_spark_checkpoint
from statehold.spark_checkpoints.rollback import rollback


def _write(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def run_paused(location: str, to_batch: int, keep: str, step: int, mark: str) -> None:
    checkpoint = open_spark_checkpoint(location)
    deletes = checkpoint.storage.delete_many
    done = 0

    def delete_many(keys: Iterable[str]) -> None:
        nonlocal done
        if done == step:
            _write(mark, f"paused {os.getpid()}\n")
            time.sleep(600)
            raise RuntimeError("paused and nobody killed this process")
        done += 1
        deletes(keys)

    checkpoint.storage.delete_many = delete_many  # type: ignore[method-assign]
    rollback(checkpoint, to_batch, keep=keep, force=True)
    _write(mark, "done\n")


def main() -> int:
    for line in sys.stdin:
        location, to_batch, keep, step, mark = line.split()
        child = os.fork()
        if child == 0:
            try:
                run_paused(location, int(to_batch), keep, int(step), mark)
            finally:
                os._exit(0)
        _pid, status = os.waitpid(child, 0)
        print(f"ended {status}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
