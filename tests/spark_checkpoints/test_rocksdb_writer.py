"""`rocksdb_writer`, the RocksDB snapshot a repartition or transform writes: a version's rows
from several writers (`VersionRuns`, one per source partition) whatever order they arrive
in (runs of increasing keys written as SSTs, keys out of order staged and put), built by
`build_version` into the zip and SSTs, read back the way Spark's load does (the zip's
files and each SST under its local name, opened by RocksDB with its checks), and as few
SSTs as the runs allow: many runs are compacted into one level rather than left in level 0.
Spark loading what the writer wrote: test_spark_repartition_live.py."""

from __future__ import annotations

import json
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from rocksdict import AccessType, Options, Rdict

from statehold.spark_checkpoints import SparkCheckpointError
from statehold.spark_checkpoints.rocksdb_writer import (
    MAX_LEVEL0_RUNS,
    BuiltVersion,
    VersionRuns,
    build_version,
)


def _loaded(built: BuiltVersion, into: Path) -> dict[bytes, bytes]:
    """The version as Spark loads it: the zip unpacked, each SST copied under its local
    name, RocksDB opened read-only with every table file checked at open."""
    into.mkdir()
    with zipfile.ZipFile(built.zip_path) as archive:
        archive.extractall(into)
        meta = json.loads(archive.read("metadata").decode().partition("\n")[2])
    listed = sorted(f["localFileName"] for f in meta["sstFiles"])
    assert listed == sorted(s.local for s in built.ssts)
    assert meta["numKeys"] == built.rows
    for sst in built.ssts:
        shutil.copyfile(sst.path, into / sst.local)
        assert sst.path.stat().st_size == sst.size
    (into / "metadata").unlink()
    options = Options(raw_mode=True)
    options.set_paranoid_checks(True)
    options.set_max_open_files(-1)
    db = Rdict(str(into), options=options, access_type=AccessType.read_only())
    try:
        return {bytes(k): bytes(v) for k, v in db.items()}
    finally:
        db.close()


@pytest.mark.parametrize("batched", [False, True])
def test_runs_and_keys_out_of_order_all_load(tmp_path: Path, batched: bool) -> None:
    """Two writers, one with two runs (the second restarting below the first's end) and
    keys out of order inside a run: every row loads with its value; the three runs are
    three SSTs, the staged keys a fourth. Added a batch at a time (`add_batch`: a batch
    in order after the run's last key goes in at once, any other one by one), the same."""
    rows = VersionRuns(tmp_path / "v", "from-0", format_version=5)
    expected: dict[bytes, bytes] = {}

    def add(writer: VersionRuns, batches: list[list[bytes]], value: Callable[[bytes], bytes]
            ) -> None:
        for keys in batches:
            expected.update((k, value(k)) for k in keys)
            if batched:
                writer.add_batch(keys, [value(k) for k in keys])
            else:
                for key in keys:
                    writer.add(key, value(key))

    add(rows, [[b"\x00a", b"\x00c"], [b"\x00e"], [b"\x00b", b"\x00d"]],  # b, d out of order
        lambda key: key * 3)
    rows.end_run()
    add(rows, [[b"\x00aa", b"\x00cc"], [b"\x00f"]], lambda key: b"v" + key)
    rows.close()
    other = VersionRuns(tmp_path / "v", "from-1", format_version=5)
    add(other, [[b"\x00ab", b"\x00g"]], lambda key: b"1")
    other.close()
    built = build_version(tmp_path / "v", rows=rows.rows + other.rows, format_version=5,
                          metadata_extra={})
    assert built.rows == len(expected) == 10
    assert _loaded(built, tmp_path / "loaded") == expected
    assert len(built.ssts) == 4  # the three runs as they were ingested, the staged keys flushed


def test_more_runs_than_level0_holds_are_compacted(tmp_path: Path) -> None:
    """Beyond RocksDB's level-0 slowdown trigger the runs are compacted: one SST, not one per
    run, and every row still there."""
    rows = VersionRuns(tmp_path / "v", "from-0", format_version=5)
    expected = {}
    runs = MAX_LEVEL0_RUNS + 5
    for run in range(runs):
        for i in range(run, 500, runs):  # each run spans the whole key range
            key = b"\x00" + i.to_bytes(4, "big")
            rows.add(key, b"%d" % i)
            expected[key] = b"%d" % i
        rows.end_run()
    rows.close()
    built = build_version(tmp_path / "v", rows=len(expected), format_version=5,
                          metadata_extra={})
    assert len(built.ssts) == 1
    assert _loaded(built, tmp_path / "loaded") == expected


def test_one_sorted_run_is_one_sst(tmp_path: Path) -> None:
    rows = VersionRuns(tmp_path / "v", "from-0", format_version=4)
    for i in range(1000):
        rows.add(b"\x00" + i.to_bytes(4, "big"), bytes(100))
    rows.close()
    built = build_version(tmp_path / "v", rows=rows.rows, format_version=4,
                          metadata_extra={"numInternalKeys": 0})
    assert len(built.ssts) == 1
    assert len(_loaded(built, tmp_path / "loaded")) == 1000
    with zipfile.ZipFile(built.zip_path) as archive:
        assert json.loads(archive.read("metadata").decode()[3:])["numInternalKeys"] == 0


def test_a_table_format_rocksdb_8_cannot_read_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SparkCheckpointError, match="table format version 6"):
        VersionRuns(tmp_path / "v", "from-0", format_version=6)
    assert not (tmp_path / "v").exists()
