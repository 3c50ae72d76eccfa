"""Restore modes and relocation with real keyed state (RocksDB backend, no Spark)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from statehold import tools
from statehold.checkpoint.restore import RestoreError, restore_into
from statehold.format import layout
from statehold.format.metadata import (
    CheckpointMetadata,
    RestoreMode,
    read_metadata,
    referenced_keys,
)
from statehold.ha.embedded import EmbeddedHAStore
from statehold.storage import LocalStorage, Storage, open_storage
from tests.support.infra.object_store_servers import S3Server
from tests.support.minipipeline import MiniPipeline, make_batch, reference


def contents(storage: Storage) -> dict[str, bytes]:
    return {info.key: storage.read(info.key) for info in storage.list()}


def build_source(storage: Storage, local: Path, batches: int = 3,
                 changelog: bool = False) -> list[dict[str, list[int]]]:
    pipeline = MiniPipeline(storage, local / "src", job_id="source", changelog=changelog)
    inputs = [make_batch(b) for b in range(batches)]
    for batch in inputs:
        pipeline.run_batch(batch)
    pipeline.close()
    return inputs


def latest_metadata_key(storage: Storage) -> str:
    state = EmbeddedHAStore(storage).read()
    assert state.latest is not None
    return state.latest.metadata


def assert_self_contained(job: Storage) -> None:
    report = tools.verify(job)
    assert report.ok, report.problems
    for metadata_key in [p.metadata for p in EmbeddedHAStore(job).read().retained]:
        meta = read_metadata(job, metadata_key)
        assert all(not f.external for _op, _kg, f in meta.state_files())


@pytest.fixture
def two_roots(storage_factory) -> tuple[Storage, Storage]:  # type: ignore[no-untyped-def]
    return storage_factory(), storage_factory()


@pytest.mark.parametrize("changelog", [False, True], ids=["snapshots", "changelog"])
def test_no_claim_never_touches_the_source_and_outlives_it(
    two_roots: tuple[Storage, Storage], tmp_path: Path, changelog: bool
) -> None:
    source, target = two_roots
    inputs = build_source(source, tmp_path, changelog=changelog)
    if changelog:  # the restored checkpoint names changelogs
        meta = read_metadata(source, latest_metadata_key(source))
        assert any((f.name or "").startswith("changelog-") for _o, _k, f in meta.state_files())
    source_key = latest_metadata_key(source)
    before = contents(source)

    report = restore_into(source, source_key, target, EmbeddedHAStore(target),
                          job_id="copy", mode=RestoreMode.NO_CLAIM)
    assert report.files > 0 and not report.skipped
    assert contents(source) == before  # never modified
    if isinstance(source, LocalStorage) and isinstance(target, LocalStorage):
        shared = [k for k in before if k.startswith("shared/")]
        assert all(os.stat(target.root / k).st_nlink >= 2 for k in shared)  # hard links

    pipeline = MiniPipeline(target, tmp_path / "dst", job_id="copy", changelog=changelog)
    meta = pipeline.coord.latest()
    assert meta is not None and meta[1].lineage is not None
    assert meta[1].lineage.mode is RestoreMode.NO_CLAIM and not meta[1].lineage.source_needed
    more = [make_batch(b, seed=1) for b in range(2)]
    pipeline.run_batch(more[0])
    # the first checkpoint after the restore is complete: the source can go entirely
    source.delete_prefix("")
    assert not list(source.list())
    pipeline.run_batch(more[1])
    assert pipeline.state() == reference(inputs + more)
    pipeline.close()
    assert_self_contained(target)


@pytest.mark.parametrize("changelog", [False, True], ids=["snapshots", "changelog"])
def test_claim_moves_the_files_and_the_new_job_owns_them(
    two_roots: tuple[Storage, Storage], tmp_path: Path, changelog: bool
) -> None:
    source, target = two_roots
    inputs = build_source(source, tmp_path, changelog=changelog)
    source_key = latest_metadata_key(source)
    moved = set(referenced_keys(read_metadata(source, source_key), source_key))

    restore_into(source, source_key, target, EmbeddedHAStore(target),
                 job_id="claimed", mode=RestoreMode.CLAIM)
    assert not moved & {info.key for info in source.list()}
    assert_self_contained(target)

    pipeline = MiniPipeline(target, tmp_path / "dst", job_id="claimed", retain=1,
                            changelog=changelog)
    more = [make_batch(b, seed=2) for b in range(3)]
    for batch in more:
        pipeline.run_batch(batch)
    assert pipeline.state() == reference(inputs + more)
    pipeline.close()
    # the new job discarded the claimed files it no longer needs
    assert_self_contained(target)
    left = {info.key for info in target.list()}
    meta, key = _latest(target)
    needed = set(referenced_keys(meta, key))
    assert {k for k in left if k.startswith(("shared/", "exclusive/"))} == needed


def _latest(job: Storage) -> tuple[CheckpointMetadata, str]:
    key = latest_metadata_key(job)
    return read_metadata(job, key), key


def test_restore_is_idempotent_and_refuses_bad_requests(
    two_roots: tuple[Storage, Storage], tmp_path: Path
) -> None:
    source, target = two_roots
    build_source(source, tmp_path, batches=2)
    source_key = latest_metadata_key(source)
    with pytest.raises(RestoreError, match="new job directory"):
        restore_into(source, source_key, source, EmbeddedHAStore(source), job_id="x",
                     mode=RestoreMode.NO_CLAIM)
    first = restore_into(source, source_key, target, EmbeddedHAStore(target), job_id="x",
                         mode=RestoreMode.NO_CLAIM)
    again = restore_into(source, source_key, target, EmbeddedHAStore(target), job_id="x",
                         mode=RestoreMode.NO_CLAIM)
    assert again.skipped and again.checkpoint_id == first.checkpoint_id


def test_restore_of_a_source_with_a_missing_file_fails_clearly(
    two_roots: tuple[Storage, Storage], tmp_path: Path
) -> None:
    source, target = two_roots
    build_source(source, tmp_path, batches=2)
    source_key = latest_metadata_key(source)
    victim = sorted(referenced_keys(read_metadata(source, source_key), source_key))[0]
    source.delete_many([victim])
    with pytest.raises(RestoreError, match="missing"):
        restore_into(source, source_key, target, EmbeddedHAStore(target), job_id="x",
                     mode=RestoreMode.NO_CLAIM)
    assert EmbeddedHAStore(target).read().retained == ()  # nothing was published


def copy_tree(src: Storage, dst: Storage) -> None:
    """What `aws s3 sync` or `cp -r` does: copy every file, knowing nothing of statehold."""
    for info in src.list():
        src.copy(info.key, info.key, target=dst)


@pytest.mark.parametrize("route", ["local-local", "local-s3", "s3-local"])
def test_a_copied_job_directory_resumes_with_exact_results(
    route: str, tmp_path: Path, s3_server: S3Server
) -> None:
    def root(kind: str, name: str) -> Storage:
        if kind == "local":
            return LocalStorage(tmp_path / name)
        return open_storage(f"s3://{s3_server.bucket}/reloc-{route}-{name}", **s3_server.options)

    src_kind, dst_kind = route.split("-")
    source = root(src_kind, "a")
    inputs = build_source(source, tmp_path, batches=3)
    if route == "local-local":
        assert isinstance(source, LocalStorage)
        shutil.copytree(source.root, tmp_path / "b")  # plain `cp -r`
        copy = root("local", "b")
    else:
        copy = root(dst_kind, "b")
        copy_tree(source, copy)
    source.delete_prefix("")  # the original is gone: the copy must stand alone

    pipeline = MiniPipeline(copy, tmp_path / "fresh-local", job_id="source")
    more = [make_batch(b, seed=3) for b in range(2)]
    for batch in more:
        pipeline.run_batch(batch)
    assert pipeline.state() == reference(inputs + more)
    pipeline.close()
    assert_self_contained(copy)
    assert layout.parse(latest_metadata_key(copy)).checkpoint_id == 4


@pytest.mark.parametrize("mode", [RestoreMode.NO_CLAIM, RestoreMode.CLAIM])
def test_a_damaged_source_file_is_refused_before_anything_is_published(
    two_roots: tuple[Storage, Storage], tmp_path: Path, mode: RestoreMode
) -> None:
    """Size and checksum are checked before the new job publishes the checkpoint: a
    source file with the right size and the wrong bytes stops the restore."""
    source, target = two_roots
    build_source(source, tmp_path)
    source_key = latest_metadata_key(source)
    victim = next(k for k in referenced_keys(read_metadata(source, source_key), source_key)
                  if k.startswith("shared/"))
    data = source.read(victim)
    source.write(victim, bytes([data[0] ^ 0xFF]) + data[1:])  # same size, other bytes

    with pytest.raises(RestoreError, match="does not match the source checkpoint"):
        restore_into(source, source_key, target, EmbeddedHAStore(target),
                     job_id="copy", mode=mode)
    assert EmbeddedHAStore(target).read().retained == ()  # nothing published
    assert not any(layout.parse(i.key).kind is layout.Kind.CHECKPOINT_METADATA
                   for i in target.list())
