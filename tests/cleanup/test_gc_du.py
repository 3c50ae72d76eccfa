"""`du` at scale (issue 16): the data files of a directory are counted by name in bulk
(`policy.judge_names`, with the sizes the listing gave), and that gives the same usage
as judging every listed file on its own; both are checked against the listing."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from statehold import tools
from statehold.format import layout
from statehold.storage import Storage, open_storage
from statehold.storage.base import NamePage
from tests.support.in_flight import add_orphans, running_with_checkpoint_in_flight


@pytest.mark.parametrize("damage", [None, "salvaged", "unreadable"])
def test_du_by_name_counts_as_judging_each_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str | None
) -> None:
    storage = open_storage(str(tmp_path / "job"))
    coord = running_with_checkpoint_in_flight(storage, seed=5)
    epoch = coord.epoch
    add_orphans(storage, epoch, 2500)
    shared = tmp_path / "job" / layout.SHARED_DIR
    odd = (f".e{epoch}-c2-x.tmp-0123", f".e{epoch}-c3-y.tmp-4567", "notes.txt", "E1-c1-aa",
           f"e{epoch + 1}-c1-newer", f"e{epoch}-c4-in-flight")
    for name in odd:
        (shared / name).write_bytes(b"12345")
    os.utime(shared / odd[1], (0, 0))  # an old interrupted write; the other is young
    (shared / "link").symlink_to(tmp_path)
    # a young interrupted write of the job's own: kept (its mtime decides, not its name)
    (tmp_path / "job" / layout.JOB_DIR / ".result.json.tmp-0123").write_bytes(b"x")
    if damage is not None:
        coord.close()  # a stopped job whose checkpoint 2 cannot be verified
        named = f"e{epoch}-c1-{7:016x}"  # one of the orphans, named by its damaged text
        text = {"salvaged": f'cut "path": "../shared/{named}" off', "unreadable": "\x00"}
        storage.write(layout.checkpoint_metadata_key(2), text[damage].encode())

    listed_names: list[str] = []
    by_name = storage.list_stat_pages

    def counting(prefix: str = "", page_size: int = 1000) -> Iterator[NamePage]:
        for page in by_name(prefix, page_size):
            listed_names.extend(page.names)
            yield page

    monkeypatch.setattr(storage, "list_stat_pages", counting)
    fast = tools.du(storage)
    # every file with its stat, each judged by `policy.judge` alone
    monkeypatch.setattr(storage, "list_stat_pages",
                        functools.partial(Storage.list_stat_pages, storage))
    slow = tools.du(storage)
    files = list(storage.list())
    if damage is None:
        coord.close()

    assert len(listed_names) > 2500  # the bulk path counted the orphans
    assert fast == slow
    assert fast.total_files == len(files) and fast.total_bytes == sum(f.size for f in files)
    assert sum(fast.by_scope.values()) == fast.total_bytes
    # the orphans, the odd names and the link (foreign, protected or deletable: none
    # referenced), less the one a damaged document still names
    assert fast.unreferenced_files >= 2500 + len(odd) + 1 - (damage == "salvaged")
    assert bool(fast.quarantined) == (damage is not None)
    assert fast.unreferenced_sample == sorted(fast.unreferenced_sample)


def test_stat_pages_list_every_file_once_with_its_stat(storage: Storage) -> None:
    """`list_stat_pages` (local: names of one directory with sizes and mtimes) lists
    what `list` does, with the same sizes, on every backend."""
    for i in range(7):
        storage.write(f"shared/e1-c1-{i}", b"x" * i)
    storage.write("chk-1/_metadata", b"12")
    storage.write("top", b"")
    expected = {i.key: (i.size, int(i.mtime)) for i in storage.list()}
    got: list[tuple[str, tuple[int, int]]] = []
    for page in storage.list_stat_pages(page_size=3):
        assert len(page) <= 3
        base = f"{page.directory}/" if page.directory else ""
        stats = zip(page.names, page.sizes, page.mtimes, strict=True)
        got += [(base + n, (s, int(m))) for n, s, m in stats]
        got += [(i.key, (i.size, int(i.mtime))) for i in page.infos]
    assert len(got) == len(expected) == 9 and dict(got) == expected
