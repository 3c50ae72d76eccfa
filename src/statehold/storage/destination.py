"""Where a copy may go: the one check every copying tool (a job directory's export, a Spark
checkpoint's savepoint) makes before writing a file."""

from __future__ import annotations

from statehold.storage.base import Storage, StorageError


def destination_problem(source_uri: str, out: Storage) -> str | None:
    """Why `out` cannot take a copy of the tree at `source_uri`, or None: a copy must not
    land inside its source or around it (it would copy itself, or be deleted with it), and
    must start from an empty place (nothing of another tree mixed into it)."""
    src, dst = source_uri.rstrip("/") + "/", out.uri.rstrip("/") + "/"
    if dst.startswith(src) or src.startswith(dst):
        return f"the destination overlaps {source_uri}"
    try:
        held = next(iter(out.list_pages("", page_size=1)), [])
    except StorageError as e:
        return f"cannot list ({e})"
    return "the destination is not empty" if held else None
