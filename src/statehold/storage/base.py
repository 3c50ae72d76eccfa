"""The one storage interface statehold uses everywhere.

A `Storage` is rooted at one location (a local directory or an object-store prefix) and
addresses files by *keys*: relative, '/'-separated, normalised paths. Every key is checked
by `check_key`, so no operation can reach outside the root it was given — that is how
statehold guarantees it never reads or deletes outside the job directory.
"""

from __future__ import annotations

import abc
import hashlib
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from statehold.errors import StateholdError

#: Stored files up to this size are checksummed from memory, larger ones streamed.
_IN_MEMORY = 16 << 20


def file_checksum(path: Path, chunk: int = 1 << 20) -> str:
    """``sha256:<hex>`` of a local file, streamed: the checksum recorded of every stored
    file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return "sha256:" + h.hexdigest()


def bytes_checksum(data: bytes) -> str:
    """`file_checksum` of a file holding `data`."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


class StorageError(StateholdError):
    """A storage operation failed."""


class UnsafePathError(StorageError, ValueError):
    """A key is absolute, escapes its root with '..', goes through a symlink under a
    local root, or is otherwise malformed."""


class NotFoundError(StorageError, FileNotFoundError):
    """The file does not exist."""


class AlreadyExistsError(StorageError, FileExistsError):
    """create_if_absent found the file already there."""


class ConflictError(StorageError):
    """replace_if_version found the file changed, or gone, since that version was read."""


class DeleteError(StorageError):
    """Some deletes failed; `failed` maps each key to its error. The others succeeded."""

    def __init__(self, failed: dict[str, BaseException]) -> None:
        self.failed = failed
        sample = ", ".join(f"{k}: {v}" for k, v in list(failed.items())[:3])
        super().__init__(f"{len(failed)} delete(s) failed ({sample})")


@dataclass(frozen=True, slots=True)
class FileInfo:
    """One listed file: its key under the storage root, size in bytes, mtime (epoch secs).

    `symlink` marks a symbolic link found under a local root (to a file or a directory):
    it is listed, with the link's own size and mtime, so tools can report it, but no
    operation follows it. Object stores have no links, so it is always False there.
    """

    key: str
    size: int
    mtime: float
    symlink: bool = False


def check_key(key: str, *, allow_empty: bool = False) -> str:
    """Return `key` if it is a safe relative key, else raise UnsafePathError.

    Safe means: no leading '/', no backslash, no drive letter, no scheme, and no '.', '..'
    or empty segment. We reject rather than normalise so that a suspicious path in
    metadata is reported instead of being silently reinterpreted.
    """
    if key == "":
        if allow_empty:
            return key
        raise UnsafePathError("empty key")
    if key.startswith("/") or "\\" in key or "://" in key or (len(key) > 1 and key[1] == ":"):
        raise UnsafePathError(f"not a relative key: {key!r}")
    if "\x00" in key:
        raise UnsafePathError(f"NUL byte in key: {key!r}")
    parts = key.split("/")
    for i, part in enumerate(parts):
        if part in (".", ".."):
            raise UnsafePathError(f"'{part}' segment in key: {key!r}")
        if part == "" and not (allow_empty and i == len(parts) - 1):
            raise UnsafePathError(f"empty segment in key: {key!r}")
    return key


def check_names(names: list[str]) -> list[str]:
    """Return `names` if each is a plain file name (one safe segment, see `check_key`),
    else raise UnsafePathError. A million names are checked together: one scan of them
    joined finds no separator, NUL or colon, and a set finds no '', '.' or '..'; only a
    batch that fails that is checked name by name (for the error that names the key)."""
    joined = "\n".join(names)
    if any(c in joined for c in ("/", "\\", "\x00", ":")) or not {"", ".", ".."}.isdisjoint(
        names
    ):
        for name in names:
            if "/" in name:
                raise UnsafePathError(f"not a file name: {name!r}")
            check_key(name)
    return names


def check_prefix(prefix: str) -> str:
    """A listing/deletion prefix: '' (the whole root) or a safe key, optionally ending '/'."""
    if prefix == "":
        return prefix
    check_key(prefix.rstrip("/"))
    return prefix


@dataclass(slots=True)
class NamePage:
    """A page of a listing for a caller that judges names in bulk: `names` are plain
    files of one `directory` ('' = the root), not stat'ed (their size and mtime were not
    needed to list them); `infos` are listed files of any directory with their stat
    (links, and every file on a backend whose listing gives the stat for free)."""

    directory: str = ""
    names: list[str] = field(default_factory=list)
    infos: list[FileInfo] = field(default_factory=list)
    #: From `Storage.list_stat_pages`: the size and mtime of each of `names`, in order.
    sizes: list[int] = field(default_factory=list)
    mtimes: list[float] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.names) + len(self.infos)


#: Files of one directory level, and what `Storage.list_top` returns (directories, files).
Files = list[FileInfo]
Top = tuple[list[str], Files]


class Storage(abc.ABC):
    """Files under one root. Implementations: LocalStorage and the object stores
    (S3Storage, GCSStorage, AzureStorage)."""

    #: URI of the root, e.g. ``file:///data/ckpt/job-1`` or ``s3://bucket/ckpt/job-1``.
    uri: str
    #: Listings come in key order (object stores): a caller may stop past a key.
    lists_in_key_order = False

    @abc.abstractmethod
    def child(self, prefix: str) -> Storage:
        """A storage rooted at `prefix` under this root (same backend, same settings)."""

    # -- reading -----------------------------------------------------------------------
    @abc.abstractmethod
    def list_pages(self, prefix: str = "", page_size: int = 1000) -> Iterator[list[FileInfo]]:
        """All files under the directory `prefix` ('' = the root), recursively, in pages.
        Keys are relative to this storage's root. Order is not guaranteed. A missing
        directory lists as empty."""

    def list_name_pages(
        self, prefix: str = "", page_size: int = 1000, start: str | None = None
    ) -> Iterator[NamePage]:
        """`list_pages` for a caller that judges names in bulk (a gc over millions of
        files): a backend whose stat costs a call per file (a local disk) lists plain
        files as names; this default hands every file over with its stat. `start`: a
        backend that lists in key order (an object store) may begin at that key; the
        caller still filters, since others list everything."""
        for page in self.list_pages(prefix, page_size):
            yield NamePage(infos=page)

    def list_stat_pages(self, prefix: str = "", page_size: int = 1000) -> Iterator[NamePage]:
        """`list_name_pages` for a caller that needs every file's size but judges names
        in bulk (`du`): plain files of one directory as names with their `sizes` and
        `mtimes` (a local disk stats each directory entry once, with no path walk), or
        every file with its stat in `infos` (this default)."""
        for page in self.list_pages(prefix, page_size):
            yield NamePage(infos=page)

    def delete_names(self, directory: str, names: list[str], *, count_bytes: bool = True) -> int:
        """Delete the files `names` of `directory` ('' = the root) as `delete_many`
        does; the bytes they held where the backend learns them on the way (else 0;
        always 0 without `count_bytes`, for a caller that had them from the listing)."""
        base = check_prefix(directory).rstrip("/")
        self.delete_many([f"{base}/{n}" if base else n for n in names])
        return 0

    def stat_names(self, directory: str, names: list[str]) -> list[FileInfo | None]:
        """`stat` of the files `names` of `directory` ('' = the root), in order (None:
        absent), for a re-check just before a batch of deletes. This default stats a few
        keys one by one and lists a backend that lists in key order from the first of
        many (one listing call per page, not one call per file)."""
        base = check_prefix(directory).rstrip("/")
        keys = [f"{base}/{n}" if base else n for n in check_names(names)]
        if len(keys) <= 16 or not self.lists_in_key_order:
            return [self.stat(k) for k in keys]
        wanted, last = set(keys), max(keys)
        found: dict[str, FileInfo] = {}
        for page in self.list_name_pages(base, start=min(keys)):
            found.update((i.key, i) for i in page.infos if i.key in wanted)
            if page.infos and page.infos[-1].key >= last:
                break
        return [found.get(k) for k in keys]

    def list(self, prefix: str = "") -> Iterator[FileInfo]:
        for page in self.list_pages(prefix):
            yield from page

    def list_top(self, prefix: str = "") -> Top:
        """One level under the directory `prefix`: the keys of its subdirectories (no
        trailing '/') and its own files. How a listing is split by prefix (a Spark gc, a
        gc over a checkpoint root); backends override this full-listing default with a
        one-level one."""
        base = check_prefix(prefix).rstrip("/")
        start = len(base) + 1 if base else 0
        dirs: dict[str, None] = {}
        files: Files = []
        for info in self.list(base):
            head, sep, _ = info.key[start:].partition("/")
            if sep:
                dirs[info.key[:start] + head] = None
            else:
                files.append(info)
        return sorted(dirs), files

    @abc.abstractmethod
    def stat(self, key: str) -> FileInfo | None:
        """Size and mtime of one file, or None if it does not exist."""

    def exists(self, key: str) -> bool:
        return self.stat(key) is not None

    @abc.abstractmethod
    def read(self, key: str) -> bytes:
        """Whole content; NotFoundError if absent."""

    @abc.abstractmethod
    def download(self, key: str, local_path: Path) -> None:
        """Copy a file to the local filesystem (streaming; for large state files)."""

    def download_to_read(self, key: str, local_path: Path) -> None:
        """`key`'s content at `local_path` for the caller to read, never to write: a
        local disk links the file there where it can (no bytes copied), the others
        download it. The caller may remove `local_path`; writing to it would write to
        the stored file."""
        self.download(key, local_path)

    def hand_over(self, local_path: Path, key: str) -> None:
        """Atomically create or replace `key` with a local file the caller gives up: a
        local disk moves the file itself into place where it can (synced first; no
        bytes copied), the others upload it; `local_path` is gone afterwards."""
        self.upload(local_path, key)
        local_path.unlink()

    def checksum(self, key: str, size_hint: int | None = None) -> str:
        """`file_checksum` of a stored file; NotFoundError if absent. A file of at most
        16 MiB by `size_hint` is read into memory, any other downloaded into a temp file;
        local disk and the object stores override this to hash without a copy."""
        if size_hint is not None and size_hint <= _IN_MEMORY:
            return "sha256:" + hashlib.sha256(self.read(key)).hexdigest()
        with tempfile.TemporaryDirectory(prefix="statehold-checksum-") as tmp:
            local = Path(tmp) / "data"
            self.download(key, local)
            return file_checksum(local)

    # -- writing -----------------------------------------------------------------------
    @abc.abstractmethod
    def write(self, key: str, data: bytes) -> None:
        """Atomically create or replace: a reader sees the old or the new content, never
        a partial one."""

    @abc.abstractmethod
    def upload(self, local_path: Path, key: str) -> None:
        """Atomically create or replace `key` with a local file's content (streaming)."""

    @abc.abstractmethod
    def create_if_absent(self, key: str, data: bytes) -> None:
        """Atomically create `key`; AlreadyExistsError if it exists. The only primitive
        the embedded HA store needs for fencing."""

    def read_versioned(self, key: str) -> tuple[bytes, str]:
        """Content and an opaque token of this version of it, for `replace_if_version`.
        Default: a digest of the content (object stores use their ETag)."""
        data = self.read(key)
        return data, hashlib.sha256(data).hexdigest()

    def replace_if_version(self, key: str, version: str, data: bytes) -> None:
        """Atomically replace `key` with `data` only if it still holds the version
        `read_versioned` returned; ConflictError if it changed or is gone. What lets an
        attempt replace a leftover document without ever removing a newer attempt's
        (a check, then an unconditional delete, lost the race to a pause in between)."""
        raise StorageError(f"{self.uri}: this backend has no conditional replace")

    @abc.abstractmethod
    def delete_many(self, keys: Iterable[str]) -> None:
        """Delete files, in bulk where the backend allows. A missing file is success.
        Raises DeleteError naming the keys that could not be deleted."""

    @abc.abstractmethod
    def delete_prefix(self, prefix: str) -> int:
        """Delete everything under a directory-like prefix (directory removal where the
        storage has directories, list + bulk delete otherwise). Returns files deleted."""

    @abc.abstractmethod
    def copy(self, src: str, dst: str, *, target: Storage | None = None) -> None:
        """Copy `src` to `dst` in `target` (default: this storage). Server-side on object
        stores, hard link (or reflink) on a local filesystem where possible; falls back
        to streaming through this process only across backends."""

    def move(self, src: str, dst: str, *, target: Storage | None = None) -> None:
        """Move a file; native rename where the backend has it, else copy then delete."""
        self.copy(src, dst, target=target)
        self.delete_many([src])
