"""The Python operations of statehold.tools on real job directories (local disk and moto
S3), built by the real coordinator with simulated tasks."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from statehold import tools
from statehold.checkpoint.coordinator import CheckpointCoordinator
from statehold.format import layout
from statehold.format.metadata import MetadataError, StateFile
from statehold.ha.embedded import EmbeddedHAStore
from statehold.job.directory import OWNER_KEY, open_job, read_owner
from statehold.storage import Storage, open_storage
from statehold.tools import NotAJobDirectoryError, ToolError
from tests.support.jobs import (
    MAX_PARALLELISM,
    RANGES,
    Job,
    Task,
    build_job,
    listing,
    refs,
    retained_keys,
    rewrite_with_valid_checksum,
)


# -- list / inspect ----------------------------------------------------------------------
def test_list_shows_retained_stale_and_savepoints(storage: Storage) -> None:
    build_job(storage)
    result = tools.list_checkpoints(storage)
    assert [(c.checkpoint_id, c.retained) for c in result.checkpoints] == [
        (3, True), (4, True), (5, True), (99, False)]
    assert [s.path for s in result.savepoints] == ["savepoints/sp"]
    assert result.problems == []
    for c in result.checkpoints:
        key = f"{c.path}/_metadata"
        assert c.referenced_bytes == sum(f.size for f in refs(storage, key).values())
        assert c.file_count == len(refs(storage, key))
        assert c.epoch == 1
    json.loads(result.model_dump_json())


def test_inspect_job_dir_means_newest_retained(storage: Storage) -> None:
    build_job(storage)
    result = tools.inspect(storage)
    assert result.metadata_path == "chk-5/_metadata"
    assert result.retained and result.checkpoint_id == 5 and result.job_id == "job-1"
    assert (result.key_hash, result.format_version) == ("xxhash64", 3)  # a new job's
    sizes = listing(storage)
    expected = refs(storage, "chk-5/_metadata")
    assert {f.path for f in result.files} == set(expected)
    for f in result.files:
        assert sizes[f.path] == f.size == expected[f.path].size
        assert f.checksum == expected[f.path].checksum
        assert f.operator == "agg" and f.key_groups in {(0, 1), (2, 3)}
    assert result.total_bytes == sum(result.bytes_by_scope.values())
    sp = tools.inspect(tools.locate(storage, "savepoints/sp"))
    assert sp.kind == "savepoint" and sp.checkpoint_id == 2 and not sp.retained


def test_locate_parses_uris(tmp_path: Path) -> None:
    # locate now opens the job directory (open_job), so the location must be one: refused
    # before, an (empty) job directory with its owner record after
    with pytest.raises(NotAJobDirectoryError):
        tools.locate(str(tmp_path / "job" / "chk-7"))
    open_job(str(tmp_path / "job"), "embedded", create=True).close()
    t = tools.locate(str(tmp_path / "job" / "chk-7"))
    assert (t.kind, t.metadata_key, t.job.uri) == (
        "checkpoint", "chk-7/_metadata", (tmp_path / "job").as_uri())
    t = tools.locate(f"file://{tmp_path}/job/savepoints/a-1/")
    assert (t.kind, t.metadata_key) == ("savepoint", "savepoints/a-1/_metadata")
    t = tools.locate(str(tmp_path / "job" / "chk-7" / "_metadata"))
    assert t.metadata_key == "chk-7/_metadata"
    assert tools.locate(str(tmp_path / "job")).kind == "job"


# -- verify ------------------------------------------------------------------------------
def test_verify_passes_then_finds_each_damage(storage: Storage) -> None:
    build_job(storage)
    report = tools.verify(storage)
    assert report.ok and report.files_checked == len(refs(storage, "chk-5/_metadata"))
    files = sorted(refs(storage, "chk-5/_metadata").items())
    (k1, f1), (k2, _f2), (k3, _f3) = files[0], files[1], files[2]
    storage.write(k1, bytes(f1.size))  # same size, other content
    storage.delete_many([k2])
    storage.write(k3, b"short")
    report = tools.verify(tools.locate(storage, 5))
    assert not report.ok
    problems = {p.path: p.problem for p in report.problems}
    assert problems[k1] == "checksum mismatch"
    assert problems[k2] == "missing"
    assert problems[k3].startswith("size 5")
    sized = {p.path for p in tools.verify(storage, checksums=False).problems}
    assert sized == {k2, k3}  # without checksums, only size and presence are checked


# -- diff --------------------------------------------------------------------------------
def test_diff_added_and_removed(storage: Storage) -> None:
    build_job(storage)
    a, b = refs(storage, "chk-3/_metadata"), refs(storage, "chk-5/_metadata")
    result = tools.diff(tools.locate(storage, 3), tools.locate(storage, "chk-5"))
    assert {e.path for e in result.added} == set(b) - set(a)
    assert {e.path for e in result.removed} == set(a) - set(b)
    assert result.added_bytes == sum(b[k].size for k in set(b) - set(a)) > 0
    assert result.unchanged_files == len(set(a) & set(b)) > 0
    assert result.changed == []


# -- du ----------------------------------------------------------------------------------
def test_du_attributes_every_referenced_byte_once(storage: Storage) -> None:
    job = build_job(storage)
    storage.write("shared/e1-c1-orphan", b"x" * 33)
    result = tools.du(storage)
    sizes = listing(storage)
    assert result.total_bytes == sum(sizes.values()) == sum(result.by_scope.values())
    holders = retained_keys(storage) + ["savepoints/sp/_metadata"]
    referenced: set[str] = set()
    for key in holders:
        referenced |= set(refs(storage, key)) | {k for k in sizes
                                                 if k.startswith(key.rsplit("/", 1)[0] + "/")}
    assert result.referenced_bytes == sum(sizes[k] for k in referenced)
    assert sum(c.attributed_bytes for c in result.by_checkpoint) == result.referenced_bytes
    assert "shared/e1-c1-orphan" in result.unreferenced_sample
    assert "chk-99/_metadata" in result.unreferenced_sample
    unreferenced = {k for k in sizes if k not in referenced
                    and layout.parse(k).kind not in (layout.Kind.HA, layout.Kind.JOB,
                                                     layout.Kind.SPARK, layout.Kind.TASKOWNED)}
    assert result.unreferenced_bytes == sum(sizes[k] for k in unreferenced)
    # a file referenced by exactly one holder is that holder's exclusive bytes
    c5 = next(c for c in result.by_checkpoint if c.checkpoint_id == 5)
    only5 = set(refs(storage, "chk-5/_metadata")) - set().union(
        *(refs(storage, k) for k in holders if k != "chk-5/_metadata"))
    assert c5.exclusive_bytes == sum(sizes[k] for k in only5) + sizes["chk-5/_metadata"]
    assert c5.referenced_bytes == sum(f.size for f in refs(storage, "chk-5/_metadata").values())
    del job


# -- export ------------------------------------------------------------------------------
def assert_exported(dest: Storage, checkpoint_id: int, source_refs: dict[str, StateFile]) -> None:
    key = layout.checkpoint_metadata_key(checkpoint_id)
    assert retained_keys(dest) == [key]
    assert tools.verify(dest).ok
    exported = refs(dest, key)
    assert sorted(f.checksum for f in exported.values()) == sorted(
        f.checksum for f in source_refs.values())
    files = set(listing(dest))
    # export now records the destination's HA store (embedded) in _job/owner.json
    assert {k for k in files if not k.startswith("_ha/")} == set(exported) | {key, OWNER_KEY}
    owner = read_owner(dest)
    assert owner is not None and (owner.job_id, owner.ha) == ("job-1", "embedded")


def test_export_is_minimal_and_restores(storage: Storage, storage_factory) -> None:  # type: ignore[no-untyped-def]
    job = build_job(storage)
    before = listing(storage)
    dest = storage_factory()
    report = tools.export(tools.locate(storage, 4), dest)
    assert report.verified and report.checkpoint_id == 4
    assert listing(storage) == before  # the source is only read
    assert_exported(dest, 4, refs(storage, "chk-4/_metadata"))
    assert report.bytes_copied == sum(f.size for f in refs(dest, "chk-4/_metadata").values())
    # the exported directory restores as a job and continues
    coord = CheckpointCoordinator.start(dest, EmbeddedHAStore(dest), job_id="job-1",
                                        max_parallelism=MAX_PARALLELISM)
    assert coord.epoch > job.coord.epoch
    assert [m.checkpoint_id for _, m in coord.retained()] == [4]
    again = Job(dest, coord, [Task(dest, r, random.Random(2)) for r in RANGES])
    again.checkpoint(5)
    assert tools.verify(dest).ok
    # a savepoint exports too (its exclusive copies move to exclusive/)
    dest2 = storage_factory()
    tools.export(tools.locate(storage, "savepoints/sp"), dest2)
    assert_exported(dest2, 2, refs(storage, "savepoints/sp/_metadata"))


@pytest.mark.parametrize("direction", ["local-to-s3", "s3-to-local"])
def test_export_across_backends(direction: str, tmp_path: Path, s3_server) -> None:  # type: ignore[no-untyped-def]
    local = open_storage(str(tmp_path / "job"))
    s3 = open_storage(f"s3://{s3_server.bucket}/xb-{direction}-{random.random()}",
                      **s3_server.options)
    src, dst = (local, s3) if direction == "local-to-s3" else (s3, local)
    build_job(src)
    report = tools.export(src, dst.uri, dest_options=s3_server.options
                          if dst is s3 else None)
    assert report.verified
    assert_exported(dst, 5, refs(src, "chk-5/_metadata"))


# -- dispose -----------------------------------------------------------------------------
def all_holders_verify(storage: Storage) -> bool:
    keys = retained_keys(storage) + [
        k for k in listing(storage) if layout.parse(k).kind is layout.Kind.SAVEPOINT_METADATA]
    return all(tools.verify(tools.locate(storage, k.rsplit("/", 1)[0])).ok for k in keys)


def test_dispose_savepoint_keeps_what_retained_checkpoints_need(storage: Storage) -> None:
    build_job(storage)
    sp_files = refs(storage, "savepoints/sp/_metadata")
    needed = set().union(*(refs(storage, k) for k in retained_keys(storage)))
    report = tools.dispose(tools.locate(storage, "savepoints/sp"))
    files = listing(storage)
    assert not any(k.startswith("savepoints/") for k in files)
    assert set(sp_files) & needed <= set(files)
    assert set(report.kept) == set(sp_files) & needed
    assert not (set(sp_files) - needed) & set(files)
    assert all_holders_verify(storage)


def without_ha(files: dict[str, int]) -> dict[str, int]:
    """A listing without ``_ha/``: claiming an epoch adds documents there and prunes old
    ones (the embedded store's chain)."""
    return {k: v for k, v in files.items() if not k.startswith("_ha/")}


def test_dispose_retained_checkpoint_needs_force(storage: Storage) -> None:
    job = build_job(storage)
    before = listing(storage)
    # changed on purpose: while an attempt runs (fresh lease) a retained checkpoint is
    # refused even with --force; retention subsumes it
    for force in (False, True):
        with pytest.raises(ToolError, match="retained by the running attempt"):
            tools.dispose(tools.locate(storage, 3), force=force)
        assert listing(storage) == before
    job.coord.close()  # the attempt stops (its lease is released)
    before = listing(storage)
    with pytest.raises(ToolError, match="retained.*--force"):
        tools.dispose(tools.locate(storage, 3))
    assert listing(storage) == before
    dry = tools.dispose(tools.locate(storage, 3), force=True, dry_run=True)
    assert listing(storage) == before and dry.deleted
    report = tools.dispose(tools.locate(storage, 3), force=True)
    assert report.unpublished and report.deleted == dry.deleted
    assert retained_keys(storage) == ["chk-4/_metadata", "chk-5/_metadata"]
    # with --force it claims a new epoch before it publishes without chk-3
    assert EmbeddedHAStore(storage).read().epoch == job.coord.epoch + 1
    files = listing(storage)
    assert not any(k.startswith("chk-3/") for k in files)
    assert set(report.deleted) == set(without_ha(before)) - set(files)
    assert without_ha(files) == {k: v for k, v in without_ha(before).items()
                                 if k not in report.deleted}
    assert all_holders_verify(storage)


def test_dispose_stale_checkpoint_and_whole_job(storage: Storage) -> None:
    job = build_job(storage)
    stale = refs(storage, "chk-99/_metadata")
    before = listing(storage)
    # changed on purpose (one deletion policy): while an attempt runs, a chk-N after its
    # newest retained checkpoint may be in flight, and a whole job is refused even with
    # --force
    with pytest.raises(ToolError, match="in flight"):
        tools.dispose(tools.locate(storage, 99))
    with pytest.raises(ToolError, match="is running; stop it first"):
        tools.dispose(storage, force=True)
    assert listing(storage) == before
    job.coord.close()
    tools.dispose(tools.locate(storage, 99))
    files = listing(storage)
    assert not any(k.startswith("chk-99/") for k in files)
    assert not set(stale) - set().union(*(refs(storage, k) for k in retained_keys(storage)),
                                        refs(storage, "savepoints/sp/_metadata")) & set(files)
    assert all_holders_verify(storage)
    before = listing(storage)
    with pytest.raises(ToolError, match="--force"):
        tools.dispose(storage)
    assert listing(storage) == before
    report = tools.dispose(storage, force=True)
    # changed on purpose: the embedded HA store and its owner record stay, so the job's
    # epochs never start again below a driver that may still run (simulation, seed 10117)
    left = set(listing(storage))
    assert left and all(k.startswith("_ha/") or k == OWNER_KEY for k in left)
    assert set(report.deleted) == set(before) - left
    assert not EmbeddedHAStore(storage).read().retained


# -- bad input ---------------------------------------------------------------------------
def every_operation(target: Storage, other: Storage) -> list[tuple[str, object]]:
    return [
        ("list", lambda: tools.list_checkpoints(target)),
        ("inspect", lambda: tools.inspect(target)),
        ("verify", lambda: tools.verify(target)),
        ("diff", lambda: tools.diff(target, target)),
        ("du", lambda: tools.du(target)),
        ("export", lambda: tools.export(target, other)),
        ("dispose", lambda: tools.dispose(target, force=True)),
    ]


def test_not_a_job_directory_is_refused_by_everything(storage: Storage, storage_factory) -> None:  # type: ignore[no-untyped-def]
    storage.write("photos/cat.jpg", b"meow")
    storage.write("notes.txt", b"hello")
    other = storage_factory()
    for name, op in every_operation(storage, other):
        with pytest.raises(NotAJobDirectoryError, match="not a statehold job directory"):
            op()  # type: ignore[operator]
        assert listing(storage) == {"photos/cat.jpg": 4, "notes.txt": 5}, name
        assert listing(other) == {}, name


@pytest.mark.parametrize("damage", ["truncated", "garbage", "parent-path", "absolute-path"])
def test_bad_metadata_is_refused_quarantined_and_spared(
    storage: Storage, storage_factory, damage: str  # type: ignore[no-untyped-def]
) -> None:
    job = build_job(storage, stale=False)
    key = "chk-5/_metadata"
    needed = set().union(*(refs(storage, k) for k in retained_keys(storage)))  # undamaged
    if damage == "truncated":
        storage.write(key, storage.read(key)[:100])
    elif damage == "garbage":
        storage.write(key, b"\x00\x01not json")
    else:
        path = "../../../etc/passwd" if damage == "parent-path" else "/etc/passwd"
        rewrite_with_valid_checksum(storage, key, path)
    before = listing(storage)
    expected = "unsafe state file path" if "path" in damage else "not valid JSON"
    with pytest.raises(MetadataError, match=expected):
        tools.inspect(storage)
    report = tools.verify(storage)
    assert not report.ok and expected in report.problems[0].problem
    assert "checksum" not in report.problems[0].problem
    dest = storage_factory()
    with pytest.raises(MetadataError, match=expected):
        tools.export(storage, dest)
    assert listing(dest) == {}
    with pytest.raises(MetadataError):
        tools.diff(tools.locate(storage, 4), storage)
    assert tools.list_checkpoints(storage).problems[0].path == key
    assert listing(storage) == before
    # changed on purpose: a damaged document is quarantined (statehold.cleanup.policy), no longer
    # fatal to du or to disposing something else; its directory and every data file it
    # may name are spared, so only the savepoint's own files go
    usage = tools.du(storage)
    assert {c.path for c in usage.by_checkpoint} == {"chk-3", "chk-4", "savepoints/sp"}
    assert key not in usage.unreferenced_sample
    sp = tools.dispose(tools.locate(storage, "savepoints/sp"))
    assert set(sp.deleted) == {k for k in before if k.startswith("savepoints/sp/")}
    assert listing(storage) == {k: v for k, v in before.items()
                                if not k.startswith("savepoints/")}
    assert needed <= set(listing(storage))
    # a retained checkpoint: refused while the attempt runs, even with --force (new)
    with pytest.raises(ToolError, match="running attempt"):
        tools.dispose(tools.locate(storage, 5), force=True)
    job.coord.close()
    with pytest.raises(ToolError, match="--force"):
        tools.dispose(tools.locate(storage, 5))
    # a damaged document that is not retained is refused without --force, saying why
    storage.write("chk-99/_metadata", storage.read(key))
    with pytest.raises(ToolError, match=f"cannot dispose: .*{expected}.*--force"):
        tools.dispose(tools.locate(storage, 99))
    before = listing(storage)
    assert "chk-99/_metadata" in before
    # changed on purpose: with --force a damaged document is disposed of (its directory
    # only; the data files it may name are left to gc). chk-5 first: while it is
    # quarantined it is a retained checkpoint's document.
    gone = tools.dispose(tools.locate(storage, 5), force=True)
    assert gone.deleted == [key] and gone.unpublished
    assert retained_keys(storage) == ["chk-3/_metadata", "chk-4/_metadata"]
    gone = tools.dispose(tools.locate(storage, 99), force=True)
    assert gone.deleted == ["chk-99/_metadata"] and not gone.unpublished
    assert without_ha(listing(storage)) == {
        k: v for k, v in without_ha(before).items() if k not in ("chk-99/_metadata", key)}
    assert needed - {key} <= set(listing(storage))


def test_an_unreadable_quarantined_document_spares_data_not_other_folders(
    storage: Storage,
) -> None:
    """A document no path can be read from spares every data file, not other
    checkpoints' folders: a stale chk-N/ is still disposed of."""
    job = build_job(storage)
    job.coord.close()
    storage.write("chk-4/_metadata", b"\x00\x01not json")  # retained, quarantined
    report = tools.dispose(tools.locate(storage, 99))  # a stale folder, no attempt running
    assert "chk-99/_metadata" in report.deleted
    assert not set(report.deleted) - {k for k in report.deleted if k.startswith("chk-99/")}


def test_missing_file_fails_verify_and_export_refuses(storage: Storage, storage_factory) -> None:  # type: ignore[no-untyped-def]
    build_job(storage)
    gone = sorted(refs(storage, "chk-5/_metadata"))[0]
    storage.delete_many([gone])
    before = listing(storage)
    report = tools.verify(storage)
    assert [(p.path, p.problem) for p in report.problems] == [(gone, "missing")]
    dest = storage_factory()
    with pytest.raises(ToolError, match="missing") as info:
        tools.export(storage, dest)
    assert info.value.problems[0].path == gone
    assert listing(dest) == {}
    assert listing(storage) == before


def test_export_refuses_a_non_empty_destination(storage: Storage, storage_factory) -> None:  # type: ignore[no-untyped-def]
    build_job(storage)
    dest = storage_factory()
    dest.write("keep.txt", b"mine")
    with pytest.raises(ToolError, match="not empty"):
        tools.export(storage, dest)
    assert listing(dest) == {"keep.txt": 4}
