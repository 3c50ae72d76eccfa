"""`version_changes.VersionChanges`, the keys a version's deltas or changelogs touch: the
newest record wins and a delete hides the key, whether the changes stay in memory or
spill to a temporary RocksDB past their bound; the survivors come in key order where
asked. Then the offline read and a repartition of committed fixtures with the bound
lowered so every version's changes spill: the same rows as in memory."""

from __future__ import annotations

import collections
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from statehold.spark_checkpoints import open_spark_checkpoint
from statehold.spark_checkpoints import version_changes as module
from statehold.spark_checkpoints.state_reader import store_records
from statehold.spark_checkpoints.version_changes import VersionChanges
from tests.support.spark_locations.committed_fixtures import fixture


def _replayed(tmp_path: Path, limit: int, files: list[list[tuple[bytes, bytes | None]]]
              ) -> tuple[bool, dict[bytes, bytes], list[bytes]]:
    changes = VersionChanges(tmp_path, limit=limit)
    try:
        for records in files:  # in batches of 50, as a reader hands them on
            changes.update(([k for k, _v in records[at : at + 50]],
                            [v for _k, v in records[at : at + 50]])
                           for at in range(0, len(records), 50))
        survivors = [(k, v) for keys, values in changes.survivors(in_key_order=True)
                     for k, v in zip(keys, values, strict=True)]
        absent = [k for k in (b"gone", b"never") if k in changes]
        return changes.spilled, dict(survivors), [k for k, _v in survivors] + absent
    finally:
        changes.close()


def test_newest_wins_and_deletes_hide_in_memory_and_spilled(tmp_path: Path) -> None:
    rng = random.Random(7)
    keys = [b"k%04d" % i for i in range(400)]
    files = [[(k, None if rng.random() < 0.2 else b"v%d-%s" % (f, k))
              for k in rng.sample(keys, 200)] for f in range(5)]
    files[-1].append((b"gone", None))
    expected: dict[bytes, bytes | None] = {}
    for records in files:
        expected.update(records)
    survivors = {k: v for k, v in expected.items() if v is not None}

    held = _replayed(tmp_path / "held", 1 << 30, files)
    spilled = _replayed(tmp_path / "spilled", 2_000, files)

    assert held[0] is False and spilled[0] is True
    for _spilled, got, order in (held, spilled):
        assert got == survivors
        names = [k for k in order if k in survivors]
        assert names == sorted(survivors)  # in key order
        # a deleted key and one never written are both "changed" only if touched
        assert order[len(survivors):] == [b"gone"]


@pytest.mark.parametrize(("version", "query", "provider"), [
    ("4.3.0", "window", "rocksdb_changelog"), ("4.3.0", "join", "rocksdb_changelog"),
    ("4.3.0", "window", "hdfs"), ("3.5.9", "dedup", "rocksdb_changelog"),
])
def test_spilled_changes_read_and_repartition_as_held_ones(
    extracted: Callable[[str], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    version: str, query: str, provider: str,
) -> None:
    """The batch before the last: its versions need a snapshot and deltas or changelogs
    after it (or changelogs alone)."""
    fx = fixture(extracted(version), version, query, provider)
    location = open_spark_checkpoint(str(fx.checkpoint))
    batch = fx.last_batch - 1

    def records(where: Any, at: int) -> collections.Counter[tuple[str, bytes, bytes]]:
        found = where.scan()
        return collections.Counter((str(sid), k, v) for sid in sorted(found.stores)
                                   for k, v in store_records(where, found, sid, at))

    spills: list[bool] = []
    real = VersionChanges.close

    def noted(self: VersionChanges) -> None:
        spills.append(self.spilled)
        real(self)

    monkeypatch.setattr(VersionChanges, "close", noted)
    held = records(location, batch)
    location.repartition(str(tmp_path / "held"), partitions=3, batch=batch)
    assert held and spills and not any(spills)
    monkeypatch.setattr(module, "IN_MEMORY_BYTES", 1)
    spills.clear()

    spilled = records(location, batch)
    location.repartition(str(tmp_path / "spilled"), partitions=3, batch=batch)

    assert any(spills), "no version's changes spilled"
    assert spilled == held
    assert records(open_spark_checkpoint(str(tmp_path / "spilled")), batch) == records(
        open_spark_checkpoint(str(tmp_path / "held")), batch)


@pytest.mark.parametrize(("version", "query", "provider"), [
    ("4.3.0", "window", "rocksdb_changelog"), ("4.3.0", "join", "rocksdb_changelog"),
    ("4.3.0", "dedup", "rocksdb_v2"), ("3.5.9", "dedup", "rocksdb_changelog"),
])
def test_a_repartition_from_runs_of_changes_writes_what_held_changes_write(
    extracted: Callable[[str], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    version: str, query: str, provider: str,
) -> None:
    """With `repartition.RUN_BYTES` at one byte, every batch of a source partition's
    changes goes to the new partitions as a run of its own after the snapshot (deletes as
    tombstones, a later run replacing a key): DEST holds the records of the repartition
    with the changes held, and each zip's ``numKeys`` is its RocksDB's count."""
    from statehold.spark_checkpoints import repartition, rocksdb_writer
    from statehold.spark_checkpoints.state_files import read_zip_metadata

    fx = fixture(extracted(version), version, query, provider)
    location = open_spark_checkpoint(str(fx.checkpoint))
    batch = fx.last_batch - 1

    def records(where: Any) -> collections.Counter[tuple[str, bytes, bytes]]:
        found = where.scan()
        return collections.Counter((str(sid), k, v) for sid in sorted(found.stores)
                                   for k, v in store_records(where, found, sid, batch))

    location.repartition(str(tmp_path / "held"), partitions=3, batch=batch)
    deletes: list[bytes] = []
    add = rocksdb_writer.VersionRuns.add

    def noted(self: rocksdb_writer.VersionRuns, key: bytes, value: bytes | None) -> None:
        if value is None:
            deletes.append(key)
        add(self, key, value)

    monkeypatch.setattr(rocksdb_writer.VersionRuns, "add", noted)
    monkeypatch.setattr(repartition, "RUN_BYTES", 1)
    location.repartition(str(tmp_path / "runs"), partitions=3, batch=batch)

    runs = open_spark_checkpoint(str(tmp_path / "runs"))
    assert len(list((tmp_path / "runs").rglob("*.sst"))) > len(
        list((tmp_path / "held").rglob("*.sst"))), "no partition was written in runs"
    assert deletes or query == "dedup", "no delete went to the runs"
    assert records(runs) == records(open_spark_checkpoint(str(tmp_path / "held")))
    found = runs.scan()
    per_store = records(runs)
    for zip_path in (tmp_path / "runs").rglob(f"{batch + 1}*.zip"):
        meta = read_zip_metadata(zip_path.read_bytes(), str(zip_path))
        where = zip_path.parent.relative_to(tmp_path / "runs").as_posix()
        sid = next(s for s in found.stores if s.prefix == where)
        rows = sum(n for (name, _k, _v), n in per_store.items() if name == str(sid))
        assert meta.numKeys == rows, zip_path
