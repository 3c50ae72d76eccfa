"""Which files a version of a state store needs: the one place that resolves it, the
way Spark does when it loads the version.

* HDFS-backed provider: the newest ``S.snapshot`` at or below the version (none: start
  empty), then every ``.delta`` after it up to the version.
* RocksDB provider: the newest ``S.zip`` at or below the version, the SSTs and logs its
  ``metadata`` lists, then every ``.changelog`` after it (with changelog checkpointing off
  every version has its own zip, so the chain is empty).
* Checkpoint format v2: the version's unique id comes from the commit log. Its own
  ``V_<id>.zip`` if there is one; otherwise ``V_<id>.changelog``, whose lineage names the
  (version, id) pairs before it: the newest of them with a zip is the base, and the
  changelogs of the ones after it are replayed.

`StoreFiles` is one store's listing; `resolve` reads only through the `Reader` it is
given (snapshot zips' file lists, changelogs' lineage), so the resolution is tested
without storage.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from statehold.spark_checkpoints.layout import Kind, Name, StoreId, version_file
from statehold.storage.base import FileInfo

Provider = Literal["hdfs", "rocksdb"]
How = Literal["snapshot", "snapshot+changelogs", "changelogs", "snapshot+deltas", "deltas"]
#: What a missing file of a version's chain is (`Needs.missing`, `verify --deep`'s kinds):
#: the version the batch wrote has no file at all; a changelog or delta inside the chain
#: is gone; the snapshot zip a chain must start from is gone (changelog checkpointing off:
#: the version's own zip; on: the zip whose changelogs Spark had already purged).
Missing = Literal["version-missing", "changelog-missing", "delta-missing", "zip-missing"]


class Reader(Protocol):
    def zip_files(self, key: str) -> dict[str, int]:
        """The files (relative to its store) a snapshot zip lists, with their sizes."""
        ...

    def lineage(self, key: str) -> list[tuple[int, str]] | None:
        """The (version, unique id) lineage a format-v2 changelog names."""
        ...


@dataclass
class StoreFiles:
    """One store's files, by kind and version."""

    store: StoreId
    #: Version files by (kind, version, unique id or None).
    versions: dict[tuple[Kind, int, str | None], FileInfo] = field(default_factory=dict)
    #: SSTs and RocksDB logs, by key.
    shared: dict[str, FileInfo] = field(default_factory=dict)
    schema: FileInfo | None = None

    def add(self, name: Name, info: FileInfo) -> None:
        if name.kind in (Kind.SST, Kind.ROCKSDB_LOG):
            self.shared[info.key] = info
        elif name.kind is Kind.STORE_SCHEMA:
            self.schema = info
        elif name.version is not None:
            self.versions[(name.kind, name.version, name.unique_id)] = info

    @property
    def provider(self) -> Provider:
        kinds = {k for k, _v, _u in self.versions}
        return "hdfs" if kinds & {Kind.DELTA, Kind.HDFS_SNAPSHOT} else "rocksdb"

    @property
    def held(self) -> list[int]:
        """Every version with a file."""
        return sorted({v for _k, v, _u in self.versions})

    def has(self, kind: Kind, version: int, unique_id: str | None = None) -> bool:
        return (kind, version, unique_id) in self.versions

    def key(self, kind: Kind, version: int, unique_id: str | None = None) -> str:
        ext = {
            Kind.ZIP: "zip",
            Kind.CHANGELOG: "changelog",
            Kind.DELTA: "delta",
            Kind.HDFS_SNAPSHOT: "snapshot",
        }[kind]
        return version_file(self.store, version, ext, unique_id)


@dataclass
class Needs:
    """What loading one version of one store takes."""

    store: StoreId
    version: int
    how: How
    #: The snapshot it starts from (0: an empty store).
    base: int
    #: Key -> expected size (None where only presence is known).
    files: dict[str, int | None] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    #: The files the version needs that are not there, each with what it is.
    missing: list[tuple[str, Missing]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def resolve(
    files: StoreFiles, version: int, reader: Reader, unique_id: str | None = None
) -> Needs:
    """The files `version` of `files.store` needs, and what is missing for it."""
    if unique_id is not None:
        return _resolve_v2(files, version, unique_id, reader)
    if files.provider == "hdfs":
        return _chain(files, version, Kind.HDFS_SNAPSHOT, Kind.DELTA, reader)
    return _chain(files, version, Kind.ZIP, Kind.CHANGELOG, reader)


def _chain(files: StoreFiles, version: int, snap: Kind, step: Kind, reader: Reader) -> Needs:
    bases = [v for k, v, _u in files.versions if k is snap and v <= version]
    base = max(bases, default=0)
    rocks = snap is Kind.ZIP
    how: How
    if base == version:
        how = "snapshot"
    elif base:
        how = "snapshot+changelogs" if rocks else "snapshot+deltas"
    else:
        how = "changelogs" if rocks else "deltas"
    needs = Needs(files.store, version, how, base)
    if base and rocks:
        _add_snapshot(needs, files, files.key(snap, base), reader)
    elif base:
        needs.files[files.key(snap, base)] = files.versions[(snap, base, None)].size
    missing = []
    for v in range(base + 1, version + 1):
        if files.has(step, v):
            needs.files[files.key(step, v)] = files.versions[(step, v, None)].size
        else:
            missing.append(v)
    if missing:
        what = "changelog" if rocks else "delta"
        start = f"snapshot {base}" if base else "an empty store"
        needs.problems.append(
            f"{files.store}: version {version} needs {what}s {_ranges(missing)} "
            f"(from {start}), which are missing"
        )
        needs.missing = _missing_chain(files, version, base, missing, rocks)
    return needs


def _missing_chain(
    files: StoreFiles, version: int, base: int, missing: list[int], rocks: bool
) -> list[tuple[str, Missing]]:
    """What each gap of a chain is. Deltas and, with changelog checkpointing on,
    changelogs are written at every commit, so a gap reaching the version is the version
    missing, and one in the middle the files deleted. A RocksDB chain with no snapshot
    under it whose changelogs start above version 1 lost the snapshot zip they start from
    (Spark purges the changelogs below a snapshot it keeps); with changelog checkpointing
    off (no changelogs at all) a gap is the version's own zip."""
    step = Kind.CHANGELOG if rocks else Kind.DELTA
    changelogs = any(k is Kind.CHANGELOG for k, _v, _u in files.versions)
    out: list[tuple[str, Missing]] = []
    for run in _runs(missing):
        if rocks and not changelogs:
            out.append((files.key(Kind.ZIP, run[-1]), "zip-missing"))
            continue
        if run[-1] == version:
            out.append((files.key(step, version), "version-missing"))
            run = run[:-1]
        if not run:
            continue
        if rocks and not base and run[0] == 1:
            out.append((files.key(Kind.ZIP, run[-1]), "zip-missing"))
            continue
        kind: Missing = "changelog-missing" if rocks else "delta-missing"
        out += [(files.key(step, v), kind) for v in run]
    return out


def _resolve_v2(files: StoreFiles, version: int, unique_id: str, reader: Reader) -> Needs:
    if files.has(Kind.ZIP, version, unique_id):
        needs = Needs(files.store, version, "snapshot", version)
        _add_snapshot(needs, files, files.key(Kind.ZIP, version, unique_id), reader)
        return needs
    own = files.key(Kind.CHANGELOG, version, unique_id)
    if not files.has(Kind.CHANGELOG, version, unique_id):
        needs = Needs(files.store, version, "changelogs", 0)
        needs.problems.append(
            f"{files.store}: version {version} (id {unique_id}) has neither a snapshot nor a "
            "changelog"
        )
        needs.missing.append((own, "version-missing"))
        return needs
    chain = reader.lineage(own) or []
    based = [(v, u) for v, u in chain if files.has(Kind.ZIP, v, u)]
    base, base_id = max(based, default=(0, ""))
    needs = Needs(files.store, version, "snapshot+changelogs" if base else "changelogs", base)
    if base:
        _add_snapshot(needs, files, files.key(Kind.ZIP, base, base_id), reader)
    elif (chain[0][0] if chain else version) > 1:
        # (version 1's lineage is empty, as Spark writes it: it starts from an empty store)
        needs.problems.append(
            f"{files.store}: version {version}'s lineage has no snapshot that is still held"
        )
        if chain:  # the lineage starts after the snapshot it was rebuilt from
            first = chain[0][0] - 1
            needs.missing.append((files.key(Kind.ZIP, first), "zip-missing"))
    for v, u in [*[(v, u) for v, u in chain if v > base], (version, unique_id)]:
        if files.has(Kind.CHANGELOG, v, u):
            needs.files[files.key(Kind.CHANGELOG, v, u)] = files.versions[
                (Kind.CHANGELOG, v, u)
            ].size
        else:
            needs.problems.append(
                f"{files.store}: version {version} needs changelog {v} (id {u}), which is missing"
            )
            needs.missing.append((files.key(Kind.CHANGELOG, v, u), "changelog-missing"))
    return needs


def _add_snapshot(needs: Needs, files: StoreFiles, key: str, reader: Reader) -> None:
    """A zip and the SSTs and logs it lists (sizes from its list)."""
    needs.files[key] = None
    for rel, size in reader.zip_files(key).items():
        shared = f"{files.store.prefix}/{rel}"
        needs.files[shared] = size


def _ranges(versions: Iterable[int]) -> str:
    """``3-5, 8`` for [3, 4, 5, 8]."""
    return ", ".join(_run(run) for run in _runs(versions))


def _runs(versions: Iterable[int]) -> list[list[int]]:
    """[[3, 4, 5], [8]] for [3, 4, 5, 8]."""
    out: list[list[int]] = []
    for v in sorted(versions):
        if out and v == out[-1][-1] + 1:
            out[-1].append(v)
        else:
            out.append([v])
    return out


def _run(run: list[int]) -> str:
    return str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"
