"""gc beside Spark 4's reuse of uploaded SSTs (RocksDB's file mapping), Spark-free.

A RocksDB instance lists again in its next zip SSTs uploaded long ago, but only SSTs of
the zip it last loaded or finished uploading: a snapshot's new files are not reused until
its zip is written, a load keeps only the loaded zip's files in the mapping, and every
snapshot drops files no longer on local disk. That zip is the base every retained version
of the instance's lineage resolves to, so gc keeps what the instance may reuse however old
it is; the grace only has to cover the instance's own upload of new SSTs before its zip.
Here, on a hand-made location with changelog checkpointing: the zip at version 2 lists
SSTs A and B; the instance's snapshot of version 8 reuses A (B is compacted away) and
uploads N, then its zip. gc before and after that zip keeps A throughout.
"""

from __future__ import annotations

from pathlib import Path

from statehold.spark_checkpoints import open_spark_checkpoint
from tests.support.spark_locations.disk_trees import TWO_HOURS, backdate
from tests.support.spark_locations.handmade_files import (
    logs,
    lz4_stream,
    records,
    snapshot_zip,
    sst_name,
    write,
)

STORE = "state/0/0"


def test_an_old_sst_the_newest_zip_will_list_again_is_kept(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    logs(root, range(5, 10))  # Spark kept batches 5-9: versions 6-10
    for v in range(1, 11):
        write(root, f"{STORE}/{v}.changelog", lz4_stream(records([(b"k%d" % v, b"v")])))
    a, b, orphan, new = sst_name(21), sst_name(23), sst_name(25), sst_name(81)
    for name, size in ((a, 100), (b, 101), (orphan, 102)):
        write(root, f"{STORE}/SSTs/{name}", b"s" * size)
    write(root, f"{STORE}/2.zip", snapshot_zip({a: 100, b: 101}))
    backdate(root, TWO_HOURS)  # A uploaded for version 2, two hours ago
    # the snapshot of version 8 is being uploaded: its new SST is there, its zip is not
    write(root, f"{STORE}/SSTs/{new}", b"s" * 103)
    location = open_spark_checkpoint(str(root))

    report = location.gc(grace_seconds=60)
    left = {p.name for p in (root / STORE / "SSTs").iterdir()}
    assert left == {a, b, new}, report  # zip 2 is every retained version's base
    assert (root / STORE / "2.zip").exists()

    # the zip of version 8 lists A again; Spark's retention drops batches 5 and 6: version 8
    # is the oldest it keeps; an hour on
    write(root, f"{STORE}/8.zip", snapshot_zip({a: 100, new: 103}))
    for batch in (5, 6):
        (root / "offsets" / str(batch)).unlink()
        (root / "commits" / str(batch)).unlink()
    (root / "commits" / "7").unlink()
    backdate(root, TWO_HOURS)
    report = location.gc(grace_seconds=60)
    left = {p.name for p in (root / STORE / "SSTs").iterdir()}
    assert left == {a, new}, report  # B only zip 2 listed; A is zip 8's now
    assert not (root / STORE / "2.zip").exists() and (root / STORE / "8.zip").exists()
    for batch in (8, 9):
        needs = location.restart_needs(location.scan(), batch)
        assert needs.ok and f"{STORE}/SSTs/{a}" in needs.files, needs.problems
