"""The running-totals example, paused once inside a Spark task so a test can kill the
executor running it.

    PYTHONPATH=. python tests/support/pause_once.py [example arguments]

With ``STATEHOLD_TEST_PAUSE_ONCE=<batch id>`` the first task to update a key in that batch
links its pid into the ``STATEHOLD_TEST_PAUSE_MARK`` file (a hard link, so exactly one
task wins, on any executor, and the file is whole once it exists) and sleeps; every other
task, and the retry of the paused one after its executor is killed, goes on. The tasks run
in executors: the variables reach them as ``spark.executorEnv`` settings, and the
repository's root must be on their PYTHONPATH (the hook is pickled by reference).
"""

from __future__ import annotations

import os
import sys
import time
import uuid

PAUSE_ENV = "STATEHOLD_TEST_PAUSE_ONCE"
MARK_ENV = "STATEHOLD_TEST_PAUSE_MARK"


def pause_once(phase: str, batch_id: int, limit: float = 600.0) -> None:
    if phase != "in-task" or os.environ.get(PAUSE_ENV) != str(batch_id):
        return
    mark = os.environ[MARK_ENV]
    if os.path.exists(mark):
        return
    tmp = f"{mark}.{uuid.uuid4().hex}"
    with open(tmp, "w") as f:
        f.write(f"{os.getpid()}\n")
    try:
        os.link(tmp, mark)
    except FileExistsError:
        return
    finally:
        os.unlink(tmp)
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        time.sleep(0.2)
    raise RuntimeError(f"{PAUSE_ENV}: nobody killed the task paused in batch {batch_id}")


if __name__ == "__main__":
    from statehold.examples import running_totals

    sys.exit(running_totals.main(sys.argv[1:], on_phase=pause_once))
