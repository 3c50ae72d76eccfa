"""LocalStorage never follows a symlink below its root, and leaves no empty directories.

Every job root here holds (a) a symlinked directory ``shared -> <outside>`` and (b) a
symlinked file ``exclusive/x -> <outside>/secret``. Whatever an operation does with a key
through either, the outside directory must be exactly as before (names, sizes, content,
link counts: a hard link into the root would raise one) and nothing of it may appear in
the root."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from statehold.storage import LocalStorage, UnsafePathError, check_key, open_storage

if TYPE_CHECKING:
    from tests.support.infra.object_store_servers import S3Server

Snapshot = dict[str, tuple[int, bytes, int]]


def snapshot(top: Path) -> Snapshot:
    """Every entry under `top` (links not followed): lstat size, content, link count."""
    out: Snapshot = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in [*filenames, *(d for d in dirnames if os.path.islink(Path(dirpath, d)))]:
            path = Path(dirpath, name)
            st = os.lstat(path)
            content = os.readlink(path).encode() if path.is_symlink() else path.read_bytes()
            out[os.path.relpath(path, top)] = (st.st_size, content, st.st_nlink)
    return out


@dataclass
class Setup:
    tmp: Path
    outside: Path
    job: LocalStorage
    other: LocalStorage  # a second job directory with the same links
    local_file: Path

    def snapshots(self) -> tuple[Snapshot, Snapshot, Snapshot]:
        return snapshot(self.outside), snapshot(self.job.root), snapshot(self.other.root)


def make_job(root: Path, outside: Path) -> LocalStorage:
    job = LocalStorage(root)
    job.write("good", b"good")
    job.write("exclusive/real", b"real")
    job.write("chk-1/_metadata", b"m")
    os.symlink(outside, root / "shared", target_is_directory=True)
    os.symlink(outside / "secret", root / "exclusive" / "x")
    return job


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "f").write_bytes(b"outside f")
    (outside / "sub" / "g").write_bytes(b"outside g")
    (outside / "secret").write_bytes(b"outside secret")
    local_file = tmp_path / "local.bin"
    local_file.write_bytes(b"local")
    return Setup(
        tmp_path,
        outside,
        make_job(tmp_path / "job", outside),
        make_job(tmp_path / "other", outside),
        local_file,
    )


#: Keys that go through the directory link (existing and new files) or are the file link.
LINKED_KEYS = ["shared/f", "shared/new", "shared/sub/g", "exclusive/x"]
#: Directory prefixes that are, or go through, a link.
LINKED_PREFIXES = ["shared", "shared/", "shared/sub", "exclusive/x"]

Op = Callable[[Setup, str], object]

KEY_OPS: dict[str, Op] = {
    "stat": lambda s, k: s.job.stat(k),
    "exists": lambda s, k: s.job.exists(k),
    "read": lambda s, k: s.job.read(k),
    "download": lambda s, k: s.job.download(k, s.tmp / "dl" / "out"),
    "write": lambda s, k: s.job.write(k, b"evil"),
    "upload": lambda s, k: s.job.upload(s.local_file, k),
    "create_if_absent": lambda s, k: s.job.create_if_absent(k, b"evil"),
    "copy src": lambda s, k: s.job.copy(k, "copied"),
    "copy dst": lambda s, k: s.job.copy("good", k),
    "copy src across": lambda s, k: s.job.copy(k, "copied", target=s.other),
    "copy dst across": lambda s, k: s.job.copy("good", k, target=s.other),
    "move src": lambda s, k: s.job.move(k, "moved"),
    "move dst": lambda s, k: s.job.move("good", k),
    "move src across": lambda s, k: s.job.move(k, "moved", target=s.other),
    "move dst across": lambda s, k: s.job.move("good", k, target=s.other),
}

PREFIX_OPS: dict[str, Op] = {
    "child": lambda s, p: s.job.child(p),
    "list_pages": lambda s, p: list(s.job.list_pages(p)),
    "delete_prefix": lambda s, p: s.job.delete_prefix(p),
}


@pytest.mark.parametrize("key", LINKED_KEYS)
@pytest.mark.parametrize("op", KEY_OPS)
def test_key_through_a_link_is_refused(setup: Setup, op: str, key: str) -> None:
    before = setup.snapshots()
    with pytest.raises(UnsafePathError, match="symlink") as err:
        KEY_OPS[op](setup, key)
    assert key in str(err.value)
    assert setup.snapshots() == before
    assert not (setup.tmp / "dl").exists()


@pytest.mark.parametrize("prefix", LINKED_PREFIXES)
@pytest.mark.parametrize("op", PREFIX_OPS)
def test_prefix_through_a_link_is_refused(setup: Setup, op: str, prefix: str) -> None:
    before = setup.snapshots()
    with pytest.raises(UnsafePathError, match="symlink"):
        PREFIX_OPS[op](setup, prefix)
    assert setup.snapshots() == before


@pytest.mark.parametrize("key", ["shared/f", "shared/sub/g", "shared/missing"])
def test_delete_many_under_a_linked_dir_deletes_nothing(setup: Setup, key: str) -> None:
    before = setup.snapshots()
    with pytest.raises(UnsafePathError, match="symlink"):
        setup.job.delete_many(["good", key])  # every key is checked before any delete
    assert setup.snapshots() == before


def test_delete_many_of_a_file_link_removes_the_link_only(setup: Setup) -> None:
    outside_before = snapshot(setup.outside)
    setup.job.delete_many(["exclusive/x"])
    assert not os.path.lexists(setup.job.root / "exclusive" / "x")
    assert snapshot(setup.outside) == outside_before
    assert os.listdir(setup.job.root / "exclusive") == ["real"]


def test_delete_many_of_a_dir_link_removes_the_link_only(setup: Setup) -> None:
    outside_before = snapshot(setup.outside)
    setup.job.delete_many(["shared"])
    assert not os.path.lexists(setup.job.root / "shared")
    assert snapshot(setup.outside) == outside_before


def test_claim_move_from_a_job_whose_shared_is_a_link(tmp_path: Path) -> None:
    """The restore that started this: claim moved an outside file into the new job."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "e1-c3-data.sst").write_bytes(b"not the job's")
    source = LocalStorage(tmp_path / "source")
    source.write("chk-3/_metadata", b"m")
    os.symlink(outside, source.root / "shared")
    target = LocalStorage(tmp_path / "target")
    before = snapshot(outside)
    with pytest.raises(UnsafePathError, match="'shared'.*symlink"):
        source.move("shared/e1-c3-data.sst", "shared/e1-c3-data.sst", target=target)
    assert snapshot(outside) == before
    assert not target.root.exists() or list(target.list()) == []


def test_stat_is_refused_not_none(setup: Setup) -> None:
    with pytest.raises(UnsafePathError):
        setup.job.stat("exclusive/x")
    assert setup.job.stat("exclusive/missing") is None
    assert setup.job.stat("exclusive") is None  # a directory is still not a file
    info = setup.job.stat("exclusive/real")
    assert info is not None and (info.size, info.symlink) == (4, False)


def test_list_reports_links_and_does_not_follow_them(setup: Setup) -> None:
    os.symlink(setup.tmp / "nowhere", setup.job.root / "chk-1" / "dangling")
    listed = {info.key: info for info in setup.job.list()}
    assert set(listed) == {
        "good",
        "exclusive/real",
        "exclusive/x",
        "chk-1/_metadata",
        "chk-1/dangling",
        "shared",
    }  # nothing behind the shared link: no shared/f, shared/sub/g
    for key in ("shared", "exclusive/x", "chk-1/dangling"):
        info = listed[key]
        st = os.lstat(setup.job.root / key)
        assert info.symlink
        assert (info.size, info.mtime) == (st.st_size, st.st_mtime)  # the link's own
        assert check_key(info.key) == key
    assert not any(listed[k].symlink for k in ("good", "exclusive/real", "chk-1/_metadata"))
    assert {i.key for i in setup.job.list("exclusive")} == {"exclusive/real", "exclusive/x"}
    pages = list(setup.job.list_pages("", page_size=2))
    assert sorted(i.key for p in pages for i in p) == sorted(listed)


def test_rmtree_unlinks_links_and_refuses_a_link_on_top(tmp_path: Path) -> None:
    """What delete_prefix relies on: rmtree removes a link inside the tree, not the
    link's target, and will not start from a link."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_bytes(b"keep")
    tree = tmp_path / "tree"
    tree.mkdir()
    os.symlink(outside, tree / "dirlink")
    os.symlink(outside / "keep", tree / "filelink")
    link_top = tmp_path / "top"
    os.symlink(outside, link_top)
    with pytest.raises(OSError, match="symbolic link"):
        shutil.rmtree(link_top)
    shutil.rmtree(tree)
    assert not tree.exists()
    assert os.listdir(outside) == ["keep"] and (outside / "keep").read_bytes() == b"keep"


def test_delete_prefix_root_removes_links_not_targets(setup: Setup) -> None:
    outside_before = snapshot(setup.outside)
    # good, exclusive/real, chk-1/_metadata and the two links
    assert setup.job.delete_prefix("") == 5
    assert not os.path.lexists(setup.job.root)
    assert snapshot(setup.outside) == outside_before


def test_delete_prefix_of_a_dir_holding_a_link(setup: Setup) -> None:
    outside_before = snapshot(setup.outside)
    assert setup.job.delete_prefix("exclusive") == 2
    assert not os.path.lexists(setup.job.root / "exclusive")
    assert snapshot(setup.outside) == outside_before


def test_root_reached_through_a_link_is_fine(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "via")
    job = LocalStorage(tmp_path / "via" / "job")
    assert job.uri.endswith("/via/job")
    job.write("chk-1/_metadata", b"m")
    job.copy("chk-1/_metadata", "chk-2/_metadata")
    job.move("chk-2/_metadata", "chk-3/_metadata")
    assert job.read("chk-3/_metadata") == b"m"
    assert job.child("chk-1").read("_metadata") == b"m"
    assert {i.key for i in job.list()} == {"chk-1/_metadata", "chk-3/_metadata"}
    assert not any(i.symlink for i in job.list())
    assert (tmp_path / "real" / "job" / "chk-3" / "_metadata").read_bytes() == b"m"
    assert job.delete_prefix("chk-1") == 1


def test_s3_copy_into_a_linked_local_dir_is_refused(s3_server: S3Server, setup: Setup) -> None:
    s3 = open_storage(f"s3://{s3_server.bucket}/links-{os.getpid()}", **s3_server.options)
    s3.write("f", b"from s3")
    before = setup.snapshots()
    try:
        with pytest.raises(UnsafePathError, match="symlink"):
            s3.copy("f", "shared/f", target=setup.job)
        with pytest.raises(UnsafePathError, match="symlink"):
            s3.move("f", "exclusive/x", target=setup.job)
        assert setup.snapshots() == before
        assert s3.read("f") == b"from s3"
    finally:
        s3.delete_prefix("")


# -- empty directories ----------------------------------------------------------------------
def test_delete_many_removes_directories_left_empty(tmp_path: Path) -> None:
    job = LocalStorage(tmp_path / "job")
    job.write("chk-3/_metadata", b"aborted")
    job.write("chk-2/_metadata", b"m")
    job.write("chk-2/op/state", b"s")
    job.write("savepoints/sp/a/b/c", b"deep")
    job.delete_many(["chk-3/_metadata"])
    assert sorted(os.listdir(job.root)) == ["chk-2", "savepoints"]
    job.delete_many(["chk-2/op/state"])
    assert os.listdir(job.root / "chk-2") == ["_metadata"]
    job.delete_many(["savepoints/sp/a/b/c", "chk-2/_metadata"])
    assert os.listdir(job.root) == []  # everything below the root, not the root
    job.delete_many(["chk-9/never/was"])
    assert job.root.is_dir()


def test_delete_many_removes_empty_dirs_of_already_missing_keys(tmp_path: Path) -> None:
    job = LocalStorage(tmp_path / "job")
    (job.root / "chk-4" / "sub").mkdir(parents=True)  # left by an earlier interrupted delete
    job.delete_many(["chk-4/sub/_metadata"])
    assert os.listdir(job.root) == []


def test_delete_many_keeps_a_directory_another_file_landed_in(tmp_path: Path) -> None:
    job = LocalStorage(tmp_path / "job")
    job.write("shared/a", b"a")
    job.write("shared/b", b"b")
    job.delete_many(["shared/a"])
    assert os.listdir(job.root / "shared") == ["b"]


def test_writers_retry_when_their_directory_is_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """delete_many may rmdir a directory between a writer's mkdir and its file's
    creation; each writer then creates the directory again."""
    job = LocalStorage(tmp_path / "job")
    other = LocalStorage(tmp_path / "other")
    job.write("src", b"payload")
    real_temp_for = LocalStorage._temp_for
    removed: list[Path] = []

    def racing_temp_for(self: LocalStorage, path: Path) -> Path:
        tmp: Path = real_temp_for(self, path)
        if len(removed) % 2 == 0:  # every other call: the directory vanishes once
            os.rmdir(path.parent)
        removed.append(path.parent)
        return tmp

    monkeypatch.setattr(LocalStorage, "_temp_for", racing_temp_for)
    job.write("chk-1/_metadata", b"w")
    job.upload(job.root / "src", "chk-2/data")
    job.create_if_absent("_ha/leader", b"l")
    job.copy("src", "chk-3/copy")
    job.copy("src", "chk-4/copy", target=other)
    assert len(removed) == 10
    monkeypatch.undo()
    assert job.read("chk-1/_metadata") == b"w"
    assert job.read("chk-2/data") == b"payload"
    assert job.read("_ha/leader") == b"l"
    assert job.read("chk-3/copy") == b"payload"
    assert other.read("chk-4/copy") == b"payload"


def test_move_retries_when_its_directory_is_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = LocalStorage(tmp_path / "job")
    job.write("a/src", b"payload")
    real_replace = os.replace
    calls: list[str] = []

    def racing_replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        calls.append(str(dst))
        if len(calls) == 1:
            os.rmdir(Path(dst).parent)  # removed between the mkdir and the rename
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", racing_replace)
    job.move("a/src", "b/dst")
    monkeypatch.undo()
    assert len(calls) == 2
    assert job.read("b/dst") == b"payload"
    assert {i.key for i in job.list()} == {"b/dst"}
