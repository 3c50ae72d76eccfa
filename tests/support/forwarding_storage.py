"""A Storage that forwards every call to another one: tests subclass it and override
only the calls they observe or hold up."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from statehold.storage import FileInfo, Storage


class ForwardingStorage(Storage):
    def __init__(self, inner: Storage) -> None:
        self.inner = inner
        self.uri = inner.uri

    def child(self, prefix: str) -> Storage:
        return self.inner.child(prefix)

    def list_pages(self, prefix: str = "", page_size: int = 1000) -> Iterator[list[FileInfo]]:
        return self.inner.list_pages(prefix, page_size)

    def stat(self, key: str) -> FileInfo | None:
        return self.inner.stat(key)

    def read(self, key: str) -> bytes:
        return self.inner.read(key)

    def download(self, key: str, local_path: Path) -> None:
        self.inner.download(key, local_path)

    def write(self, key: str, data: bytes) -> None:
        self.inner.write(key, data)

    def upload(self, local_path: Path, key: str) -> None:
        self.inner.upload(local_path, key)

    def create_if_absent(self, key: str, data: bytes) -> None:
        self.inner.create_if_absent(key, data)

    def read_versioned(self, key: str) -> tuple[bytes, str]:
        return self.inner.read_versioned(key)

    def replace_if_version(self, key: str, version: str, data: bytes) -> None:
        self.inner.replace_if_version(key, version, data)

    def delete_many(self, keys: Iterable[str]) -> None:
        self.inner.delete_many(keys)

    def delete_prefix(self, prefix: str) -> int:
        return self.inner.delete_prefix(prefix)

    def copy(self, src: str, dst: str, *, target: Storage | None = None) -> None:
        self.inner.copy(src, dst, target=target)
