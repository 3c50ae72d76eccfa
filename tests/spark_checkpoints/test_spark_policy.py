"""The deletion rule for Spark checkpoint locations (spark_checkpoints/policy.py), on plain
data: each verdict, the order they are decided in, the bulk judgment's agreement with the
per-file one, and the last-line check."""

from __future__ import annotations

import pytest

from statehold.cleanup.policy import Verdict
from statehold.spark_checkpoints.layout import StoreId, parse
from statehold.spark_checkpoints.policy import (
    SparkView,
    check_deletable,
    check_deletable_names,
    judge,
    judge_names,
)
from statehold.storage.base import FileInfo, UnsafePathError

NOW = 1_000_000.0
LISTED = NOW - 5.0
OLD = NOW - 7200.0
STORE = "state/0/1"


def view(**over: object) -> SparkView:
    base: dict[str, object] = {
        "needed": frozenset({f"{STORE}/5.zip", f"{STORE}/SSTs/a.sst"}),
        "listed_at": LISTED,
        "now": NOW,
        "grace": 3600.0,
        "newest_version": 7,
    }
    return SparkView(**{**base, **over})  # type: ignore[arg-type]


def verdict(key: str, mtime: float = OLD, *, symlink: bool = False, **kw: object) -> Verdict:
    subject = kw.pop("subject", None)
    return judge(FileInfo(key, 10, mtime, symlink), parse(key), view(**kw), subject=subject)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("notes.txt", Verdict.FOREIGN),
        (f"{STORE}/odd-file", Verdict.FOREIGN),
        (f"{STORE}/5.zip", Verdict.REFERENCED),
        (f"{STORE}/SSTs/a.sst", Verdict.REFERENCED),
        ("metadata", Verdict.KEPT),
        ("offsets/3", Verdict.KEPT),
        ("commits/3", Verdict.KEPT),
        ("sources/0/3", Verdict.KEPT),
        ("sources/0/9.compact", Verdict.KEPT),
        ("state/0/_metadata/metadata", Verdict.KEPT),
        ("state/0/0/_metadata/schema", Verdict.KEPT),
        (f"{STORE}/SSTs/orphan.sst", Verdict.DELETABLE),
        (f"{STORE}/logs/orphan.log", Verdict.DELETABLE),
        (f"{STORE}/3.zip", Verdict.DELETABLE),
        (f"{STORE}/3.changelog", Verdict.DELETABLE),
        (f"{STORE}/3.delta", Verdict.DELETABLE),
        (f"{STORE}/3.snapshot", Verdict.DELETABLE),
        (f"{STORE}/7_abc-1.changelog", Verdict.DELETABLE),  # v2: an id no lineage names
        (f"{STORE}/8.changelog", Verdict.PROTECTED),  # above the newest committed version
        (f"{STORE}/8_abc.zip", Verdict.PROTECTED),
        (f"{STORE}/.4.delta.1234.tmp", Verdict.DELETABLE),
    ],
)
def test_each_kind_old(key: str, expected: Verdict) -> None:
    assert verdict(key) is expected


def test_symlinks_are_foreign_even_when_needed_or_deletable() -> None:
    assert verdict(f"{STORE}/SSTs/a.sst", symlink=True) is Verdict.FOREIGN
    assert verdict(f"{STORE}/SSTs/orphan.sst", symlink=True) is Verdict.FOREIGN


@pytest.mark.parametrize("mtime", [LISTED, LISTED + 1, NOW - 3599.0, NOW + 10])
def test_young_or_newer_than_the_listing_is_protected(mtime: float) -> None:
    for key in (f"{STORE}/SSTs/orphan.sst", f"{STORE}/3.zip", f"{STORE}/.x.tmp"):
        assert verdict(key, mtime) is Verdict.PROTECTED


def test_listing_start_protects_even_with_no_grace() -> None:
    assert verdict(f"{STORE}/SSTs/o.sst", LISTED, grace=0.0) is Verdict.PROTECTED
    assert verdict(f"{STORE}/SSTs/o.sst", LISTED - 0.001, grace=0.0) is Verdict.DELETABLE


def test_no_committed_batch_protects_every_version_file() -> None:
    assert verdict(f"{STORE}/1.delta", newest_version=None) is Verdict.PROTECTED
    assert verdict(f"{STORE}/SSTs/o.sst", newest_version=None) is Verdict.DELETABLE


def test_a_spared_store_keeps_everything() -> None:
    spared = frozenset({StoreId(0, 1)})
    assert verdict(f"{STORE}/SSTs/orphan.sst", spared=spared) is Verdict.REFERENCED
    assert verdict(f"{STORE}/3.zip", spared=spared) is Verdict.REFERENCED
    assert verdict(f"{STORE}/.3.zip.crc", spared=spared) is Verdict.REFERENCED
    assert verdict(f"{STORE}/SSTs/.o.sst.crc", spared=spared) is Verdict.REFERENCED
    assert verdict("state/0/0/3.zip", spared=spared) is Verdict.DELETABLE


@pytest.mark.parametrize(
    ("subject", "expected"),
    [
        (None, Verdict.DELETABLE),  # the subject is gone
        (Verdict.DELETABLE, Verdict.DELETABLE),
        (Verdict.REFERENCED, Verdict.REFERENCED),
        (Verdict.KEPT, Verdict.KEPT),
        (Verdict.PROTECTED, Verdict.PROTECTED),
        (Verdict.FOREIGN, Verdict.FOREIGN),
    ],
)
def test_a_crc_follows_its_subject(subject: Verdict | None, expected: Verdict) -> None:
    assert verdict(f"{STORE}/.3.zip.crc", subject=subject) is expected


def test_a_young_crc_is_protected_whatever_its_subject() -> None:
    assert verdict(f"{STORE}/.3.zip.crc", NOW, subject=None) is Verdict.PROTECTED


def test_bulk_judgment_agrees_with_judge() -> None:
    directory = f"{STORE}/SSTs"
    names = ["a.sst", "orphan.sst", "young.sst", "new.sst", ".orphan.sst.crc", "x.txt"]
    mtimes = [OLD, OLD, NOW - 10, LISTED + 1, OLD, OLD]
    v = view()
    out = judge_names(directory, names, mtimes, v)
    assert [names[i] for i in out[None]] == [".orphan.sst.crc", "x.txt"]
    for got, ids in out.items():
        for i in ids if got is not None else []:
            key = f"{directory}/{names[i]}"
            assert judge(FileInfo(key, 1, mtimes[i]), parse(key), v) is got, key
    assert [names[i] for i in out[Verdict.DELETABLE]] == ["orphan.sst"]


def test_bulk_judgment_of_a_spared_store_and_of_other_directories() -> None:
    out = judge_names(f"{STORE}/SSTs", ["o.sst"], [OLD], view(spared=frozenset({StoreId(0, 1)})))
    assert out[Verdict.REFERENCED] == [0]
    assert judge_names(STORE, ["3.zip"], [OLD], view())[None] == [0]


@pytest.mark.parametrize(
    "key",
    ["metadata", "offsets/3", "commits/3", "sources/0/3", "state/0/_metadata/metadata",
     "state/0/0/_metadata/schema", "notes.txt", "state/0/0/odd"],
)
def test_last_line_refuses_what_gc_never_deletes(key: str) -> None:
    with pytest.raises(UnsafePathError, match="never does"):
        check_deletable(key)


@pytest.mark.parametrize("key", ["../x.sst", "/abs/x.sst", "state/0/0/SSTs/../../x.sst"])
def test_last_line_refuses_unsafe_keys(key: str) -> None:
    with pytest.raises(UnsafePathError):
        check_deletable(key)


def test_last_line_passes_what_gc_deletes() -> None:
    for key in (f"{STORE}/3.zip", f"{STORE}/SSTs/o.sst", f"{STORE}/.3.zip.crc", "offsets/.3.x.tmp"):
        assert check_deletable(key) == key
    names = ["a.sst", "b.sst"]
    assert check_deletable_names(f"{STORE}/SSTs", names) == names
    with pytest.raises(UnsafePathError):
        check_deletable_names("offsets", ["3"])
    with pytest.raises(UnsafePathError):
        check_deletable_names(f"{STORE}/SSTs", ["a.sst", "odd"])
