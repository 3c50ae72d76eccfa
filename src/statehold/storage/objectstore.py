"""What every object store backend shares (S3, Google Cloud Storage, Azure Blob), through
obstore.

A PUT is atomic on all three (readers see the old or the new object, never a partial one),
so `write` and `upload` need no temporary objects; `create_if_absent` is obstore's
``mode="create"`` (a conditional PUT, which each store spells its own way: see
docs/design.md), which is what makes the embedded HA store's fencing work there. One
obstore client is kept per bucket (container) root and shared by `child()` storages, so
copies between roots of one bucket are server-side. A backend subclass only configures
its client and says whether its store has a bulk delete.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Self

import obstore
import obstore.exceptions as obe

from statehold import clock
from statehold.storage.base import (
    AlreadyExistsError,
    ConflictError,
    DeleteError,
    FileInfo,
    NamePage,
    NotFoundError,
    Storage,
    StorageError,
    check_key,
    check_prefix,
)

if TYPE_CHECKING:
    from obstore import ObjectMeta

#: Options that configure the HTTP client rather than the store itself.
CLIENT_KEYS = frozenset(
    {
        "allow_http",
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
        "root_certificate",
        "timeout",
        "user_agent",
    }
)

#: How many single DELETEs run at once where a store has no bulk delete (or a bulk
#: request failed and each key is retried alone to learn which ones failed).
DELETE_CONCURRENCY = 16

#: Tries of a conditional write (create, replace) whose request broke in transit, as many as
#: obstore makes of an idempotent request (backoff from 100 ms, at most 2 s). The client
#: does not send a request that is not idempotent again once it may have reached the
#: server, so one reset connection would fail a checkpoint; statehold sends it again and
#: settles a refusal by reading the object back.
CONDITIONAL_TRIES = 10

#: obstore raises the builtin FileNotFoundError/FileExistsError for these; catch both forms.
_NOT_FOUND = (obe.NotFoundError, FileNotFoundError)
_EXISTS = (obe.AlreadyExistsError, obe.PreconditionError, FileExistsError)


def one_line(error: BaseException, limit: int = 600) -> str:
    """The client's message on one line: obstore's errors embed the server's response
    body (S3's XML error document, over several lines) after its own summary."""
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _in_transit(error: BaseException | None) -> bool:
    """The request failed on the wire rather than with the server's answer (obstore's
    "HTTP error": a connection reset or closed, a timeout), so it may have landed."""
    return isinstance(error, obe.BaseError) and "HTTP error" in str(error)


def _back_off(attempt: int) -> None:
    """Wait before try `attempt + 1` of a conditional write (100 ms doubling, at most 2 s)."""
    clock.sleep(min(2.0, 0.1 * 2**attempt))


def env_bool(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


def split_options(
    config: dict[str, Any], options: Mapping[str, Any], allow_http_env: str
) -> dict[str, Any]:
    """Sort extra keyword `options` into the store's `config` (in place) and the HTTP
    client's options (returned). `allow_http` falls back to the env variable named."""
    client: dict[str, Any] = {}
    for name, value in options.items():
        if value is not None:
            (client if name in CLIENT_KEYS else config)[name] = value
    if "allow_http" not in client and allow_http_env in os.environ:
        client["allow_http"] = env_bool(os.environ[allow_http_env])
    # obstore's 30 s default covers a whole streamed body: too short for big state files.
    client.setdefault("timeout", timedelta(minutes=15))
    return client


class ObjectStorage(Storage):
    """Objects under ``<scheme>://<bucket>/<prefix>``; keys are '/'-paths below the prefix."""

    #: URI scheme of `uri` ("s3", "gs", "az").
    scheme: ClassVar[str]
    #: Keys per delete request (S3's DeleteObjects takes 1000; obstore splits further
    #: where a store's batch is smaller).
    delete_batch: ClassVar[int] = 1000
    #: False where the store has no bulk delete that obstore uses: keys go one DELETE each.
    bulk_delete: ClassVar[bool] = True
    lists_in_key_order = True

    _store: Any  # an obstore store (S3Store, GCSStore, AzureStore)
    bucket: str
    prefix: str
    endpoint: str

    def _init(self, store: Any, bucket: str, prefix: str, endpoint: str) -> None:
        self._store = store
        self.bucket = bucket
        self.prefix = prefix
        self.endpoint = endpoint
        root = f"{self.scheme}://{bucket}"
        self.uri = f"{root}/{prefix}" if prefix else root

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"

    def child(self, prefix: str) -> Self:
        sub = check_key(prefix.rstrip("/"))
        new = object.__new__(type(self))
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
            raise StorageError(f"{where}: {one_line(e)}") from e

    def _same_bucket(self, other: Storage) -> bool:
        return isinstance(other, ObjectStorage) and (
            other._store is self._store
            or (
                type(other) is type(self)
                and other.bucket == self.bucket
                and other.endpoint == self.endpoint
            )
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

    def list_name_pages(
        self, prefix: str = "", page_size: int = 1000, start: str | None = None
    ) -> Iterator[NamePage]:
        """See Storage: every file with its stat (a listing gives them); from `start` on
        (listed after it, and a HEAD of `start` itself), in key order."""
        if start is None:
            yield from super().list_name_pages(prefix, page_size)
            return
        prefix = check_prefix(prefix).rstrip("/")
        full = self._full(prefix) if prefix else self.prefix
        first = self.stat(start) if start.startswith(prefix) else None
        if first is not None:
            yield NamePage(infos=[first])
        offset = self._full(check_key(start))
        stream = obstore.list(
            self._store, full + "/" if full else None, offset=offset, chunk_size=page_size,
        )
        with self._errors(prefix):
            for chunk in stream:
                # S3 starts after `offset` itself; obstore's Azure client (and
                # fake-gcs-server) list everything, so keep only what follows it.
                yield NamePage(infos=[self._info(m) for m in chunk if m["path"] > offset])

    def list_top(self, prefix: str = "") -> tuple[list[str], list[FileInfo]]:
        """See Storage: one delimited listing (common prefixes)."""
        prefix = check_prefix(prefix).rstrip("/")
        full = self._full(prefix) if prefix else self.prefix
        with self._errors(prefix):
            found = obstore.list_with_delimiter(self._store, full or None)
        dirs = sorted(self._relative(p) for p in found["common_prefixes"])
        return dirs, [self._info(meta) for meta in found["objects"]]

    def _info(self, meta: ObjectMeta) -> FileInfo:
        mtime = meta["last_modified"].timestamp()
        return FileInfo(self._relative(meta["path"]), meta["size"], mtime)

    def stat(self, key: str) -> FileInfo | None:
        path = self._path(key)
        try:
            with self._errors(key):
                meta = obstore.head(self._store, path)
        except NotFoundError:
            return None
        return FileInfo(key, meta["size"], meta["last_modified"].timestamp())

    def read(self, key: str) -> bytes:
        path = self._path(key)
        with self._errors(key):
            return bytes(obstore.get(self._store, path).bytes())

    def checksum(self, key: str, size_hint: int | None = None) -> str:
        """Hashed as it streams in (no temp file, whatever the size)."""
        path = self._path(key)
        h = hashlib.sha256()
        with self._errors(key):
            self._stream_into(path, h.update)
        return "sha256:" + h.hexdigest()

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
        """See Storage. A try that broke in transit (reset, closed, timed out) may have
        landed: it is sent again, and an object that then exists with exactly `data` is
        this create's own (or one with the same outcome); other bytes are another's."""
        path = self._path(key)
        for attempt in range(CONDITIONAL_TRIES):
            try:
                with self._errors(key):
                    obstore.put(self._store, path, data, mode="create")
                return
            except AlreadyExistsError:
                if attempt == 0:
                    raise
                try:
                    if self.read(key) == data:
                        return
                except NotFoundError:
                    continue  # gone again meanwhile: create it
                raise
            except StorageError as e:
                if attempt + 1 == CONDITIONAL_TRIES or not _in_transit(e.__cause__):
                    raise
                _back_off(attempt)
        raise StorageError(f"{self.uri}/{key}: not created in {CONDITIONAL_TRIES} tries (it came "
                           "and went meanwhile)")

    def read_versioned(self, key: str) -> tuple[bytes, str]:
        """See Storage: the content, and its ETag and version (GCS's generation) from the
        same GET, as one token."""
        path = self._path(key)
        with self._errors(key):
            result = obstore.get(self._store, path)
            data = bytes(result.bytes())
        e_tag, version = result.meta.get("e_tag"), result.meta.get("version")
        if not e_tag and not version:
            raise StorageError(f"{self.uri}/{key}: the store gave no ETag or version")
        return data, f"{e_tag or ''}\n{version or ''}"

    def replace_if_version(self, key: str, version: str, data: bytes) -> None:
        """See Storage: a conditional PUT on the version read (``If-Match`` on S3 and
        Azure, the generation on GCS). As for `create_if_absent`, a try that broke in
        transit is sent again; a refusal after such a try is this write's own success if
        the object now holds exactly `data`."""
        path = self._path(key)
        e_tag, _, object_version = version.partition("\n")
        mode: dict[str, str] = {}
        if e_tag:
            mode["e_tag"] = e_tag
        if object_version:
            mode["version"] = object_version
        for attempt in range(CONDITIONAL_TRIES):
            try:
                obstore.put(self._store, path, data, mode=mode)  # type: ignore[arg-type]
                return
            except (*_NOT_FOUND, obe.PreconditionError) as e:
                if attempt and self._holds(key, data):
                    return  # an earlier try landed; its answer was lost
                raise ConflictError(f"{self.uri}/{key}: changed or gone since it was read") from e
            except obe.BaseError as e:
                if attempt + 1 == CONDITIONAL_TRIES or not _in_transit(e):
                    raise StorageError(f"{self.uri}/{key}: {one_line(e)}") from e
                _back_off(attempt)

    def _holds(self, key: str, data: bytes) -> bool:
        try:
            return self.read(key) == data
        except NotFoundError:
            return False

    def delete_many(self, keys: Iterable[str]) -> None:
        checked = list(dict.fromkeys(check_key(k) for k in keys))  # check all first
        failed: dict[str, BaseException] = {}
        for i in range(0, len(checked), self.delete_batch):
            self._delete_batch(checked[i : i + self.delete_batch], failed)
        if failed:
            raise DeleteError(failed)

    def _delete_batch(self, keys: list[str], failed: dict[str, BaseException]) -> None:
        if self.bulk_delete:
            for _ in range(2):  # a bulk request (a POST) is not retried by obstore itself
                try:
                    obstore.delete(self._store, [self._full(k) for k in keys])
                    return
                except _NOT_FOUND:
                    break  # S3 reports no missing keys; Azure's batch does, as an error
                except obe.BaseError:
                    pass  # e.g. a pooled connection the server had closed
        # One DELETE per key, concurrently, so the failures name their keys; a missing
        # key is success.
        def delete_one(key: str) -> None:
            for attempt in range(3):
                try:
                    obstore.delete(self._store, self._full(key))
                    return
                except _NOT_FOUND:
                    return
                except obe.BaseError as e:
                    if attempt == 2:
                        failed[key] = e

        with ThreadPoolExecutor(min(DELETE_CONCURRENCY, max(1, len(keys)))) as pool:
            list(pool.map(delete_one, keys))

    def delete_prefix(self, prefix: str) -> int:
        prefix = check_prefix(prefix).rstrip("/")
        count = 0
        for page in self.list_pages(prefix, page_size=self.delete_batch):
            self.delete_many(info.key for info in page)
            count += len(page)
        return count

    def copy(self, src: str, dst: str, *, target: Storage | None = None) -> None:
        src_path = self._path(src)
        check_key(dst)
        target = target or self
        if isinstance(target, ObjectStorage) and self._same_bucket(target):
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
        """Copy then delete (object stores have no rename); moving a file onto itself
        keeps it."""
        src_path = self._path(src)
        check_key(dst)
        target = target or self
        if (
            isinstance(target, ObjectStorage)
            and self._same_bucket(target)
            and target._full(dst) == src_path
        ):
            if not self.exists(src):
                raise NotFoundError(f"{self.uri}/{src}: no such file")
            return
        self.copy(src, dst, target=target)
        self.delete_many([src])
