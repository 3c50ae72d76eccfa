"""Phase hooks (`PhaseHook`) that stop a driver or a task at one phase of one batch until a
test kills it, and the running-totals example run with them.

* `pause_when_asked`: ``STATEHOLD_TEST_PAUSE_AT=<phase>:<batch id>`` names the point; when
  it is reached the hook says so (stdout, and a line in the ``STATEHOLD_TEST_PAUSE_MARK``
  file the test waits for) and sleeps, in whichever process reaches it.
* `pause_once`: with ``STATEHOLD_TEST_PAUSE_ONCE=<batch id>`` the first task to update a key
  in that batch links its pid into the ``STATEHOLD_TEST_PAUSE_MARK`` file (a hard link, so
  exactly one task wins, on any executor, and the file is whole once it exists) and sleeps;
  every other task, and the retry of the paused one after its executor is killed, goes on.

Environment variables, because the ``in-task`` phase runs in Spark's Python workers, which
inherit the driver's environment (a standalone cluster's executors get them as
``spark.executorEnv`` settings). The hooks are pickled by reference, so the workers import
this module: the repository's root must be on their PYTHONPATH.

    PYTHONPATH=. python tests/support/pause_hooks.py [example arguments]

runs the example with `pause_as_asked` (both hooks, each a no-op unless its variable is set),
the repository's root put on the PYTHONPATH before Spark starts.
"""

from __future__ import annotations

import os
import sys
import time
import uuid

PAUSE_ENV = "STATEHOLD_TEST_PAUSE_AT"
PAUSE_ONCE_ENV = "STATEHOLD_TEST_PAUSE_ONCE"
PAUSE_MARK_ENV = "STATEHOLD_TEST_PAUSE_MARK"


def pause_when_asked(phase: str, batch_id: int, limit: float = 600.0) -> None:
    """A no-op unless ``STATEHOLD_TEST_PAUSE_AT`` names this phase and batch: then mark
    the pause and sleep, to be killed (fail after `limit` seconds, so nothing hangs)."""
    if os.environ.get(PAUSE_ENV) != f"{phase}:{batch_id}":
        return
    print(f"statehold: paused at {phase}:{batch_id} (pid {os.getpid()})", flush=True)
    mark = os.environ.get(PAUSE_MARK_ENV)
    if mark:
        with open(mark, "a") as f:
            f.write(f"{phase}:{batch_id} {os.getpid()}\n")
    _sleep(limit, f"{PAUSE_ENV}: nobody killed the process paused at {phase}:{batch_id}")


def pause_once(phase: str, batch_id: int, limit: float = 600.0) -> None:
    """A no-op unless ``STATEHOLD_TEST_PAUSE_ONCE`` names this batch and this is the first
    task of it here: then link the mark and sleep, to be killed with its executor."""
    if phase != "in-task" or os.environ.get(PAUSE_ONCE_ENV) != str(batch_id):
        return
    mark = os.environ[PAUSE_MARK_ENV]
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
    _sleep(limit, f"{PAUSE_ONCE_ENV}: nobody killed the task paused in batch {batch_id}")


def pause_as_asked(phase: str, batch_id: int) -> None:
    """Both hooks: what the example runs with."""
    pause_when_asked(phase, batch_id)
    pause_once(phase, batch_id)


def _sleep(limit: float, message: str) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        time.sleep(0.2)
    raise RuntimeError(message)


if __name__ == "__main__":
    from statehold.examples import running_totals
    from tests.support.paths import ROOT, python_path

    # The hook by this module's name, not __main__'s, so the workers import it.
    from tests.support.pause_hooks import pause_as_asked as hook

    os.environ["PYTHONPATH"] = python_path([ROOT])
    sys.exit(running_totals.main(sys.argv[1:], on_phase=hook))
