"""S3-compatible object storage backend (through obstore).

A PUT is atomic on S3 (readers see the old or the new object, never a partial one), so
`write` and `upload` need no temporary objects; `create_if_absent` is a conditional PUT
(If-None-Match), which is what makes the embedded HA store's fencing work on S3. One
`S3Store` client is kept per bucket root and shared by `child()` storages, so copies
between roots of one bucket are server-side.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import obstore
import obstore.exceptions as obe
from obstore.store import S3Store

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

if TYPE_CHECKING:
    from obstore import ObjectMeta

#: S3's DeleteObjects takes at most this many keys per request.
DELETE_BATCH = 1000

#: Options that configure the HTTP client rather than S3 itself.
_CLIENT_KEYS = frozenset(
    {
        "allow_invalid_certificates",
        "connect_timeout",
        "default_content_type",
        "default_headers",
        "http1_only",
        "http2_only",
        "pool_idle_timeout",
        "pool_max_idle_per_host",
        "proxy_url",
        "proxy_ca_certificate",
        "proxy_excludes",
        "randomize_addresses",
        "read_timeout",
        "timeout",
        "user_agent",
    }
)


#: obstore raises the builtin FileNotFoundError/FileExistsError for these; catch both forms.
_NOT_FOUND = (obe.NotFoundError, FileNotFoundError)
_EXISTS = (obe.AlreadyExistsError, obe.PreconditionError, FileExistsError)


def _env_bool(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


def _mtime(value: datetime) -> float:
    return value.timestamp()


class S3Storage(Storage):
    """Objects under ``s3://<bucket>/<prefix>``; keys are '/'-paths below the prefix."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint: str | None = None,
        region: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        allow_http: bool | None = None,
        **client_options: Any,
    ) -> None:
        if not bucket or "/" in bucket:
            raise StorageError(f"bad S3 bucket name {bucket!r}")
        prefix = prefix.strip("/")
        check_key(prefix, allow_empty=True)
        env = os.environ
        endpoint = endpoint or env.get("AWS_ENDPOINT_URL") or env.get("AWS_ENDPOINT")
        region = region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
        access_key_id = access_key_id or env.get("AWS_ACCESS_KEY_ID")
        secret_access_key = secret_access_key or env.get("AWS_SECRET_ACCESS_KEY")
        if allow_http is None and "AWS_ALLOW_HTTP" in env:
            allow_http = _env_bool(env["AWS_ALLOW_HTTP"])

        config: dict[str, Any] = {}
        if endpoint:
            config["endpoint"] = endpoint
        if region:
            config["region"] = region
        if access_key_id:
            config["access_key_id"] = access_key_id
        if secret_access_key:
            config["secret_access_key"] = secret_access_key
        client: dict[str, Any] = {}
        if allow_http is not None:
            client["allow_http"] = allow_http
        for name, value in client_options.items():
            (client if name in _CLIENT_KEYS else config)[name] = value
        # obstore's 30 s default covers a whole streamed body: too short for big state files.
        client.setdefault("timeout", timedelta(minutes=15))
        try:
            store = S3Store(bucket, config=config or None, client_options=client or None)  # type: ignore[arg-type]
        except obe.BaseError as e:
            raise StorageError(f"cannot configure S3 store for bucket {bucket!r}: {e}") from e
        self._init(store, bucket, prefix, endpoint or "")

    def _init(self, store: S3Store, bucket: str, prefix: str, endpoint: str) -> None:
        self._store = store
        self.bucket = bucket
        self.prefix = prefix
        self.endpoint = endpoint
        self.uri = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"

    def __repr__(self) -> str:
        return f"S3Storage({self.uri!r})"

    def child(self, prefix: str) -> S3Storage:
        sub = check_key(prefix.rstrip("/"))
        new = object.__new__(S3Storage)
        new._init(self._store, self.bucket, self._full(sub), self.endpoint)
        return new

    # -- key mapping and error translation -----------------------------------------------
    def _full(self, key: str) -> str:
        """Bucket path of a (checked) key."""
        return f"{self.prefix}/{key}" if self.prefix else key

    def _path(self, key: str) -> str:
        return self._full(check_key(key))

    def _relative(self, path: str) -> str:
        return path[len(self.prefix) + 1 :] if self.prefix else path

    @contextlib.contextmanager
    def _errors(self, key: str) -> Iterator[None]:
        where = f"{self.uri}/{key}"
        try:
            yield
        except _NOT_FOUND as e:
            raise NotFoundError(f"{where}: no such file") from e
        except _EXISTS as e:
            raise AlreadyExistsError(f"{where} already exists") from e
        except obe.BaseError as e:
            raise StorageError(f"{where}: {e}") from e

    def _same_bucket(self, other: S3Storage) -> bool:
        return other._store is self._store or (
            other.bucket == self.bucket and other.endpoint == self.endpoint
        )

    # -- reading -----------------------------------------------------------------------
    def list_pages(self, prefix: str = "", page_size: int = 1000) -> Iterator[list[FileInfo]]:
        prefix = check_prefix(prefix).rstrip("/")
        full = self._full(prefix) if prefix else self.prefix
        # A trailing '/' so that 'chk-1' never lists 'chk-10/...'.
        stream = obstore.list(self._store, full + "/" if full else None, chunk_size=page_size)
        with self._errors(prefix):
            for chunk in stream:
                page = [self._info(meta) for meta in chunk]
                if page:
                    yield page

    def list_top(self, prefix: str = "") -> tuple[list[str], list[FileInfo]]:
        """See Storage: one delimited listing (``CommonPrefixes``)."""
        prefix = check_prefix(prefix).rstrip("/")
        full = self._full(prefix) if prefix else self.prefix
        with self._errors(prefix):
            found = obstore.list_with_delimiter(self._store, full or None)
        dirs = sorted(self._relative(p) for p in found["common_prefixes"])
        return dirs, [self._info(meta) for meta in found["objects"]]

    def _info(self, meta: ObjectMeta) -> FileInfo:
        return FileInfo(self._relative(meta["path"]), meta["size"], _mtime(meta["last_modified"]))

    def stat(self, key: str) -> FileInfo | None:
        path = self._path(key)
        try:
            with self._errors(key):
                meta = obstore.head(self._store, path)
        except NotFoundError:
            return None
        return FileInfo(key, meta["size"], _mtime(meta["last_modified"]))

    def read(self, key: str) -> bytes:
        path = self._path(key)
        with self._errors(key):
            return bytes(obstore.get(self._store, path).bytes())

    def download(self, key: str, local_path: Path) -> None:
        path = self._path(key)
        local_path = Path(local_path)
        local_path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=local_path.parent, prefix=f".{local_path.name}.tmp-")
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as f, self._errors(key):
                self._stream_into(path, f.write)
            os.replace(tmp, local_path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def _stream_into(self, path: str, sink: Any) -> None:
        result = obstore.get(self._store, path)
        for chunk in result.stream(min_chunk_size=4 << 20):
            sink(chunk)

    # -- writing -----------------------------------------------------------------------
    def write(self, key: str, data: bytes) -> None:
        path = self._path(key)
        with self._errors(key):
            obstore.put(self._store, path, data)

    def upload(self, local_path: Path, key: str) -> None:
        path = self._path(key)
        local_path = Path(local_path)
        if not local_path.is_file():
            raise NotFoundError(f"{local_path}: no such local file")
        with self._errors(key):
            # A Path is streamed; multipart above chunk_size, completed atomically.
            obstore.put(self._store, path, local_path)

    def create_if_absent(self, key: str, data: bytes) -> None:
        path = self._path(key)
        with self._errors(key):
            obstore.put(self._store, path, data, mode="create")

    def delete_many(self, keys: Iterable[str]) -> None:
        checked = list(dict.fromkeys(check_key(k) for k in keys))  # check all first
        failed: dict[str, BaseException] = {}
        for i in range(0, len(checked), DELETE_BATCH):
            self._delete_batch(checked[i : i + DELETE_BATCH], failed)
        if failed:
            raise DeleteError(failed)

    def _delete_batch(self, keys: list[str], failed: dict[str, BaseException]) -> None:
        try:
            obstore.delete(self._store, [self._full(k) for k in keys])
            return
        except (*_NOT_FOUND, obe.BaseError):
            pass  # S3 reports no missing keys, but other S3-compatible stores might
        # The bulk request failed as a whole or in part: retry one by one to learn which.
        for key in keys:
            try:
                obstore.delete(self._store, self._full(key))
            except _NOT_FOUND:
                pass
            except obe.BaseError as e:
                failed[key] = e

    def delete_prefix(self, prefix: str) -> int:
        prefix = check_prefix(prefix).rstrip("/")
        count = 0
        for page in self.list_pages(prefix, page_size=DELETE_BATCH):
            self.delete_many(info.key for info in page)
            count += len(page)
        return count

    def copy(self, src: str, dst: str, *, target: Storage | None = None) -> None:
        src_path = self._path(src)
        check_key(dst)
        target = target or self
        if isinstance(target, S3Storage) and self._same_bucket(target):
            dst_path = target._full(dst)
            with self._errors(src):
                if dst_path == src_path:  # S3 refuses a copy onto itself
                    obstore.head(self._store, src_path)
                else:
                    obstore.copy(self._store, src_path, dst_path)
            return
        from statehold.storage.local import LocalStorage

        if isinstance(target, LocalStorage):
            self.download(src, target._path(dst))  # temp file + rename inside the target
            return
        with tempfile.TemporaryDirectory(prefix="statehold-copy-") as tmp_dir:
            tmp = Path(tmp_dir) / "data"
            self.download(src, tmp)
            target.upload(tmp, dst)

    def move(self, src: str, dst: str, *, target: Storage | None = None) -> None:
        """Copy then delete (S3 has no rename); moving a file onto itself keeps it."""
        src_path = self._path(src)
        check_key(dst)
        target = target or self
        if (
            isinstance(target, S3Storage)
            and self._same_bucket(target)
            and target._full(dst) == src_path
        ):
            if not self.exists(src):
                raise NotFoundError(f"{self.uri}/{src}: no such file")
            return
        self.copy(src, dst, target=target)
        self.delete_many([src])
