"""A `PhaseHook` that stops a process at one phase of one batch until a test kills it.

``STATEHOLD_TEST_PAUSE_AT=<phase>:<batch id>`` names the point; when it is reached the hook
says so (stdout, and a line in the ``STATEHOLD_TEST_PAUSE_MARK`` file the test waits for)
and sleeps. Environment variables, because the ``in-task`` phase runs in Spark's Python
workers, which inherit the driver's environment; the hook itself is pickled by reference,
so the workers must be able to import this module (see paused_example.py).
"""

from __future__ import annotations

import os
import time

PAUSE_ENV = "STATEHOLD_TEST_PAUSE_AT"
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
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        time.sleep(0.2)
    raise RuntimeError(f"{PAUSE_ENV}: nobody killed the process paused at {phase}:{batch_id}")
