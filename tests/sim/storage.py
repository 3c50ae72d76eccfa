"""The simulated object store: an in-memory dict behind the real `Storage` interface.

Every operation is a scheduler point (so the seed picks which actor's operation goes
first), takes a seeded latency of simulated time, and may fail: transiently (a seeded
rate per kind of operation), with an unknown outcome (a write or create that landed but
reported an error, like a timed-out PUT), or permanently (a rule on a path, until healed).
Listings are paged and each page is read when it is fetched (like S3's ListObjectsV2 with
a continuation token), so a listing can overlap other writes and deletes. Optional
list-after-write lag (`list_lag` seconds) hides keys created less than that long ago from
listings and keeps showing keys deleted less than that long ago (with their old size and
mtime), as eventually consistent object stores do; reads, stats and conditional writes
stay consistent. S3 has been strongly consistent since 2020, so it is off by default.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from statehold.storage.base import (
    AlreadyExistsError,
    ConflictError,
    DeleteError,
    FileInfo,
    NotFoundError,
    Storage,
    StorageError,
    check_key,
    check_prefix,
)

if TYPE_CHECKING:
    from sim.world import World


class InjectedFault(StorageError):
    """A failure made up by the simulation."""


@dataclass
class Obj:
    data: bytes
    mtime: float


class SimStorage(Storage):
    """Keys under `root` (``job-a/``) of the world's one in-memory store."""

    def __init__(self, world: World, root: str) -> None:
        self.world = world
        self.root = root.rstrip("/") + "/"
        self.uri = f"sim://{self.root}"

    # -- helpers -------------------------------------------------------------------------
    def _full(self, key: str) -> str:
        return self.root + check_key(key)

    def _op(self, kind: str, method: str, keys: list[str]) -> None:
        self.world.before_op(self, kind, method, keys)

    @property
    def objects(self) -> dict[str, Obj]:
        return self.world.objects

    def child(self, prefix: str) -> Storage:
        return SimStorage(self.world, self.root + check_key(prefix.rstrip("/")))

    # -- reading -------------------------------------------------------------------------
    def list_pages(self, prefix: str = "", page_size: int = 1000) -> Iterator[list[FileInfo]]:
        check_prefix(prefix)
        base = self.root + (prefix.rstrip("/") + "/" if prefix else "")
        size = min(page_size, self.world.page_size)
        after = ""
        while True:
            self._op("list", "list", [base])
            now = self.world.clock.t
            lag = self.world.list_lag
            if lag:
                shown = self.world.lagged_listing(base, after, now - lag)
            else:
                shown = {k: o for k, o in self.objects.items() if k.startswith(base) and k > after}
            keys = sorted(shown)[:size]
            page = [FileInfo(k[len(self.root):], len(shown[k].data), shown[k].mtime) for k in keys]
            self.world.after_op(self, "list", [base], page)
            if page:
                yield page
            if len(keys) < size:
                return
            after = keys[-1]

    def stat(self, key: str) -> FileInfo | None:
        full = self._full(key)
        self._op("read", "stat", [full])
        o = self.objects.get(full)
        return None if o is None else FileInfo(key, len(o.data), o.mtime)

    def read(self, key: str) -> bytes:
        full = self._full(key)
        self._op("read", "read", [full])
        o = self.objects.get(full)
        if o is None:
            raise NotFoundError(f"{self.uri}{key}: not found")
        return o.data

    def download(self, key: str, local_path: Path) -> None:
        local_path.write_bytes(self.read(key))

    # -- writing -------------------------------------------------------------------------
    def _put(self, full: str, data: bytes) -> None:
        obj = SimObj(data, self.world.clock.t)
        before = self.objects.get(full)
        if isinstance(before, SimObj):
            obj.created = before.created  # listed already: an overwrite stays listed
        self.objects[full] = obj

    def write(self, key: str, data: bytes) -> None:
        full = self._full(key)
        self._op("write", "write", [full])
        self._put(full, bytes(data))
        self.world.after_op(self, "write", [full], None)

    def upload(self, local_path: Path, key: str) -> None:
        self.write(key, local_path.read_bytes())

    def create_if_absent(self, key: str, data: bytes) -> None:
        full = self._full(key)
        self._op("write", "create", [full])
        if full in self.objects:
            raise AlreadyExistsError(f"{self.uri}{key}: exists")
        self._put(full, bytes(data))
        self.world.after_op(self, "create", [full], None)

    def replace_if_version(self, key: str, version: str, data: bytes) -> None:
        """See Storage: compare and put in one step (the version is the content's digest,
        as `read_versioned` gives it)."""
        full = self._full(key)
        self._op("write", "replace", [full])
        o = self.objects.get(full)
        if o is None or hashlib.sha256(o.data).hexdigest() != version:
            raise ConflictError(f"{self.uri}{key}: changed or gone since it was read")
        self._put(full, bytes(data))
        self.world.after_op(self, "create", [full], None)  # this actor's document now

    def delete_many(self, keys: Iterable[str]) -> None:
        fulls = sorted({self._full(k) for k in keys})
        if not fulls:
            return
        self._op("delete", "delete", fulls)
        failed: dict[str, BaseException] = {}
        for full in fulls:
            why = self.world.delete_fault(full)
            if why is not None:
                failed[full[len(self.root):]] = why
        gone = [f for f in fulls if f[len(self.root):] not in failed]
        existed = [f for f in gone if f in self.objects]
        self.world.about_to_delete(self, existed)
        for full in gone:
            self.world.forget(full)
        self.world.after_op(self, "delete", existed, None)
        if failed:
            raise DeleteError(failed)

    def delete_prefix(self, prefix: str) -> int:
        check_prefix(prefix)
        base = self.root + (prefix.rstrip("/") + "/" if prefix else "")
        self._op("delete", "delete_prefix", [base])
        existed = sorted(k for k in self.objects if k.startswith(base))
        self.world.about_to_delete(self, existed)
        for k in existed:
            self.world.forget(k)
        self.world.after_op(self, "delete", existed, None)
        return len(existed)

    def copy(self, src: str, dst: str, *, target: Storage | None = None) -> None:
        out = target if target is not None else self
        if not isinstance(out, SimStorage):
            raise StorageError("the simulation copies only between simulated storages")
        full_src, full_dst = self._full(src), out._full(dst)
        self._op("write", "copy", [full_src, full_dst])
        o = self.objects.get(full_src)
        if o is None:
            raise NotFoundError(f"{self.uri}{src}: not found")
        out._put(full_dst, o.data)
        self.world.after_op(self, "write", [full_dst], None)


@dataclass
class SimObj(Obj):
    created: float = 0.0

    def __init__(self, data: bytes, mtime: float) -> None:
        super().__init__(data, mtime)
        self.created = mtime
