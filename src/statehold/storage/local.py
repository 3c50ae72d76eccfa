"""Local filesystem backend: atomic rename for writes, hard links for create-if-absent and
for copies within one filesystem."""

from __future__ import annotations

import errno
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

from statehold.storage.base import (
    AlreadyExistsError,
    DeleteError,
    FileInfo,
    NotFoundError,
    Storage,
    StorageError,
    check_key,
    check_prefix,
)

#: Temporary files start with this; a crash can leave them behind, and since they live
#: inside the job directory the reconcile finds and deletes them like any orphan.
TEMP_MARKER = ".tmp-"


class LocalStorage(Storage):
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).absolute()
        self.uri = self.root.as_uri()

    def __repr__(self) -> str:
        return f"LocalStorage({str(self.root)!r})"

    def child(self, prefix: str) -> LocalStorage:
        return LocalStorage(self.root / check_key(prefix.rstrip("/")))

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def _temp_for(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.with_name(f".{path.name}{TEMP_MARKER}{uuid.uuid4().hex}")

    # -- reading -----------------------------------------------------------------------
    def list_pages(self, prefix: str = "", page_size: int = 1000) -> Iterator[list[FileInfo]]:
        prefix = check_prefix(prefix).rstrip("/")
        base = self.root / prefix if prefix else self.root
        page: list[FileInfo] = []
        for dirpath, _dirnames, filenames in os.walk(base):
            for name in filenames:
                full = os.path.join(dirpath, name)
                try:
                    st = os.stat(full)
                except FileNotFoundError:
                    continue  # deleted while listing
                key = os.path.relpath(full, self.root).replace(os.sep, "/")
                page.append(FileInfo(key, st.st_size, st.st_mtime))
                if len(page) >= page_size:
                    yield page
                    page = []
        if page:
            yield page

    def stat(self, key: str) -> FileInfo | None:
        try:
            st = self._path(key).stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not os.path.isfile(self._path(key)):
            return None
        return FileInfo(key, st.st_size, st.st_mtime)

    def read(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as e:
            raise NotFoundError(f"{self.uri}/{key}: no such file") from e

    def download(self, key: str, local_path: Path) -> None:
        src = self._path(key)
        if not src.is_file():
            raise NotFoundError(f"{self.uri}/{key}: no such file")
        local_path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, local_path)

    # -- writing -----------------------------------------------------------------------
    def _write_temp(self, path: Path, data: bytes | None, source: Path | None) -> Path:
        tmp = self._temp_for(path)
        try:
            if source is not None:
                shutil.copyfile(source, tmp)
            with open(tmp, "r+b" if source is not None else "wb") as f:
                if data is not None:
                    f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return tmp

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

    def delete_many(self, keys: Iterable[str]) -> None:
        paths = [(key, self._path(key)) for key in keys]  # check every key before deleting
        failed: dict[str, BaseException] = {}
        for key, path in paths:
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            except OSError as e:
                failed[key] = e
        if failed:
            raise DeleteError(failed)

    def delete_prefix(self, prefix: str) -> int:
        prefix = check_prefix(prefix).rstrip("/")
        base = self.root / prefix if prefix else self.root
        if not base.exists():
            return 0
        count = sum(len(files) for _, _, files in os.walk(base))
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

    def copy(self, src: str, dst: str, *, target: Storage | None = None) -> None:
        src_path = self._path(src)
        check_key(dst)
        if not src_path.is_file():
            raise NotFoundError(f"{self.uri}/{src}: no such file")
        target = target or self
        if isinstance(target, LocalStorage):
            dst_path = target._path(dst)
            dst_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = target._temp_for(dst_path)
            try:
                os.link(src_path, tmp)
            except OSError as e:
                if e.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                    raise
                shutil.copyfile(src_path, tmp)
            os.replace(tmp, dst_path)
        else:
            target.upload(src_path, dst)

    def move(self, src: str, dst: str, *, target: Storage | None = None) -> None:
        target = target or self
        src_path = self._path(src)
        check_key(dst)
        if not src_path.is_file():
            raise NotFoundError(f"{self.uri}/{src}: no such file")
        if isinstance(target, LocalStorage):
            dst_path = target._path(dst)
            dst_path.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.replace(src_path, dst_path)
                return
            except FileNotFoundError as e:
                raise NotFoundError(f"{self.uri}/{src}: no such file") from e
            except OSError as e:
                if e.errno != errno.EXDEV:
                    raise
        super().move(src, dst, target=target)
