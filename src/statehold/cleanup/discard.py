"""`Discard`: what may be deleted, as the registry and the policy decide and every cleaner
takes it. The bottom of the cleanup package: plain data, importing nothing of it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Discard:
    """Files and whole directories (e.g. ``chk-7``) that may be deleted."""

    keys: tuple[str, ...] = ()
    dirs: tuple[str, ...] = ()
    reason: str = ""

    def __bool__(self) -> bool:
        return bool(self.keys or self.dirs)


__all__ = ["Discard"]
