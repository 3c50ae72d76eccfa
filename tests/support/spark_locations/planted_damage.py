"""Damage planted in copies of the committed Spark checkpoint fixtures
(tests/fixtures/spark/), one function per kind of damage Spark fails to load (the
acceptance list of `verify --deep` and `repair`): each plants it in the location at `root`,
given what a restart at the newest batch needs, and says which file `verify --deep` must
name, with its kind and Spark bug; None where the location has nothing to plant it in.
Shared by the tests of `verify --deep` and of `repair`."""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import lz4.block

from statehold.spark_checkpoints.api import SparkCheckpointLocation
from statehold.spark_checkpoints.stores import Needs
from tests.support.spark_locations.committed_fixtures import manifests


def needs_of(location: SparkCheckpointLocation) -> list[Needs]:
    """Each store's needs for a restart at the newest committed batch."""
    found = location.scan()
    assert found.newest_committed is not None
    needs = location.restart_needs(found, found.newest_committed)
    assert needs.ok, needs.problems
    return needs.stores


def queries(version: str, provider: str) -> list[str]:
    return [q["query"] for q in manifests()[version]["locations"] if q["provider"] == provider]


@dataclass
class Damage:
    """A damage planted: the file verify --deep must name, its kind, the Spark bug."""

    path: str
    kind: str
    bug: str | None = None


def _sst_pairs(root: Path, needs: list[Needs], same: bool) -> tuple[str, str] | None:
    """A needed SST and another SST of the location, of the same size (`same`) or not,
    whose bytes differ."""
    every = sorted(p for p in root.glob("state/**/SSTs/*.sst"))
    for store in needs:
        for key in store.files:
            if not key.endswith(".sst"):
                continue
            mine = (root / key).read_bytes()
            for other in every:
                data = other.read_bytes()
                if (len(data) == len(mine)) == same and data != mine:
                    return key, str(other.relative_to(root))
    return None


def sst_of_the_same_size(root: Path, needs: list[Needs]) -> Damage | None:
    """SPARK-43404: another SST's bytes under a needed SST's name, of the same size (so
    only the MANIFEST's unique id can tell)."""
    pair = _sst_pairs(root, needs, same=True)
    if pair is None:
        return None
    key, other = pair
    (root / key).write_bytes((root / other).read_bytes())
    return Damage(key, "sst-unique-id-mismatch", "SPARK-43404")


def sst_of_the_wrong_size(root: Path, needs: list[Needs]) -> Damage | None:
    """SPARK-51717: another SST, of another size, under a needed SST's name."""
    pair = _sst_pairs(root, needs, same=False)
    if pair is None:
        return None
    key, other = pair
    (root / key).write_bytes((root / other).read_bytes())
    return Damage(key, "sst-size-mismatch", "SPARK-51717")


def _own_zip(needs: list[Needs]) -> str | None:
    for store in needs:
        if store.how == "snapshot":
            return next(k for k in store.files if k.endswith(".zip"))
    return None


def zip_cut_short(root: Path, needs: list[Needs]) -> Damage | None:
    key = _own_zip(needs)
    if key is None:
        return None
    data = (root / key).read_bytes()
    (root / key).write_bytes(data[: len(data) // 2])
    return Damage(key, "zip-cut-short")


def zip_deleted(root: Path, needs: list[Needs]) -> Damage | None:
    key = _own_zip(needs)
    if key is None:
        return None
    (root / key).unlink()
    return Damage(key, "zip-missing")


def _chains(needs: list[Needs], ext: str) -> list[tuple[Needs, list[str]]]:
    return [(s, [k for k in s.files if k.endswith(ext)]) for s in needs]


def changelog_deleted_from_the_middle(root: Path, needs: list[Needs]) -> Damage | None:
    """A changelog with changelogs after it and a snapshot or changelogs before it."""
    for store, chain in _chains(needs, ".changelog"):
        if len(chain) >= 2 and (store.base or len(chain) >= 3):
            key = chain[-2]
            (root / key).unlink()
            return Damage(key, "changelog-missing")
    return None


def newest_changelog_cut_short(root: Path, needs: list[Needs]) -> Damage | None:
    for _store, chain in _chains(needs, ".changelog"):
        if chain:
            data = (root / chain[-1]).read_bytes()
            (root / chain[-1]).write_bytes(data[: len(data) // 2])
            return Damage(chain[-1], "changelog-cut-short")
    return None


def delta_deleted(root: Path, needs: list[Needs]) -> Damage | None:
    for _store, chain in _chains(needs, ".delta"):
        if len(chain) >= 2:
            (root / chain[0]).unlink()
            return Damage(chain[0], "delta-missing")
    return None


def hdfs_snapshot_corrupted(root: Path, needs: list[Needs]) -> Damage | None:
    """One byte of the snapshot's first compressed block changed (its length and the
    stream's framing left alone: only decompressing and lz4-java's checksum can tell)."""
    for store in needs:
        for key in store.files:
            if key.endswith(".snapshot"):
                data = bytearray((root / key).read_bytes())
                compressed = int.from_bytes(data[9:13], "little")
                data[21 + compressed // 2] ^= 0x5A
                (root / key).write_bytes(bytes(data))
                return Damage(key, "snapshot-corrupt")
    return None


def hdfs_snapshot_bit_rot(root: Path, needs: list[Needs]) -> Damage | None:
    """One bit of the snapshot's last value changed and the block compressed again under
    its old checksum: the stream is well formed and every record decodes, so only
    lz4-java's checksum (which Spark's load checks) can tell."""
    for store in needs:
        for key in store.files:
            if key.endswith(".snapshot"):
                data = (root / key).read_bytes()
                token, size, raw_size, check = struct.unpack_from("<Biii", data, 8)
                body = data[21 : 21 + size]
                raw = bytearray(body if token & 0xF0 == 0x10 else
                                lz4.block.decompress(body, uncompressed_size=raw_size))
                raw[-5] ^= 0x01  # before the records' end (-1, four bytes)
                again = lz4.block.compress(bytes(raw), store_size=False)
                header = b"LZ4Block" + struct.pack("<Biii", 0x20 | (token & 0x0F), len(again),
                                                   raw_size, check)
                (root / key).write_bytes(header + again + data[21 + size :])
                return Damage(key, "snapshot-corrupt")
    return None


def version_missing(root: Path, needs: list[Needs]) -> Damage | None:
    """Every file of the version the newest batch wrote, of one store, deleted: commits/N
    is there, version N+1 is not."""
    for store in needs:
        own = [k for k in store.files if k.endswith((".delta", ".snapshot", ".changelog", ".zip"))
               and k.rsplit("/", 1)[1].split(".")[0].split("_")[0] == str(store.version)]
        if not own:
            continue
        stem = own[0].rsplit(".", 1)[0]
        hdfs = own[0].endswith((".delta", ".snapshot"))
        for path in root.glob(f"{stem}.*"):
            path.unlink()
        return Damage(f"{stem}.{'delta' if hdfs else 'changelog'}", "version-missing")
    return None


Plant = Callable[[Path, list[Needs]], Damage | None]
#: Each damage, with the layouts it is planted on and the queries tried in turn.
CASES: list[tuple[str, Plant, str, list[str]]] = [
    ("sst-same-size", sst_of_the_same_size, "rocksdb", ["join", "multi", "dedup"]),
    ("sst-same-size", sst_of_the_same_size, "rocksdb_changelog", ["join", "multi"]),
    ("sst-wrong-size", sst_of_the_wrong_size, "rocksdb", ["window"]),
    ("zip-cut-short", zip_cut_short, "rocksdb", ["window"]),
    ("zip-deleted", zip_deleted, "rocksdb", ["window"]),
    ("changelog-deleted", changelog_deleted_from_the_middle, "rocksdb_changelog",
     ["join", "window", "dedup", "multi"]),
    ("changelog-deleted", changelog_deleted_from_the_middle, "rocksdb_v2",
     ["join", "window", "dedup", "multi"]),
    ("changelog-cut-short", newest_changelog_cut_short, "rocksdb_changelog",
     ["window", "join"]),
    ("changelog-cut-short", newest_changelog_cut_short, "rocksdb_v2", ["window", "join"]),
    ("delta-deleted", delta_deleted, "hdfs", ["window", "join", "dedup"]),
    ("hdfs-snapshot-corrupt", hdfs_snapshot_corrupted, "hdfs", ["window", "join", "dedup"]),
    ("hdfs-snapshot-bit-rot", hdfs_snapshot_bit_rot, "hdfs", ["window", "join", "dedup"]),
    ("version-missing", version_missing, "hdfs", ["window"]),
    ("version-missing", version_missing, "rocksdb_changelog", ["window", "join"]),
    ("version-missing", version_missing, "rocksdb_v2", ["window", "join"]),
]
