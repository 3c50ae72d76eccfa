"""The committed Spark checkpoint fixtures (``tests/fixtures/spark/``): locations written by
real Spark, one archive per supported PySpark, for the tests that read, verify, collect,
savepoint, roll back and relocate Spark's formats without starting that Spark.

``tests/fixtures/spark/pyspark-<version>.tar.gz`` holds, per query and state store layout
of tests.support.spark_locations.queries that this PySpark runs, ``<query>-<provider>/ckpt``
(the checkpoint location as the stopped query left it) and ``<query>-<provider>/output``
(the rows its sink wrote, ``batch-N.json``). ``pyspark-<version>.json`` beside it is the
manifest: which PySpark, Java and settings wrote each location, its input folder as the
source log records it, its last batch, and its `shape` (the files' names and kinds), which
``tests/fixtures/spark/make.py --check`` compares with what this Spark writes today.

Nothing here starts Spark: the tests of the fixtures run without a JVM.
"""

from __future__ import annotations

import json
import os
import re
import tarfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from statehold.spark_checkpoints.layout import Kind, parse
from tests.support.paths import TESTS
from tests.support.spark_locations.disk_trees import TWO_HOURS

FIXTURES = TESTS / "fixtures" / "spark"
#: The input files each query read (one per batch).
FILES = 5
#: Kinds whose files Spark's maintenance thread writes when it runs (HDFS snapshots; zips,
#: and the SST files they list, with changelogs on): present or not depending on timing,
#: so `differences` does not count them. Every other kind a batch's commit writes.
MAINTENANCE = {
    "hdfs": {Kind.HDFS_SNAPSHOT},
    "rocksdb": set(),
    "rocksdb_changelog": {Kind.ZIP, Kind.SST},
    "rocksdb_v2": {Kind.ZIP, Kind.SST},
}

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_NUMBER = re.compile(r"\d+")


def _kind(rel: str) -> str:
    """A file's kind; a checksum's names its subject's (``crc:snapshot-zip``, also for the
    checksum of a checksum)."""
    name = parse(rel)
    if name.kind is not Kind.CRC or not name.of:
        return str(name.kind)
    while name.kind is Kind.CRC and name.of:  # a checksum of a checksum: of what in the end
        name = parse(name.of)
    return f"crc:{name.kind}"


def _pattern(rel: str) -> str:
    """A path with its ids and numbers replaced: ``state/N/N/SSTs/N-U.sst``."""
    return _NUMBER.sub("N", _UUID.sub("U", rel))


def shape(root: Path) -> dict[str, Any]:
    """What a location is made of, without bytes, sizes or times: the batch ids of its
    commit log and every file's name pattern with its kind."""
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    commits = sorted(int(f.split("/")[1]) for f in files
                     if f.startswith("commits/") and f.split("/")[1].isdigit())
    return {
        "commits": commits,
        "files": sorted({f"{_pattern(f)} {_kind(f)}" for f in files}),
    }


def differences(committed: dict[str, Any], fresh: dict[str, Any], provider: str) -> list[str]:
    """How `fresh` differs from `committed` (both `shape`s of the same query and layout),
    leaving out the kinds only Spark's maintenance writes (`MAINTENANCE`)."""
    timing = {str(k) for k in MAINTENANCE[provider]}

    def counted(files: Iterable[str]) -> set[str]:
        return {f for f in files if f.split(" ", 1)[1].removeprefix("crc:") not in timing}

    out = []
    if committed["commits"] != fresh["commits"]:
        out.append(f"commit log batches {committed['commits']} then, {fresh['commits']} now")
    old, new = counted(committed["files"]), counted(fresh["files"])
    out += [f"no longer written: {f}" for f in sorted(old - new)]
    out += [f"newly written: {f}" for f in sorted(new - old)]
    return out


@dataclass(frozen=True)
class Fixture:
    """One committed location: which PySpark wrote it with which query and layout, where
    it was extracted (`checkpoint`, `output`), and its manifest entry."""

    version: str
    query: str
    provider: str
    checkpoint: Path
    output: Path
    entry: dict[str, Any]

    @property
    def id(self) -> str:
        return f"{self.version}-{self.query}-{self.provider}"

    @property
    def spark_4(self) -> bool:
        return int(self.version.split(".")[0]) >= 4

    @property
    def last_batch(self) -> int:
        return int(self.entry["last_batch"])

    @property
    def input(self) -> str:
        """The input folder as the source log records it (where make.py wrote it)."""
        return str(self.entry["input"])

    @property
    def written_at(self) -> str:
        """Where make.py wrote the location: Spark 4's transformWithState records its state
        schema files' absolute paths in its operator metadata."""
        return str(self.entry.get("checkpoint") or Path(self.input).parent / "ckpt")


@cache
def manifests() -> dict[str, dict[str, Any]]:
    """Every committed manifest, by PySpark version."""
    found = {}
    for path in sorted(FIXTURES.glob("pyspark-*.json")):
        manifest = json.loads(path.read_text())
        found[manifest["pyspark"]] = manifest
    return found


def pairs() -> list[tuple[str, str, str]]:
    """(version, query, provider) of every committed location."""
    return [(version, q["query"], q["provider"])
            for version, manifest in manifests().items() for q in manifest["locations"]]


def archive(version: str) -> Path:
    return FIXTURES / f"pyspark-{version}.tar.gz"


def extract(version: str, dest: Path) -> Path:
    """`version`'s archive extracted into `dest` (made), returned."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive(version)) as tar:
        tar.extractall(dest, filter="data")
    return dest


def fixture(root: Path, version: str, query: str, provider: str) -> Fixture:
    """The location of `version`, `query` and `provider` under `root` (an `extract`)."""
    [entry] = [q for q in manifests()[version]["locations"]
               if (q["query"], q["provider"]) == (query, provider)]
    base = root / f"{query}-{provider}"
    return Fixture(version, query, provider, base / "ckpt", base / "output", entry)


def extractor(root: Path) -> Callable[[str], Path]:
    """Extracts each version's archive under `root` the first time it is asked for."""

    @cache
    def extracted(version: str) -> Path:
        return extract(version, root / version)

    return extracted


def copy_of(root: Path, version: str, query: str, provider: str, dest: Path) -> Fixture:
    """A copy of a committed location (bytes of its own: the tests write into it) at
    ``dest/ckpt``, its files' times shifted so the newest is two hours old (as a query
    stopped long ago left it, the order of the times kept)."""
    import shutil

    found = fixture(root, version, query, provider)
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copytree(found.checkpoint, dest / "ckpt", symlinks=True)
    make_old(dest / "ckpt", TWO_HOURS)
    return Fixture(version, query, provider, dest / "ckpt", found.output, found.entry)


def make_old(root: Path, seconds: float) -> None:
    """Every file below `root` shifted in time so that the newest is `seconds` old."""
    files = [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
    if not files:
        return
    shift = time.time() - seconds - max(p.stat().st_mtime for p in files)
    for path in files:
        st = path.stat()
        os.utime(path, (st.st_atime + shift, st.st_mtime + shift))


def rows(fx: Fixture) -> list[dict[str, Any]]:
    """Every row the query that wrote `fx` wrote (sorted, as `all_rows`)."""
    batches = [json.loads(line) for path in fx.output.glob("batch-*.json")
               for line in path.read_text().splitlines()]
    return sorted(batches, key=lambda r: json.dumps(r, sort_keys=True))


def rebind(fx: Fixture, inputs: Path) -> Path:
    """`fx`'s input files written again to `inputs`, and `fx`'s checkpoint relocated to them
    and to where it is now (statehold's relocate: the source log records where make.py
    wrote the input, transformWithState's metadata where it wrote the location), so that
    Spark can restart it; returns `inputs`."""
    from statehold.spark_checkpoints import open_spark_checkpoint
    from statehold.spark_checkpoints.relocate import absolute_paths, relocate
    from tests.support.spark_locations.queries import write_inputs

    write_inputs(inputs, 0, int(fx.entry["files"]))
    # force: the fixture was just extracted, so its files look like a live query's
    report = relocate(open_spark_checkpoint(str(fx.checkpoint)), fx.input, str(inputs),
                      force=True)
    assert report.paths > 0, report
    relocate(open_spark_checkpoint(str(fx.checkpoint)), fx.written_at, str(fx.checkpoint),
             force=True)
    assert all(str(Path(fx.input).parent) not in b.path
               for b in absolute_paths(open_spark_checkpoint(str(fx.checkpoint))))
    return inputs


def running(extracted: Callable[[str], Path], query: str, provider: str, tmp_path: Path
            ) -> tuple[Fixture, Path]:
    """The running PySpark's location of `query` on `provider`, copied and relocated to a
    fresh copy of its input (``tmp_path/in``); skips where this PySpark lacks `provider`."""
    import pyspark
    import pytest

    from tests.support.spark_locations.queries import PROVIDERS

    if provider not in PROVIDERS:
        pytest.skip(f"PySpark {pyspark.__version__} has no checkpoint format v2")
    version = pyspark.__version__
    assert version in manifests(), (
        f"no committed fixture of PySpark {version}: python -m tests.fixtures.spark.make")
    fx = copy_of(extracted(version), version, query, provider, tmp_path)
    return fx, rebind(fx, tmp_path / "in")


#: The committed transformWithState locations: (PySpark, state store layout).
TWS = [(v, loc["provider"]) for v, m in sorted(manifests().items()) for loc in m["locations"]
       if loc["query"] == "transform"]
#: The transform query's state variables as `read_state` names them (its value state and
#: its timers' two families), and each row's grouping key.
TWS_GROUPING: dict[str, Callable[[dict[str, Any]], str]] = {
    "count": lambda r: r["key"],
    "$eventTimers_keyToTimestamp": lambda r: r["key"]["key"],
    "$eventTimers_timestampToKey": lambda r: r["key"]["key"],
}
