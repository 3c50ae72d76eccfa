"""Progress of long work, as every layer reports it and the CLI draws it (a rich progress
bar): in the foundation, so a copy in `spark_checkpoints` and a listing in `tools` report
the same way."""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    """Each `start` begins a phase of `total` units (None: not known, e.g. while
    listing); `unit` is ``"bytes"`` or a noun for what is counted (``"files"``,
    ``"keys"``)."""

    def start(self, description: str, total: int | None, unit: str = "bytes") -> None: ...

    def advance(self, amount: int) -> None: ...


class NoProgress:
    def start(self, description: str, total: int | None, unit: str = "bytes") -> None:
        pass

    def advance(self, amount: int) -> None:
        pass


__all__ = ["NoProgress", "Progress"]
