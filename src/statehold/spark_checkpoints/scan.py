"""One listing of a Spark checkpoint location, every key named (`names.parse`) and
grouped: the logs' batches, the sources' log files, the stores and their files, and what
is not Spark's. Everything that decides (verify, gc, savepoint, rollback) works on a
`Scan`, so a decision is made against one listing and its start time."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from statehold import clock
from statehold.spark_checkpoints.layout import Kind, Name, StoreId, parse
from statehold.spark_checkpoints.stores import StoreFiles
from statehold.storage.base import FileInfo, Storage


@dataclass
class Scan:
    files: dict[str, FileInfo] = field(default_factory=dict)
    names: dict[str, Name] = field(default_factory=dict)
    #: When the listing began: a file newer than this was written during it.
    started_at: float = 0.0
    offsets: dict[int, str] = field(default_factory=dict)
    commits: dict[int, str] = field(default_factory=dict)
    #: Source -> batch -> key (a compacted file under its batch too).
    sources: dict[int, dict[int, str]] = field(default_factory=dict)
    stores: dict[StoreId, StoreFiles] = field(default_factory=dict)
    #: ``state/OP/_metadata/...`` and ``state/OP/_stateSchema/...``.
    operator_files: list[str] = field(default_factory=list)
    #: Symlinks, and names Spark does not write: never followed, never deleted.
    foreign: list[str] = field(default_factory=list)
    #: What `repair` set aside under ``_repaired/``: kept, never read as Spark's.
    repaired: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, infos: Iterable[FileInfo], started_at: float) -> Scan:
        scan = cls(started_at=started_at)
        for info in infos:
            scan.add(info)
        return scan

    def add(self, info: FileInfo) -> None:
        name = parse(info.key)
        self.files[info.key] = info
        self.names[info.key] = name
        if info.symlink or name.kind is Kind.UNKNOWN:
            self.foreign.append(info.key)
        elif name.kind is Kind.REPAIRED:
            self.repaired.append(info.key)
        elif name.kind is Kind.OFFSETS and name.batch is not None:
            self.offsets[name.batch] = info.key
        elif name.kind is Kind.COMMITS and name.batch is not None:
            self.commits[name.batch] = info.key
        elif name.kind is Kind.SOURCE_LOG and name.source is not None and name.batch is not None:
            self.sources.setdefault(name.source, {})[name.batch] = info.key
        elif name.kind is Kind.OPERATOR_METADATA:
            self.operator_files.append(info.key)
        elif name.store is not None:
            self.stores.setdefault(name.store, StoreFiles(name.store)).add(name, info)

    @property
    def newest_committed(self) -> int | None:
        return max(self.commits, default=None)

    @property
    def operators(self) -> list[int]:
        return sorted({s.operator for s in self.stores})

    def keys_of(self, kind: Kind) -> list[str]:
        return sorted(k for k, n in self.names.items() if n.kind is kind)

    def size(self, key: str) -> int:
        return self.files[key].size


def scan(storage: Storage) -> Scan:
    """List the whole location once. Symlinks are listed (and reported), never followed."""
    started = clock.now()
    return Scan.of(storage.list(), started)
