"""Helpers for fault tests: run a call with a hang detector."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def bounded(call: Callable[[], T], limit: float, what: str) -> T:
    """Run `call` on a thread and return its result (or raise its error); fail the test
    if it has not finished after `limit` seconds. The limit is a hang detector set far
    above any retry schedule, not a timing assertion."""
    result: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(call())
        except BaseException as exc:  # handed back to the test's thread
            error.append(exc)

    thread = threading.Thread(target=run, name=f"bounded: {what}", daemon=True)
    thread.start()
    thread.join(limit)
    if thread.is_alive():
        raise AssertionError(f"hung: {what} did not finish within {limit:g} s")
    if error:
        raise error[0]
    return result[0]
