"""One contract for every Storage backend, run on local disk, on an S3 server (moto), on
Azurite (Azure Blob) and on fake-gcs-server (GCS, behind tests/support/infra/gcs_front.py).

Whatever the backend, statehold relies on: exact recursive listing by directory prefix,
atomic write/create, idempotent bulk delete, copies that do not alias later writes, and
refusal of any key that could leave the root."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from statehold.format import layout
from statehold.storage import (
    AlreadyExistsError,
    ConflictError,
    DeleteError,
    LocalStorage,
    NotFoundError,
    Storage,
    StorageError,
    UnsafePathError,
    open_storage,
)
from statehold.storage.base import check_prefix
from statehold.storage.s3 import S3Storage

if TYPE_CHECKING:
    from tests.support.infra.object_store_servers import S3Server
    from tests.support.storage_roots import StorageFactory

BACKENDS = ["local", "s3", "gcs", "azure"]


@pytest.fixture(params=BACKENDS)
def storage_factory(request: pytest.FixtureRequest, tmp_path: Path) -> StorageFactory:
    """Here every backend, the object stores' emulators included (conftest's default
    covers local disk and S3 only, to keep the rest of the suite short)."""
    from tests.support.storage_roots import storage_factory_for

    return storage_factory_for(request, tmp_path, request.param)


def backend_env(request: pytest.FixtureRequest, storage: Storage) -> dict[str, str]:
    """The environment a subprocess needs to open `storage` from its URI alone."""
    from tests.support.storage_roots import OBJECT_STORES, object_store_server

    backend = next((b for b, (_, scheme) in OBJECT_STORES.items()
                    if storage.uri.startswith(f"{scheme}://")), None)
    return {} if backend is None else object_store_server(request, backend).env


def keys(storage: Storage, prefix: str = "") -> set[str]:
    return {info.key for info in storage.list(prefix)}


def write_many(storage: Storage, names: list[str], data: bytes = b"x") -> None:
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda k: storage.write(k, data), names))


# -- listing ------------------------------------------------------------------------------
def test_list_pages_paginates_and_covers_everything(storage: Storage) -> None:
    names = [f"shared/f{i:03d}" for i in range(25)]
    write_many(storage, names)
    pages = list(storage.list_pages("", page_size=7))
    assert all(1 <= len(page) <= 7 for page in pages)
    listed = [info.key for page in pages for info in page]
    assert sorted(listed) == names  # each exactly once


def test_list_is_recursive_and_relative_to_root(storage: Storage) -> None:
    storage.write("chk-1/_metadata", b"m")
    storage.write("chk-1/deep/er/file", b"abc")
    storage.write("shared/s", b"s")
    assert keys(storage) == {"chk-1/_metadata", "chk-1/deep/er/file", "shared/s"}
    assert keys(storage, "chk-1") == {"chk-1/_metadata", "chk-1/deep/er/file"}
    assert keys(storage, "chk-1/") == keys(storage, "chk-1")
    assert keys(storage, "chk-1/deep") == {"chk-1/deep/er/file"}
    sizes = {info.key: info.size for info in storage.list()}
    assert sizes["chk-1/deep/er/file"] == 3


def test_prefix_is_a_directory_not_a_string_prefix(storage: Storage) -> None:
    storage.write("chk-1/_metadata", b"1")
    storage.write("chk-10/_metadata", b"10")
    storage.write("chk-1x", b"file next to the directory")
    assert keys(storage, "chk-1") == {"chk-1/_metadata"}
    assert keys(storage, "chk-10") == {"chk-10/_metadata"}


def test_missing_prefix_lists_empty(storage: Storage) -> None:
    assert keys(storage) == set()
    storage.write("a/b", b"x")
    assert keys(storage, "nope") == set()
    assert keys(storage, "a/b/c") == set()


# -- stat / read --------------------------------------------------------------------------
def test_stat_and_exists(storage: Storage) -> None:
    before = time.time()
    storage.write("dir/file", b"12345")
    info = storage.stat("dir/file")
    assert info is not None
    assert (info.key, info.size) == ("dir/file", 5)
    # epoch seconds (not ms, not a naive local time far off)
    assert before - 3600 < info.mtime < time.time() + 3600
    assert storage.exists("dir/file")
    assert storage.stat("dir/missing") is None
    assert not storage.exists("missing")
    assert storage.stat("dir") is None  # a directory-like prefix is not a file


def test_read_missing_raises_not_found(storage: Storage, tmp_path: Path) -> None:
    with pytest.raises(NotFoundError):
        storage.read("nope/missing")
    with pytest.raises(FileNotFoundError):  # NotFoundError is also a FileNotFoundError
        storage.read("missing")
    with pytest.raises(NotFoundError):
        storage.download("missing", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_write_overwrites(storage: Storage) -> None:
    storage.write("k", b"first version")
    storage.write("k", b"v2")
    assert storage.read("k") == b"v2"
    assert [(i.key, i.size) for i in storage.list()] == [("k", 2)]


def test_upload_download_multi_megabyte(storage: Storage, tmp_path: Path) -> None:
    data = os.urandom(12 * 1024 * 1024 + 123)  # above the 5 MiB multipart chunk on S3
    src = tmp_path / "big.sst"
    src.write_bytes(data)
    storage.upload(src, "shared/big")
    info = storage.stat("shared/big")
    assert info is not None and info.size == len(data)
    out = tmp_path / "dl" / "big.copy"
    storage.download("shared/big", out)
    assert out.read_bytes() == data
    assert storage.read("shared/big") == data


def test_hand_over_and_download_to_read(storage: Storage, tmp_path: Path) -> None:
    """A file handed over is stored whole and gone from where it was; a file downloaded
    to read holds the stored bytes, and removing it leaves the stored file. On a local
    disk on one file system neither copies: the stored file is the handed-over inode, and
    the one to read is a link to the stored one."""
    data = os.urandom(6 * 1024 * 1024 + 5)
    src = tmp_path / "run.sst"
    src.write_bytes(data)
    inode = src.stat().st_ino
    storage.hand_over(src, "shared/handed")
    assert not src.exists()
    assert storage.read("shared/handed") == data
    out = tmp_path / "read" / "handed.sst"
    storage.download_to_read("shared/handed", out)
    assert out.read_bytes() == data
    if isinstance(storage, LocalStorage):
        stored = Path(storage.root) / "shared" / "handed"
        assert stored.stat().st_ino == inode == out.stat().st_ino
    out.unlink()
    assert storage.read("shared/handed") == data
    with pytest.raises(NotFoundError):
        storage.download_to_read("missing", tmp_path / "missing")


def test_a_local_hand_over_across_file_systems_copies(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the rename fails as across devices (EXDEV), the file is uploaded instead."""
    import errno

    storage = LocalStorage(tmp_path / "root")
    src = tmp_path / "run.sst"
    src.write_bytes(b"bytes")
    real_replace = os.replace

    def no_rename_of_the_source(a: os.PathLike[str] | str, b: os.PathLike[str] | str) -> None:
        if Path(a) == src:
            raise OSError(errno.EXDEV, "cross-device link")
        real_replace(a, b)

    monkeypatch.setattr(os, "replace", no_rename_of_the_source)
    storage.hand_over(src, "k")
    assert storage.read("k") == b"bytes" and not src.exists()


def test_checksum_of_small_large_and_missing_files(storage: Storage) -> None:
    small, large = b"small", os.urandom(17 * 1024 * 1024)  # above the in-memory limit
    storage.write("small", small)
    storage.write("large", large)
    for key, data in (("small", small), ("large", large)):
        expected = "sha256:" + hashlib.sha256(data).hexdigest()
        assert storage.checksum(key) == expected
        assert storage.checksum(key, size_hint=len(data)) == expected
    with pytest.raises(NotFoundError):
        storage.checksum("missing")


# -- create_if_absent ---------------------------------------------------------------------
def test_create_if_absent_refuses_second(storage: Storage) -> None:
    storage.create_if_absent("_ha/leader", b"epoch-1")
    with pytest.raises(AlreadyExistsError):
        storage.create_if_absent("_ha/leader", b"epoch-2")
    assert storage.read("_ha/leader") == b"epoch-1"
    assert keys(storage) == {"_ha/leader"}  # no temp file left behind


def test_replace_if_version_only_over_the_version_read(storage: Storage) -> None:
    """The conditional replace that write-once ``chk-N/_metadata`` relies on: it never
    lands over a version it did not read, nor on a file that is gone."""
    storage.write("chk-1/_metadata", b"leftover")
    data, version = storage.read_versioned("chk-1/_metadata")
    assert data == b"leftover"
    storage.replace_if_version("chk-1/_metadata", version, b"mine")
    assert storage.read("chk-1/_metadata") == b"mine"
    with pytest.raises(ConflictError):  # a zombie still holding the old version
        storage.replace_if_version("chk-1/_metadata", version, b"zombie")
    assert storage.read("chk-1/_metadata") == b"mine"
    _data, current = storage.read_versioned("chk-1/_metadata")
    storage.delete_many(["chk-1/_metadata"])
    with pytest.raises(ConflictError):
        storage.replace_if_version("chk-1/_metadata", current, b"late")
    assert keys(storage) == set()  # nothing recreated, no temp file left behind


def test_create_if_absent_concurrent_exactly_one_wins(storage: Storage) -> None:
    n = 8
    barrier = threading.Barrier(n)
    winners: list[int] = []
    losers: list[int] = []

    def attempt(i: int) -> None:
        barrier.wait()
        try:
            storage.create_if_absent("_ha/epoch-7", f"writer-{i}".encode())
            winners.append(i)
        except AlreadyExistsError:
            losers.append(i)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1 and len(losers) == n - 1
    assert storage.read("_ha/epoch-7") == f"writer-{winners[0]}".encode()


# -- deleting -----------------------------------------------------------------------------
def test_delete_many_bulk_missing_ok_idempotent(storage: Storage) -> None:
    names = [f"exclusive/e1-c{i}-x" for i in range(1050)]  # more than one S3 batch
    write_many(storage, names + ["keep/me"])
    storage.delete_many(iter(names + ["never/existed"]))
    assert keys(storage) == {"keep/me"}
    storage.delete_many(names)  # again: all missing, still success
    storage.delete_many([])
    assert keys(storage) == {"keep/me"}


def test_local_delete_many_reports_failures(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "root")
    storage.write("dir/inside", b"x")
    storage.write("plain", b"x")
    with pytest.raises(DeleteError) as err:
        storage.delete_many(["plain", "dir"])  # a directory cannot be unlinked
    assert set(err.value.failed) == {"dir"}
    assert keys(storage) == {"dir/inside"}


def test_delete_prefix(storage: Storage) -> None:
    write_many(storage, ["chk-1/_metadata", "chk-1/a/b", "chk-1/c", "chk-10/_metadata", "x"])
    assert storage.delete_prefix("chk-1") == 3
    assert keys(storage) == {"chk-10/_metadata", "x"}
    assert storage.delete_prefix("chk-1") == 0
    assert storage.delete_prefix("missing/dir/") == 0
    assert keys(storage) == {"chk-10/_metadata", "x"}


# -- copy / move --------------------------------------------------------------------------
def test_copy_within_storage_is_independent_of_later_writes(storage: Storage) -> None:
    storage.write("shared/a", b"original")
    storage.copy("shared/a", "export/chk-3/a")
    assert storage.read("export/chk-3/a") == b"original"
    storage.write("shared/a", b"replaced")  # a hard link must not alias this
    assert storage.read("export/chk-3/a") == b"original"
    storage.copy("shared/a", "shared/a")  # onto itself: nothing lost
    assert storage.read("shared/a") == b"replaced"
    with pytest.raises(NotFoundError):
        storage.copy("shared/missing", "x")
    assert not storage.exists("x")


def test_a_copy_is_a_new_file(storage: Storage, tmp_path: Path) -> None:
    """A copy within a job directory is dated when it was made, not when its source was:
    a savepoint's copies are judged young by the deletion policy until its `_metadata`
    exists, and a hard link on local disk would carry its source's months-old mtime (a
    gc listing meanwhile would take them for an abandoned savepoint's leftovers)."""
    from statehold.cleanup.holders import Holders
    from statehold.cleanup.policy import TEMP_GRACE_SECONDS, Verdict, View, judge

    storage.write("shared/e1-c1-0123456789abcdef-t0", b"state")
    if isinstance(storage, LocalStorage):  # object stores date their objects themselves
        old = time.time() - 2 * TEMP_GRACE_SECONDS
        os.utime(storage.root / "shared/e1-c1-0123456789abcdef-t0", (old, old))
    before = time.time() - 2  # object stores date to the second
    storage.copy("shared/e1-c1-0123456789abcdef-t0", "savepoints/sp/e1-c1-0123456789abcdef-t0")
    listing = list(storage.list())
    copy = next(i for i in listing if i.key.startswith("savepoints/"))
    assert copy.mtime >= before
    view = View.of(2, Holders(), None, listing)
    assert judge(copy, view) is Verdict.PROTECTED  # a savepoint in the making


def test_copy_and_move_across_roots(storage_factory: StorageFactory) -> None:
    src, dst = storage_factory(), storage_factory()
    src.write("shared/f", b"state")
    src.copy("shared/f", "shared/g", target=dst)
    assert dst.read("shared/g") == b"state"
    assert src.read("shared/f") == b"state"
    assert keys(src) == {"shared/f"}
    src.move("shared/f", "claimed/f", target=dst)
    assert not src.exists("shared/f")
    assert dst.read("claimed/f") == b"state"


def test_move_within_storage(storage: Storage) -> None:
    storage.write("a/src", b"payload")
    storage.move("a/src", "b/dst")
    assert keys(storage) == {"b/dst"}
    assert storage.read("b/dst") == b"payload"
    storage.move("b/dst", "b/dst")
    assert storage.read("b/dst") == b"payload"
    with pytest.raises(NotFoundError):
        storage.move("a/src", "c")
    assert keys(storage) == {"b/dst"}


def test_copy_and_move_between_local_and_s3(s3_server: S3Server, tmp_path: Path) -> None:
    local = LocalStorage(tmp_path / "local-root")
    s3 = open_storage(f"s3://{s3_server.bucket}/cross-{os.getpid()}", **s3_server.options)
    assert isinstance(s3, S3Storage)
    data = os.urandom(300_000)
    local.write("shared/f", data)
    local.copy("shared/f", "up/f", target=s3)
    assert s3.read("up/f") == data
    s3.copy("up/f", "down/f", target=local)
    assert local.read("down/f") == data
    assert keys(local) == {"shared/f", "down/f"}  # the download's temp file is gone
    local.move("shared/f", "moved/f", target=s3)
    assert not local.exists("shared/f") and s3.read("moved/f") == data
    s3.move("moved/f", "back/f", target=local)
    assert not s3.exists("moved/f") and local.read("back/f") == data
    with pytest.raises(NotFoundError):
        s3.copy("missing", "m", target=local)
    with pytest.raises(NotFoundError):
        local.copy("missing", "m", target=s3)
    s3.delete_prefix("")


# -- safety -------------------------------------------------------------------------------
BAD_KEYS = [
    "",
    "/abs/path",
    "../escape",
    "a/../../escape",
    "a/../b",
    "a//b",
    "a/",
    "./a",
    "a/./b",
    "a\\b",
    "..\\escape",
    "s3://other-bucket/key",
    "file:///etc/passwd",
    "C:/windows",
    "nul\x00byte",
]


def _unsafe_calls(
    storage: Storage, sibling: Storage, key: str, tmp_path: Path, local_file: Path
) -> list[tuple[str, Callable[[], object]]]:
    """Every operation that takes a key, called with `key`."""
    calls: list[tuple[str, Callable[[], object]]] = [
        ("stat", lambda: storage.stat(key)),
        ("exists", lambda: storage.exists(key)),
        ("read", lambda: storage.read(key)),
        ("download", lambda: storage.download(key, tmp_path / "dl")),
        ("checksum", lambda: storage.checksum(key)),
        ("write", lambda: storage.write(key, b"evil")),
        ("upload", lambda: storage.upload(local_file, key)),
        ("create_if_absent", lambda: storage.create_if_absent(key, b"evil")),
        ("delete_many", lambda: storage.delete_many(["good", key])),
        ("copy src", lambda: storage.copy(key, "copied")),
        ("copy dst", lambda: storage.copy("good", key)),
        ("copy dst across", lambda: storage.copy("good", key, target=sibling)),
        ("move src", lambda: storage.move(key, "moved")),
        ("move dst", lambda: storage.move("good", key)),
    ]
    try:  # a directory prefix may end with '/', and '' is the root itself
        check_prefix(key)
    except UnsafePathError:
        calls += [
            ("child", lambda: storage.child(key)),
            ("list_pages", lambda: list(storage.list_pages(key))),
            ("delete_prefix", lambda: storage.delete_prefix(key)),
        ]
    return calls


@pytest.mark.parametrize("bad", BAD_KEYS)
def test_unsafe_keys_rejected_everywhere(
    storage_factory: StorageFactory, tmp_path: Path, bad: str
) -> None:
    storage, sibling = storage_factory(), storage_factory()
    sibling_name = sibling.uri.rstrip("/").rsplit("/", 1)[1]
    sibling.write("victim", b"do not touch")
    storage.write("good", b"good")
    local_file = tmp_path / "local.bin"
    local_file.write_bytes(b"local")
    for key in [bad, f"../{sibling_name}/victim"]:
        for name, call in _unsafe_calls(storage, sibling, key, tmp_path, local_file):
            with pytest.raises(UnsafePathError):
                call()
                pytest.fail(f"{name} accepted {key!r}")
    # nothing was touched: not the root, not the sibling, not the local disk
    assert keys(storage) == {"good"} and storage.read("good") == b"good"
    assert keys(sibling) == {"victim"} and sibling.read("victim") == b"do not touch"
    assert not (tmp_path / "dl").exists()


# -- child --------------------------------------------------------------------------------
def test_child(storage: Storage) -> None:
    job = storage.child("job-1")
    assert job.uri.rstrip("/").endswith("/job-1")
    assert type(job) is type(storage)
    job.write("chk-1/_metadata", b"m")
    assert keys(storage) == {"job-1/chk-1/_metadata"}
    assert keys(job) == {"chk-1/_metadata"}
    deeper = job.child("chk-1/")
    assert deeper.read("_metadata") == b"m"
    assert keys(deeper) == {"_metadata"}
    job.copy("chk-1/_metadata", "copy", target=storage)
    assert storage.read("copy") == b"m"
    assert storage.child("job-2").delete_prefix("") == 0
    assert job.delete_prefix("") == 1
    assert keys(storage) == {"copy"}


# -- crash safety of writes -----------------------------------------------------------------
_WRITER = """
import sys
from statehold.storage import open_storage
storage = open_storage(sys.argv[1])  # store settings from the environment
size = int(sys.argv[2])
i = 0
while True:
    storage.write("state", (b"AB"[i % 2:i % 2 + 1]) * size)
    print(i, flush=True)
    i += 1
"""


def test_interrupted_write_leaves_old_or_new_content(
    storage: Storage, request: pytest.FixtureRequest
) -> None:
    """Kill a writer process in the middle of its writes: the file holds one whole
    version, and anything else left behind is a temp file that parse() calls TEMP."""
    size = 2 * 1024 * 1024
    env = {**os.environ, **backend_env(request, storage)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, storage.uri, str(size)],
        stdout=subprocess.PIPE,
        env=env,
    )
    try:
        assert proc.stdout is not None
        for _ in range(3):  # three writes completed, the fourth is under way
            assert proc.stdout.readline() != b""
    finally:
        proc.kill()
        proc.wait()
    content = storage.read("state")
    assert len(content) == size
    assert content in (b"A" * size, b"B" * size)
    for key in keys(storage) - {"state"}:
        assert layout.parse(key).kind is layout.Kind.TEMP


def test_local_failed_write_keeps_old_content(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = LocalStorage(tmp_path / "root")
    storage.write("chk-1/_metadata", b"old")

    def disk_full(_fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(StorageError, match="the file system is full"):  # one line, our family
        storage.write("chk-1/_metadata", b"new but never durable")
    monkeypatch.undo()
    assert storage.read("chk-1/_metadata") == b"old"
    assert keys(storage) == {"chk-1/_metadata"}  # the temp file was removed


def test_local_temp_names_are_classified_temp(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "root")
    tmp = storage._temp_for(storage.root / "shared" / "e1-c2-abc")
    tmp.write_bytes(b"partial")
    (temp_key,) = keys(storage)
    assert layout.TEMP_MARKER in temp_key
    assert layout.parse(temp_key).kind is layout.Kind.TEMP


def test_local_copy_is_a_hard_link(tmp_path: Path) -> None:
    a = LocalStorage(tmp_path / "job-a")
    b = LocalStorage(tmp_path / "job-b")
    a.write("shared/f", b"data")
    a.copy("shared/f", "exclusive/g")
    assert os.stat(a.root / "shared" / "f").st_nlink == 2
    assert os.path.samefile(a.root / "shared" / "f", a.root / "exclusive" / "g")
    a.copy("shared/f", "shared/f", target=b)  # no-claim copy into another job directory
    assert os.stat(a.root / "shared" / "f").st_nlink == 3
    assert b.read("shared/f") == b"data"


def test_list_name_pages_from_a_start_key(storage: Storage) -> None:
    """Whatever a backend lists from `start`, each file comes once; an object store
    lists only `start` and what follows it."""
    write_many(storage, ["d/a", "d/b", "d/c", "d/d", "e/x"])
    listed: list[str] = []
    for page in storage.list_name_pages("d", page_size=2, start="d/b"):
        listed += [info.key for info in page.infos]
        listed += [f"{page.directory}/{n}" if page.directory else n for n in page.names]
    assert len(listed) == len(set(listed))
    assert {"d/b", "d/c", "d/d"} <= set(listed) <= {"d/a", "d/b", "d/c", "d/d"}
    if not isinstance(storage, LocalStorage):
        assert sorted(listed) == ["d/b", "d/c", "d/d"]
