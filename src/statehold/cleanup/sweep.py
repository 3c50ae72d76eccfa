"""One pass over (part of) a job directory's listing: every file judged by the deletion
policy, the deletable ones handed on page by page, and a plan that keeps counts and a
bounded sample of keys, never the listing. The reconcile, `statehold gc` and each task of
`gc --spark` run it.

Pages come from `Storage.list_name_pages`: on a local disk plain files arrive as names
of one directory, not stat'ed, and `policy.judge_names` decides a directory's data files
from their names in bulk; a name it cannot decide alone (an interrupted write, a name
statehold did not make) is stat'ed and judged one by one by `policy.judge`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from statehold.cleanup.policy import (
    LiveAttempt,
    Verdict,
    View,
    judge,
    judge_names,
    unlisted_savepoint,
)
from statehold.ha.base import HAState
from statehold.storage.base import FileInfo, NamePage, Storage

#: How many keys of each kind a plan or report names (the counts are always complete).
SAMPLE = 1000

#: Deletable files of one directory, by name: (directory, names).
OnNames = Callable[[str, list[str]], None]
#: Deletable files with their stat.
OnInfos = Callable[[list[FileInfo]], None]
#: Called after each judged page with the number of files it held (a progress display).
OnListed = Callable[[int], None]


@dataclass(frozen=True)
class KeyRange:
    """Keys `start` <= key < `stop` (None: unbounded): a part of a listing, so that one
    big directory can be split among Spark tasks. Any sorted boundaries cover the key
    space exactly once, whatever the names are."""

    start: str | None = None
    stop: str | None = None

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and (self.start is None or key >= self.start) and (
            self.stop is None or key < self.stop
        )


WHOLE = KeyRange()


@dataclass
class ReconcilePlan:
    """Counts of what the listing held, with a bounded sample of keys of each kind: a
    plan streams the listing, so its memory does not grow with the number of files."""

    scanned: int = 0
    referenced: int = 0
    #: A sample (the first `SAMPLE` listed) of the deletable files; `orphan_count` counts them all.
    orphans: list[FileInfo] = field(default_factory=list)
    orphan_count: int = 0
    #: Bytes of the deletable files whose size the listing gave (a deleter adds the rest).
    orphan_bytes: int = 0
    protected: list[str] = field(default_factory=list)
    protected_count: int = 0
    foreign: list[str] = field(default_factory=list)
    foreign_count: int = 0
    #: Documents that cannot be verified (key -> why): their files are spared.
    quarantined: dict[str, str] = field(default_factory=dict)
    live: LiveAttempt | None = None
    #: The HA state the plan was made under.
    state: HAState | None = None

    def add(self, page: Iterable[FileInfo], view: View) -> list[FileInfo]:
        """Judge files by the policy, one by one; return the deletable ones."""
        deletable: list[FileInfo] = []
        for info in page:
            self.scanned += 1
            verdict = judge(info, view)
            if verdict is Verdict.REFERENCED:
                self.referenced += 1
            elif verdict is Verdict.FOREIGN:
                self.foreign_count += 1
                if len(self.foreign) < SAMPLE:
                    self.foreign.append(info.key)
            elif verdict is Verdict.PROTECTED:
                self.protected_count += 1
                if len(self.protected) < SAMPLE:
                    self.protected.append(info.key)
            elif verdict is Verdict.DELETABLE:
                deletable.append(info)
                self.orphan_count += 1
                self.orphan_bytes += info.size
                if len(self.orphans) < SAMPLE:
                    self.orphans.append(info)
        return deletable

    def spare(self, keys: set[str], judged: list[FileInfo]) -> None:
        """Count `keys`, of the deletable files `add` just returned (`judged`), as
        protected after all (`policy.unlisted_savepoint`)."""
        spared = [i for i in judged if i.key in keys]
        self.orphan_count -= len(spared)
        self.orphan_bytes -= sum(i.size for i in spared)
        self.orphans = [i for i in self.orphans if i.key not in keys]
        self.protected_count += len(spared)
        room = SAMPLE - len(self.protected)
        self.protected.extend(i.key for i in spared[: max(room, 0)])

    def add_names(
        self, directory: str, names: list[str], view: View, sizes: list[int] | None = None
    ) -> tuple[list[str], list[str]]:
        """Judge one directory's plain files by name (`policy.judge_names`); return the
        deletable names and the names the policy needs the stat of. `sizes`: the names'
        sizes from the listing, in order (the deletable ones count in `orphan_bytes`)."""
        out = judge_names(directory, names, view)
        base = f"{directory}/" if directory else ""
        deletable, protected = out[Verdict.DELETABLE], out[Verdict.PROTECTED]
        self.scanned += len(names) - len(out[None])
        self.referenced += len(out[Verdict.REFERENCED])
        self.protected_count += len(protected)
        room = SAMPLE - len(self.protected)
        self.protected.extend(base + n for n in protected[: max(room, 0)])
        self.orphan_count += len(deletable)
        if sizes and deletable:
            size_of = dict(zip(names, sizes, strict=True))
            self.orphan_bytes += sum(size_of[n] for n in deletable)
        room = SAMPLE - len(self.orphans)
        self.orphans.extend(FileInfo(base + n, 0, 0.0) for n in deletable[: max(room, 0)])
        for verdict in (Verdict.FOREIGN, Verdict.KEPT):
            assert not out[verdict], "judge_names decides data files only"
        return deletable, out[None]

    def merge(self, other: ReconcilePlan) -> None:
        """Add the counts and samples of a plan over another part of the listing."""
        self.scanned += other.scanned
        self.referenced += other.referenced
        self.orphan_count += other.orphan_count
        self.orphan_bytes += other.orphan_bytes
        self.protected_count += other.protected_count
        self.foreign_count += other.foreign_count
        self.orphans.extend(other.orphans[: SAMPLE - len(self.orphans)])
        self.protected.extend(other.protected[: SAMPLE - len(self.protected)])
        self.foreign.extend(other.foreign[: SAMPLE - len(self.foreign)])


def name_pages(
    storage: Storage, prefix: str, page_size: int, keys: KeyRange = WHOLE,
    *, with_stat: bool = False,
) -> Iterator[NamePage]:
    """The name pages under `prefix`, only the keys in `keys`; `with_stat`: with the
    names' sizes and mtimes where the backend gives them on the way (whole listings)."""
    if keys == WHOLE:
        pages = storage.list_stat_pages if with_stat else storage.list_name_pages
        yield from pages(prefix, page_size)
        return
    for page in storage.list_name_pages(prefix, page_size, start=keys.start):
        base = f"{page.directory}/" if page.directory else ""
        names = [n for n in page.names if base + n in keys]
        infos = [i for i in page.infos if i.key in keys]
        if names or infos:
            yield NamePage(page.directory, names, infos)
        ordered = storage.lists_in_key_order
        if ordered and keys.stop is not None and page.infos and page.infos[-1].key >= keys.stop:
            return  # an object store lists in key order: the rest is past the range


def sweep(
    storage: Storage,
    view: View,
    result: ReconcilePlan,
    *,
    prefix: str = "",
    keys: KeyRange = WHOLE,
    page_size: int = 1000,
    on_names: OnNames | None = None,
    on_infos: OnInfos | None = None,
    on_listed: OnListed | None = None,
    sizes_from_listing: bool = False,
) -> None:
    """List `prefix` (the keys in `keys`) page by page, judge every file into `result`,
    hand each page's deletable files to `on_names` (by name; else, stat'ed, to
    `on_infos`) or `on_infos`. `sizes_from_listing`: count the bytes of what goes to
    `on_names` from the listing (one stat per directory entry on the listing's side;
    the deleter then need not stat)."""
    with_stat = on_names is None or sizes_from_listing
    seen: dict[str, bool] = {}

    def savepoint_exists(key: str) -> bool:
        if key not in seen:
            seen[key] = storage.exists(key)
        return seen[key]

    for page in name_pages(storage, prefix, page_size, keys, with_stat=with_stat):
        infos = page.infos
        if page.names and on_names is None:  # e.g. a dry run: stat them, for their bytes
            infos = infos + (with_stats(page) if page.sizes else
                             stat_names(storage, page.directory, page.names))
        elif page.names and on_names is not None:
            deletable, undecided = result.add_names(
                page.directory, page.names, view, page.sizes or None
            )
            if deletable:
                on_names(page.directory, deletable)
            if undecided:
                infos = infos + stat_names(storage, page.directory, undecided)
        chosen = result.add(infos, view)
        spared = {i.key for i in chosen if unlisted_savepoint(i, view, savepoint_exists)}
        if spared:
            result.spare(spared, chosen)
            chosen = [i for i in chosen if i.key not in spared]
        if chosen and on_infos is not None:
            on_infos(chosen)
        if on_listed is not None:
            on_listed(len(page))


def with_stats(page: NamePage) -> list[FileInfo]:
    """The names of a `list_stat_pages` page as files with their listed stat."""
    base = f"{page.directory}/" if page.directory else ""
    return [FileInfo(base + n, size, mtime)
            for n, size, mtime in zip(page.names, page.sizes, page.mtimes, strict=True)]


def stat_names(storage: Storage, directory: str, names: list[str]) -> list[FileInfo]:
    """Stat the files a listing gave by name (gone since: left out)."""
    base = f"{directory}/" if directory else ""
    found = (storage.stat(base + n) for n in names)
    return [info for info in found if info is not None]
