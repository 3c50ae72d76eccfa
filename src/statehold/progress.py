"""Progress of long work, as every layer reports it and the CLI draws it (a rich progress
bar): in the foundation, so a job directory's gc and a Spark checkpoint location's, a copy
in `spark_checkpoints` and a listing in `tools` all report the same way."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

#: Adds `n` to a counter (`Progress.counter`); safe from any thread.
Advance = Callable[[int], None]


@runtime_checkable
class Progress(Protocol):
    """Long work reports phases one after another (`start`, then `advance` on the current
    one) and counters running beside them (`counter`: work in other threads, as gc's
    deletes run beside its listing). Each has a description, a `total` (None: not known,
    e.g. while listing) and a `unit`: ``"bytes"`` or a noun for what is counted
    (``"files"``, ``"keys"``)."""

    def start(self, description: str, total: int | None, unit: str = "bytes") -> None:
        """A new phase; the previous one is over."""
        ...

    def advance(self, amount: int) -> None:
        """`amount` more done in the current phase."""
        ...

    def counter(self, description: str, total: int | None = None, unit: str = "files"
                ) -> Advance:
        """A count of its own beside the phases, until the work ends; what adds to it."""
        ...


def _ignore(amount: int) -> None:
    pass


class NoProgress:
    """Reports to no one: the default where no progress is given."""

    def start(self, description: str, total: int | None, unit: str = "bytes") -> None:
        pass

    def advance(self, amount: int) -> None:
        pass

    def counter(self, description: str, total: int | None = None, unit: str = "files"
                ) -> Advance:
        return _ignore


__all__ = ["Advance", "NoProgress", "Progress"]
