"""Local filesystem backend: atomic rename for writes, hard links for create-if-absent and
for copies within one filesystem.

Symlinks: the root may be reached through links (it is resolved once, at construction),
but nothing below it is ever followed. A key any of whose segments is a symlink is
refused with UnsafePathError, so a link planted in a job directory cannot make statehold
read, write, move or delete outside it. Listing reports links as entries (marked
`symlink`) without descending into them. The check is made just before each operation:
it stops links that are there, not an adversary swapping them in at the same moment.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import shutil
import stat
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from statehold.storage import local_listing
from statehold.storage.base import (
    AlreadyExistsError,
    ConflictError,
    DeleteError,
    FileInfo,
    NamePage,
    NotFoundError,
    Storage,
    StorageError,
    UnsafePathError,
    check_key,
    check_names,
    check_prefix,
    file_checksum,
)

#: Temporary files start with this; a crash can leave them behind, and since they live
#: inside the job directory the reconcile finds and deletes them like any orphan.
TEMP_MARKER = ".tmp-"
#: errno values of a write that found no room: the device, or the user's quota, is full.
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
#: Why a hard link cannot be made where a copy can: another file system, or one without
#: hard links (or not allowed to link this file).
_CANNOT_LINK = (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP)


def _link_or_copy(src: Path, dst: Path) -> None:
    """`dst` a hard link to `src`, or a copy where no link can be made."""
    try:
        os.link(src, dst)
    except OSError as e:
        if e.errno not in _CANNOT_LINK:
            raise
        shutil.copyfile(src, dst)


#: Attempts at creating a file in a directory that a concurrent `delete_many` may remove
#: (as empty) between our mkdir and the file's creation.
_DIR_ATTEMPTS = 5


class LocalStorage(Storage):
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).absolute()
        self.uri = self.root.as_uri()
        #: The root with its links resolved once: every path is built on this, and only
        #: the segments below it are checked for links.
        self._real = Path(os.path.realpath(self.root))

    def __repr__(self) -> str:
        return f"LocalStorage({str(self.root)!r})"

    def root_problem(self) -> str | None:
        """Why the root is no directory to open, in the words an error line uses
        (``is a file, not a directory``, ``no such directory``), or None if it is one."""
        if self.root.is_dir():
            return None
        if self.root.is_file():
            return "is a file, not a directory"
        if self.root.exists() or self.root.is_symlink():
            return "is not a directory"
        return "no such directory"

    def child(self, prefix: str) -> LocalStorage:
        key = prefix.rstrip("/")
        self._path(key)  # refuse a prefix through a link: the child's root would escape
        return LocalStorage(self.root / key)

    def _path(self, key: str, *, last_link_ok: bool = False) -> Path:
        """The path of `key` under the resolved root; UnsafePathError if a segment of it
        is a symlink. With `last_link_ok` the last segment may be one (to unlink the link
        itself, which never touches its target)."""
        parts = check_key(key).split("/")
        path = str(self._real)
        for i, part in enumerate(parts):
            path = os.path.join(path, part)
            try:
                mode = os.lstat(path).st_mode
            except (FileNotFoundError, NotADirectoryError):
                break  # nothing below exists, so nothing below is a link
            if stat.S_ISLNK(mode) and not (last_link_ok and i == len(parts) - 1):
                link = "/".join(parts[: i + 1])
                raise UnsafePathError(
                    f"key {key!r}: {link!r} under {self.uri} is a symlink; "
                    "statehold does not follow links below its root"
                )
        return self._real.joinpath(*parts)

    def _dir(self, prefix: str) -> Path:
        """The directory of a checked, '/'-stripped prefix ('' = the root)."""
        return self._path(prefix) if prefix else self._real

    def _temp_for(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.with_name(f".{path.name}{TEMP_MARKER}{uuid.uuid4().hex}")

    def _new_temp(self, path: Path, fill: Callable[[Path], None]) -> Path:
        """A temp file next to `path`, created by `fill`. Retried on FileNotFoundError:
        `delete_many` removes directories it leaves empty, possibly ours between the
        mkdir and the file's creation (a genuinely missing source fails every time)."""
        attempt = 0
        while True:
            attempt += 1
            tmp: Path | None = None
            try:
                tmp = self._temp_for(path)
                fill(tmp)
                return tmp
            except FileNotFoundError:
                if tmp is not None:
                    tmp.unlink(missing_ok=True)
                if attempt >= _DIR_ATTEMPTS:
                    raise
            except OSError as e:
                if tmp is not None:
                    tmp.unlink(missing_ok=True)
                if e.errno in _NO_SPACE:
                    # One line naming the file and the cause; the temp file is gone,
                    # so nothing half-written is left under the key.
                    raise StorageError(
                        f"{path}: cannot be written, the file system is full "
                        f"({os.strerror(e.errno)})"
                    ) from e
                raise
            except BaseException:
                if tmp is not None:
                    tmp.unlink(missing_ok=True)
                raise

    def _entries(self, base: Path) -> Iterator[str]:
        """Paths of the files and links under `base`, never descending into a link."""
        for dirpath, dirnames, filenames in os.walk(base):  # followlinks=False
            links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
            if links:
                dirnames[:] = [d for d in dirnames if d not in links]
            for name in (*filenames, *links):
                yield os.path.join(dirpath, name)

    # -- reading -----------------------------------------------------------------------
    def list_pages(self, prefix: str = "", page_size: int = 1000) -> Iterator[list[FileInfo]]:
        """See Storage. Symlinks under the prefix (to files or directories) are listed as
        entries with ``symlink=True`` and the link's own lstat size/mtime; what they
        point to is not. A prefix that is or goes through a link: UnsafePathError."""
        prefix = check_prefix(prefix).rstrip("/")
        return local_listing.file_pages(str(self._dir(prefix)), prefix, page_size)

    def list_name_pages(
        self, prefix: str = "", page_size: int = 1000, start: str | None = None
    ) -> Iterator[NamePage]:
        """See Storage: regular files as names, from `scandir`'s entry types alone (no
        `lstat`, like `find -type f`); links and other entries with their own lstat."""
        return self._name_pages(prefix, page_size, with_stat=False)

    def list_stat_pages(self, prefix: str = "", page_size: int = 1000) -> Iterator[NamePage]:
        """See Storage: regular files as names with the size and mtime of their
        directory entry's one `lstat` (as `du -sb`); links and others as in
        `list_name_pages`."""
        return self._name_pages(prefix, page_size, with_stat=True)

    def _name_pages(self, prefix: str, page_size: int, *, with_stat: bool) -> Iterator[NamePage]:
        prefix = check_prefix(prefix).rstrip("/")
        return local_listing.name_pages(str(self._dir(prefix)), prefix, page_size, with_stat)

    def delete_names(self, directory: str, names: list[str], *, count_bytes: bool = True) -> int:
        """See Storage: the directory is checked for links once and opened with
        `O_NOFOLLOW`; each name is lstat'ed (for the bytes, with `count_bytes`) and
        unlinked relative to it, as `find -delete` does.
        Raises UnsafePathError, deleting nothing, if a name is not a plain file name."""
        directory = check_prefix(directory).rstrip("/")
        check_names(names)
        where = self._dir(directory)
        try:
            fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return 0  # the directory is gone, so are its files
        except OSError as e:
            raise DeleteError({f"{directory}/{n}" if directory else n: e for n in names}) from e
        keyed = [(f"{directory}/{name}" if directory else name, name) for name in names]
        try:
            freed, failed = local_listing.unlink_names(fd, keyed, count_bytes=count_bytes)
        finally:
            os.close(fd)
        self._remove_empty_dirs([where])
        if failed:
            raise DeleteError(failed)
        return freed

    def stat_names(self, directory: str, names: list[str]) -> list[FileInfo | None]:
        """See Storage: the directory is checked for links once and opened with
        `O_NOFOLLOW`; each name is lstat'ed relative to it (no path walk per file). A
        link or other non-regular file is returned as absent, as `stat` does."""
        directory = check_prefix(directory).rstrip("/")
        check_names(names)
        try:
            fd = os.open(self._dir(directory), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except (FileNotFoundError, NotADirectoryError):
            return [None] * len(names)
        except OSError as e:
            raise StorageError(f"{directory}: cannot be opened ({e})") from e
        try:
            return local_listing.stat_names(fd, directory, names)
        finally:
            os.close(fd)

    def list_top(self, prefix: str = "") -> tuple[list[str], list[FileInfo]]:
        """See Storage: one `scandir`. A link is listed as a file (never descended)."""
        prefix = check_prefix(prefix).rstrip("/")
        return local_listing.top(str(self._dir(prefix)), prefix)

    def stat(self, key: str) -> FileInfo | None:
        """See Storage. A key through a symlink raises UnsafePathError rather than
        returning None: "missing" would mislead verify and restore, and a caller that
        probes before writing would only fail later, less clearly."""
        try:
            st = os.lstat(self._path(key))
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        return FileInfo(key, st.st_size, st.st_mtime)

    def read(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as e:
            raise NotFoundError(f"{self.uri}/{key}: no such file") from e

    def checksum(self, key: str, size_hint: int | None = None) -> str:
        """Hashed in place (no copy), refusing symlinks like every access."""
        return file_checksum(self._existing(key))

    def download(self, key: str, local_path: Path) -> None:
        src = self._existing(key)
        local_path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, local_path)

    def download_to_read(self, key: str, local_path: Path) -> None:
        """See Storage: a hard link where `local_path` is on the same file system."""
        src = self._existing(key)
        local_path.parent.mkdir(parents=True, exist_ok=True)
        _link_or_copy(src, local_path)

    # -- writing -----------------------------------------------------------------------
    def hand_over(self, local_path: Path, key: str) -> None:
        """See Storage: the file synced, then renamed into place where it is on the
        same file system (a rename is atomic, as `upload`'s of its temp copy)."""
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(local_path, "rb") as f:
            os.fsync(f.fileno())
        try:
            os.replace(local_path, path)
        except OSError as e:
            if e.errno != errno.EXDEV:
                raise
            self.upload(local_path, key)
            local_path.unlink()

    def _write_temp(self, path: Path, data: bytes | None, source: Path | None) -> Path:
        def fill(tmp: Path) -> None:
            if source is not None:
                shutil.copyfile(source, tmp)
            with open(tmp, "r+b" if source is not None else "wb") as f:
                if data is not None:
                    f.write(data)
                f.flush()
                os.fsync(f.fileno())

        return self._new_temp(path, fill)

    def write(self, key: str, data: bytes) -> None:
        path = self._path(key)
        tmp = self._write_temp(path, data, None)
        os.replace(tmp, path)

    def upload(self, local_path: Path, key: str) -> None:
        path = self._path(key)
        tmp = self._write_temp(path, None, Path(local_path))
        os.replace(tmp, path)

    def create_if_absent(self, key: str, data: bytes) -> None:
        path = self._path(key)
        tmp = self._write_temp(path, data, None)
        try:
            os.link(tmp, path)  # atomic, fails if the target exists
        except FileExistsError as e:
            raise AlreadyExistsError(f"{self.uri}/{key} already exists") from e
        finally:
            tmp.unlink(missing_ok=True)

    def replace_if_version(self, key: str, version: str, data: bytes) -> None:
        """See Storage. The version is the content's digest; the compare and the rename
        over it happen under an exclusive lock on the file's directory, which every
        conditional replace there takes (a process paused inside it holds the others
        back; a killed one releases it)."""
        path = self._path(key)
        tmp = self._write_temp(path, data, None)
        try:
            fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    current = path.read_bytes()
                except FileNotFoundError:
                    raise ConflictError(f"{self.uri}/{key}: gone since it was read") from None
                if hashlib.sha256(current).hexdigest() != version:
                    raise ConflictError(f"{self.uri}/{key}: changed since it was read")
                os.replace(tmp, path)
            finally:
                os.close(fd)  # releases the lock
        finally:
            tmp.unlink(missing_ok=True)

    def delete_many(self, keys: Iterable[str]) -> None:
        """See Storage. A key that *is* a symlink deletes the link itself (unlink never
        follows it; the link is inside the root, its target is untouched), so links that
        listing reports can be cleaned up. A key *under* a symlinked directory raises
        UnsafePathError before anything is deleted: unlinking it would delete outside the
        root. Directories left empty are then removed, up to but not including the root,
        so an aborted checkpoint leaves no empty ``chk-N/``."""
        # check every key before deleting: each distinct parent once (no segment of it a
        # link); names are then unlinked relative to the parent's descriptor (as `find
        # -delete` does: no path walk per file), and unlink never follows a link
        groups: dict[str, list[tuple[str, str]]] = {}
        for key in keys:
            parent, _, name = check_key(key).rpartition("/")
            groups.setdefault(parent, []).append((key, name))
        where = {parent: self._dir(parent) for parent in groups}
        failed: dict[str, BaseException] = {}
        for parent, names in groups.items():
            try:
                fd = os.open(where[parent], os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            except FileNotFoundError:
                continue  # the directory is gone, so are its files
            except OSError as e:
                failed.update((key, e) for key, _ in names)
                continue
            try:
                failed.update(local_listing.unlink_names(fd, names, count_bytes=False)[1])
            finally:
                os.close(fd)
        self._remove_empty_dirs(set(where.values()))
        if failed:
            raise DeleteError(failed)

    def _remove_empty_dirs(self, dirs: Iterable[Path]) -> None:
        """Best effort: rmdir each directory and then its parents until one is not empty
        (or cannot be removed) or the root is reached. rmdir never removes a non-empty
        directory, nor follows a link, so a concurrent writer loses nothing (it retries
        its mkdir)."""
        for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
            while d != self._real and d.is_relative_to(self._real):
                try:
                    os.rmdir(d)
                except FileNotFoundError:
                    pass  # already gone: its parent may be empty now
                except OSError:
                    break  # not empty (ENOTEMPTY/EEXIST) or not removable: stop here
                d = d.parent

    def delete_prefix(self, prefix: str) -> int:
        """See Storage. Links inside the prefix are removed themselves (rmtree unlinks
        them, never following), and count as deleted entries. A prefix that is or goes
        through a link raises UnsafePathError, deleting nothing: rmtree would empty the
        link's target through an intermediate link, and refuses a link as its top."""
        prefix = check_prefix(prefix).rstrip("/")
        base = self._dir(prefix)
        if not base.exists():
            return 0
        count = sum(1 for _ in self._entries(base))
        errors: list[str] = []

        def on_error(
            _func: object, path: str, exc_info: tuple[type, BaseException, object]
        ) -> None:
            if not isinstance(exc_info[1], FileNotFoundError):
                errors.append(f"{path}: {exc_info[1]}")

        shutil.rmtree(base, onerror=on_error)  # onerror: Python 3.11 has no onexc
        if errors:
            raise DeleteError({prefix: StorageError("; ".join(errors[:5]))})
        return count

    def _existing(self, key: str) -> Path:
        path = self._path(key)
        if not path.is_file():
            raise NotFoundError(f"{self.uri}/{key}: no such file")
        return path

    def copy(self, src: str, dst: str, *, target: Storage | None = None) -> None:
        target = target or self
        if not isinstance(target, LocalStorage):
            check_key(dst)
            target.upload(self._existing(src), dst)
            return
        dst_path = target._path(dst)
        src_path = self._existing(src)

        def link_or_copy(tmp: Path) -> None:
            _link_or_copy(src_path, tmp)
            if target is self:
                # A copy is a new file, as on object stores: a link would carry its
                # source's age, and a savepoint's copies in the making would look like an
                # abandoned one's leftovers to the policy. (The source, the same inode,
                # is dated too: the policy reads the age only of files in the making, never
                # of data files. Another job's files, a no-claim restore's source, are left
                # as they are.)
                os.utime(tmp)

        try:
            tmp = target._new_temp(dst_path, link_or_copy)
        except FileNotFoundError as e:
            if not os.path.lexists(src_path):
                raise NotFoundError(f"{self.uri}/{src}: no such file") from e
            raise
        os.replace(tmp, dst_path)

    def move(self, src: str, dst: str, *, target: Storage | None = None) -> None:
        target = target or self
        if not isinstance(target, LocalStorage):
            super().move(src, dst, target=target)  # copy checks both keys first
            return
        dst_path = target._path(dst)
        src_path = self._existing(src)
        attempt = 0
        while True:
            attempt += 1
            try:
                dst_path.parent.mkdir(parents=True, exist_ok=True)
                os.replace(src_path, dst_path)
                return
            except FileNotFoundError as e:
                if not os.path.lexists(src_path):
                    raise NotFoundError(f"{self.uri}/{src}: no such file") from e
                if attempt >= _DIR_ATTEMPTS:
                    raise  # else the destination directory was removed under us: retry
            except OSError as e:
                if e.errno != errno.EXDEV:
                    raise
                break
        super().move(src, dst, target=target)  # across filesystems: copy, then delete
