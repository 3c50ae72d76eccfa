"""The one deletion policy: what is referenced, what is protected, what may be deleted.

Every path that deletes asks it: the coordinator's subsume and abort (through the
registry, which holds the same references), the reconcile, `statehold gc`, dispose, job
end, and `du`'s count of unreferenced bytes; the outside gc's deletes go through the one
guarded batch deleter (`bulk_delete`), which asks it as `JobDirectoryRule`. Spark's own
checkpoint locations have their rule in `statehold.spark_checkpoints.policy` (same
`Verdict`s, `cleanup.rule`), asked by the same deleter. Stated once:

* **Referenced** (never deleted): the `_metadata` of every retained checkpoint and
  savepoint, and every file one of them names. A document that cannot be verified is
  *quarantined*: it still protects its own directory and every data file its text
  names; if not even that can be read, every data file is spared until a person
  disposes of it (``statehold dispose --force``).
* **Kept** (not the checkpoints' to delete): ``_ha/``, ``_job/``, ``_spark/`` and
  ``taskowned/``, except dead bookkeeping: leases of older epochs and, with no attempt
  running, interrupted writes old enough not to be a starting attempt's claim. The
  checkpoint history (``_job/history/``) is kept too; only its writer prunes it, the
  oldest records beyond its bound (`history_to_prune`). Operator requests and their
  answers (``_job/requests/``) likewise: removed only as `requests_to_remove` says.
* **Retained** checkpoints: the newest ``retain``, and with ``retain_for`` also every
  one completed less than that long ago (`retention_split`); older ones are subsumed.
* **Foreign**: names statehold did not make and symlinks; reported, never deleted.
* **Protected** (may be live): a savepoint's `_metadata`; with an attempt running, its
  files for checkpoints after the newest retained one (and any ``chk-N/`` after it);
  files of an epoch newer than the one the plan was made under; young temp files.
* **Deletable**: everything else statehold made.

Metadata can only name data files (``shared/``, ``exclusive/``, ``taskowned/`` and the
document's own directory; see `layout.check_data_key`), so no document can make
bookkeeping referenced or deletable.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from statehold import clock
from statehold.cleanup.discard import Discard
from statehold.cleanup.holders import Holders
from statehold.cleanup.rule import Verdict
from statehold.errors import InvalidArgumentError
from statehold.format import layout
from statehold.format.layout import Kind
from statehold.format.requests import is_answer, is_request, request_id_of
from statehold.job.history import is_history_record
from statehold.storage.base import FileInfo, UnsafePathError, check_key

#: An interrupted write in ``_ha/`` or ``_job/`` younger than this may be a starting
#: attempt's claim, made before it has a lease to show.
BOOKKEEPING_TEMP_GRACE_SECONDS = 300.0
#: Temp files younger than this may be an atomic write still under way.
TEMP_GRACE_SECONDS = 3600.0

_KEPT = {Kind.HA, Kind.JOB, Kind.SPARK, Kind.TASKOWNED}
_LEASE = re.compile(rf"^{re.escape(layout.JOB_DIR)}/lease-e(?P<epoch>\d+)\.json$")
_SAVEPOINT_DIR = re.compile(rf"^{layout.SAVEPOINTS_DIR}/[^/]+$")


@dataclass(frozen=True, slots=True)
class LiveAttempt:
    """The running attempt: its epoch and the newest checkpoint id completed when the
    plan was made; its files for later checkpoints may still be in flight."""

    epoch: int
    after_checkpoint: int


def parse(key: str) -> layout.PathInfo:
    """A listed key statehold cannot even address is foreign, not an error."""
    try:
        return layout.parse(key)
    except UnsafePathError:
        return layout.PathInfo(key, Kind.UNKNOWN)


@dataclass(frozen=True)
class View:
    """What a judgment relies on, read once per plan."""

    #: The HA store's epoch when the plan was made.
    epoch: int
    holders: Holders
    live: LiveAttempt | None
    referenced: frozenset[str]
    #: Savepoints whose `_metadata` is present and was read as a holder (their other files
    #: are leftovers).
    savepoints_with_metadata: frozenset[str] = frozenset()
    now: float = field(default_factory=clock.now)
    temp_grace: float = TEMP_GRACE_SECONDS
    bookkeeping_grace: float = BOOKKEEPING_TEMP_GRACE_SECONDS
    #: Spare ``chk-N/`` after the newest retained checkpoint even with no attempt running:
    #: the next attempt writes that very key, and a delete that lands after its write
    #: (a gc paused between its re-check and its delete) would take a published
    #: document. Only the attempt that ends the job, which holds the epoch, clears them.
    spare_next_checkpoints: bool = True

    @classmethod
    def of(
        cls,
        epoch: int,
        holders: Holders,
        live: LiveAttempt | None,
        listing: Iterable[FileInfo] = (),
        **options: Any,
    ) -> View:
        # Only savepoints the holders were read from: one whose `_metadata` appeared
        # after that (a savepoint being made while this listing runs) is in the making as
        # far as this view knows, so its files are not leftovers (found by the simulation,
        # seed 13).
        known = set(holders.documents) | set(holders.quarantined)
        savepoints = frozenset(
            p.savepoint
            for p in (parse(i.key) for i in listing)
            if p.kind is Kind.SAVEPOINT_METADATA and p.savepoint is not None and p.key in known
        )
        return cls(epoch, holders, live, frozenset(holders.referenced()), savepoints, **options)

    @property
    def newest_retained(self) -> int:
        """The newest retained checkpoint's id (-1 if none): holders are the retained
        checkpoints and the savepoints."""
        ids = [
            parse(k).checkpoint_id
            for k in (*self.holders.documents, *self.holders.quarantined)
            if k.startswith("chk-")
        ]
        return max((i for i in ids if i is not None), default=-1)


def judge(info: FileInfo, view: View, *, disposing: str | None = None) -> Verdict:
    """The policy's decision for one listed file. `disposing` names the checkpoint or
    savepoint directory a person is disposing of (its savepoint files are then not
    protected as a savepoint's)."""
    parsed = parse(info.key)
    if disposing is not None and info.key.startswith(disposing + "/") and parsed.kind in (
        Kind.SAVEPOINT_METADATA,
        Kind.SAVEPOINT_OTHER,
    ):
        return Verdict.REFERENCED if info.key in view.referenced else Verdict.DELETABLE
    if info.key in view.referenced:
        return Verdict.REFERENCED
    if getattr(info, "symlink", False):
        return Verdict.FOREIGN
    if parsed.kind in _KEPT:
        return Verdict.DELETABLE if _dead_bookkeeping(info, parsed.kind, view) else Verdict.KEPT
    if parsed.kind is Kind.UNKNOWN:
        return Verdict.FOREIGN
    if any(info.key.startswith(d) for d in view.holders.quarantined_dirs()):
        return Verdict.REFERENCED
    if view.holders.spare_all_data and parsed.kind in (Kind.SHARED, Kind.EXCLUSIVE):
        return Verdict.PROTECTED
    explicit = disposing is not None and info.key.startswith(disposing + "/")
    if _maybe_live(parsed, info, view, explicit=explicit):
        return Verdict.PROTECTED
    return Verdict.DELETABLE


def unlisted_savepoint(info: FileInfo, view: View, exists: Callable[[str], bool]) -> bool:
    """Is deletable `info` a copy of a savepoint whose `_metadata` the listing of
    ``savepoints/`` did not show but the storage has (`exists`, a consistent stat)? Then
    it is spared: on a store whose listings lag behind its writes, a savepoint made a
    moment ago is not listed yet, and the job end (which spares no young file) took the
    copies of the savepoint it had just made (simulation, list lag)."""
    parsed = parse(info.key)
    return (
        parsed.kind is Kind.SAVEPOINT_OTHER
        and parsed.savepoint is not None
        and parsed.savepoint not in view.savepoints_with_metadata
        and exists(layout.savepoint_metadata_key(parsed.savepoint))
    )


#: Directories whose plain files `judge_names` can decide from the name alone.
_DATA_DIRS = (layout.SHARED_DIR, layout.EXCLUSIVE_DIR)
_DATA_NAME = re.compile(r"e(\d+)-c(\d+)-[A-Za-z0-9._-]+")
#: Plain file names, one per line.
_PLAIN_NAMES = re.compile(r"(?:[A-Za-z0-9._-]+\n)*[A-Za-z0-9._-]+")


def judge_names(
    directory: str, names: list[str], view: View
) -> dict[Verdict | None, list[str]]:
    """`judge` for many plain files (not links) of one directory at once, as their
    names, without their size or mtime: the same decisions, for a gc over millions of
    files. Only a data file's name in ``shared/`` or ``exclusive/`` (``eE-cC-...``, not an
    interrupted write) decides alone; every other name is returned under None, to be
    stat'ed and given to `judge`."""
    out: dict[Verdict | None, list[str]] = {v: [] for v in (*Verdict, None)}
    quarantined = any((directory + "/").startswith(d) for d in view.holders.quarantined_dirs())
    if directory not in _DATA_DIRS or quarantined:
        out[None] = list(names)
        return out
    referenced, live, epoch = view.referenced, view.live, view.epoch
    spare_all = view.holders.spare_all_data
    undecided, kept, protected, deletable = (
        out[None], out[Verdict.REFERENCED], out[Verdict.PROTECTED], out[Verdict.DELETABLE]
    )
    match, prefix, temp = _DATA_NAME.fullmatch, directory + "/", layout.TEMP_MARKER
    for name in names:
        m = match(name)
        if m is None or temp in name:
            undecided.append(name)
        elif prefix + name in referenced:
            kept.append(name)
        elif spare_all:
            protected.append(name)
        else:
            # what `_maybe_live` says of a data file: an epoch after the plan's, or the
            # running attempt's files after its newest completed checkpoint
            e = int(m[1])
            if e > epoch or (
                live is not None and e == live.epoch and int(m[2]) > live.after_checkpoint
            ):
                protected.append(name)
            else:
                deletable.append(name)
    return out


def check_discardable_names(directory: str, names: list[str]) -> list[str]:
    """`check_discardable` for many files of one directory: in ``shared/`` and
    ``exclusive/`` every plain name is data, so the directory decides once."""
    if directory in _DATA_DIRS:
        if _PLAIN_NAMES.fullmatch("\n".join(names)) and {".", ".."}.isdisjoint(names):
            return names  # every one plain: one regex over the batch, not one per name
        for name in names:
            check_discardable(check_key(f"{directory}/{name}"))
        return names
    for name in names:
        check_discardable(check_key(f"{directory}/{name}" if directory else name))
    return names


@dataclass(frozen=True)
class JobDirectoryRule:
    """The job directory's rule as the one deleter asks it (`rule.DeletionRule`): this
    policy's last line (`check_discardable_names`), and the outside writer's re-check
    (`guard`, e.g. `gc.outside_guard`: no failover, no attempt back) before each batch.
    A job directory's names are written once, so a listed file is the file deleted: no
    file is re-checked."""

    guard: Callable[[], None] | None = None

    def check_names(self, directory: str, names: list[str]) -> list[str]:
        return check_discardable_names(directory, names)

    def recheck(self) -> None:
        if self.guard is not None:
            self.guard()

    def unchanged(self, directory: str, names: list[str]) -> list[str]:
        return names


def _dead_bookkeeping(info: FileInfo, kind: Kind, view: View) -> bool:
    """Leftovers of the HA store's and the job entries' own writes that nobody can use:
    the lease of an epoch older than the job's (it vouches for nothing), and, when no
    attempt is live, an interrupted atomic write in ``_ha/`` or ``_job/`` old enough not
    to be a starting attempt's claim. The current epoch's lease is never touched."""
    if kind not in (Kind.HA, Kind.JOB):
        return False
    lease = _LEASE.match(info.key)
    if lease:
        return int(lease["epoch"]) < view.epoch
    name = info.key.rsplit("/", 1)[-1]
    return (
        view.live is None
        and layout.TEMP_MARKER in name
        and not name.startswith(f".lease-e{view.epoch}.json")
        and info.mtime < view.now - view.bookkeeping_grace
    )


def _maybe_live(
    parsed: layout.PathInfo, info: FileInfo, view: View, *, explicit: bool = False
) -> bool:
    if (
        view.spare_next_checkpoints
        and not explicit  # a person disposing of that very folder
        and parsed.epoch is None
        and parsed.kind in (Kind.CHECKPOINT_METADATA, Kind.CHECKPOINT_OTHER, Kind.TEMP)
        and parsed.checkpoint_id is not None
        and parsed.checkpoint_id > view.newest_retained
    ):
        return True  # see View.spare_next_checkpoints
    if parsed.kind is Kind.SAVEPOINT_METADATA:
        return True  # a savepoint is deleted only by an explicit dispose
    if parsed.epoch is not None and parsed.epoch > view.epoch:
        return True  # an attempt that started after the plan's look at the HA store
    if parsed.kind is Kind.SAVEPOINT_OTHER:
        # a savepoint being written, or a completed one's unreferenced leftover
        return (
            parsed.savepoint not in view.savepoints_with_metadata
            and view.now - info.mtime < view.temp_grace
        )
    live = view.live
    if live is None:
        return False
    if parsed.kind is Kind.TEMP and parsed.epoch is None and parsed.checkpoint_id is None:
        return view.now - info.mtime < view.temp_grace
    if parsed.kind in (Kind.CHECKPOINT_METADATA, Kind.CHECKPOINT_OTHER) or parsed.epoch is None:
        # chk-N/ names no epoch: any folder after the newest retained may be in flight
        return parsed.checkpoint_id is not None and parsed.checkpoint_id > live.after_checkpoint
    return parsed.epoch == live.epoch and (
        parsed.checkpoint_id is not None and parsed.checkpoint_id > live.after_checkpoint
    )


#: What a discarded file may be: data files, checkpoint and savepoint folders' files and
#: interrupted writes; in ``_ha/`` and ``_job/`` only leases and interrupted writes.
_DISCARDABLE = {
    Kind.SHARED,
    Kind.EXCLUSIVE,
    Kind.CHECKPOINT_METADATA,
    Kind.CHECKPOINT_OTHER,
    Kind.SAVEPOINT_METADATA,
    Kind.SAVEPOINT_OTHER,
    Kind.TEMP,
}


def check_discardable(path: str, *, is_dir: bool = False) -> str:
    """Refuse (UnsafePathError) a path no decision of this policy can have chosen: the
    last line of defence, in the cleaner, below every caller. Directories: ``chk-N``,
    ``savepoints/NAME`` and, at job end with delete-all, ``_spark``."""
    parsed = parse(path)
    if is_dir:
        ok = path == layout.SPARK_DIR or parsed.kind is Kind.CHECKPOINT_OTHER and "/" not in path
        ok = ok or parsed.kind is Kind.UNKNOWN and _SAVEPOINT_DIR.match(path) is not None
    elif parsed.kind in (Kind.HA, Kind.JOB):
        ok = bool(_LEASE.match(path)) or is_history_record(path)
        ok = ok or is_request(path) or is_answer(path)
        ok = ok or layout.TEMP_MARKER in path.rsplit("/", 1)[-1]
    else:  # (in the data folders even a name statehold did not make is data)
        ok = parsed.kind in _DISCARDABLE or path.split("/", 1)[0] in (
            layout.SHARED_DIR,
            layout.EXCLUSIVE_DIR,
        )
    if not ok:
        raise UnsafePathError(f"refusing to delete {path!r}: the deletion policy never does")
    return path


def check_discard(discard: Discard) -> tuple[list[str], list[str]]:
    """The discard's files and directories, each one this policy may have chosen (else
    raises in the caller, before anything is deleted): what every cleaner deletes."""
    return (
        [check_discardable(check_key(k)) for k in discard.keys],
        [check_discardable(check_key(d.rstrip("/")), is_dir=True) for d in discard.dirs],
    )


def history_to_prune(keys: Iterable[str], keep: int) -> list[str]:
    """The history records among `keys` beyond the newest `keep` (names sort by
    checkpoint id, then epoch): the only `_job/` files deleted besides leases and
    interrupted writes, each checked here like every other delete."""
    records = sorted(k for k in keys if is_history_record(k))
    doomed = records[: max(0, len(records) - keep)]
    return [check_discardable(k) for k in doomed]


#: An answer nobody collected (a request made without ``--wait``) is kept this long.
ANSWER_KEEP_SECONDS = 7 * 24 * 3600.0
#: With ``retain_for``, at most this many checkpoints are retained however young: the HA
#: store holds one pointer per retained checkpoint (a ZooKeeper node holds about 1 MB,
#: and an attempt reads every retained document when it starts).
MAX_RETAINED = 1000


def requests_to_remove(
    listing: Iterable[FileInfo],
    *,
    answered: Iterable[str] = (),
    collected: Iterable[str] = (),
    now: float | None = None,
) -> list[str]:
    """The operator request documents (``_job/requests/``) among `listing` that may go,
    each checked like every other delete: the request of each id in `answered` (its
    final answer says it all), request and answer of each id in `collected` (the
    requester read the answer, or withdrew the request), and answers older than
    `ANSWER_KEEP_SECONDS` with their requests. Nothing else: a request without a final
    answer is answered first, by its attempt, a later one or its requester."""
    now = clock.now() if now is None else now
    drop_request, drop_both = set(answered), set(collected)
    infos = [i for i in listing if is_request(i.key) or is_answer(i.key)]
    for info in infos:
        if is_answer(info.key) and info.mtime < now - ANSWER_KEEP_SECONDS:
            drop_both.add(request_id_of(info.key) or "")
    doomed = [
        i.key for i in infos
        if request_id_of(i.key) in drop_both
        or (is_request(i.key) and request_id_of(i.key) in drop_request)
    ]
    # requests before answers: a half-done removal never leaves a request unanswered
    return [check_discardable(k) for k in sorted(doomed, key=lambda k: (is_answer(k), k))]


def retention_split(
    completed_at: Sequence[float],
    retain: int,
    retain_for: float | None = None,
    now: float | None = None,
) -> int:
    """How many of the oldest completed checkpoints (`completed_at`, oldest first) are
    subsumed: each not among the newest `retain` and, with `retain_for` (seconds), not
    completed within it either; never more than `MAX_RETAINED` kept by age. Only a
    prefix goes, so the retained checkpoints stay the newest ones."""
    if retain < 1:
        raise InvalidArgumentError("retain must be at least 1")
    count = len(completed_at)
    by_count = max(0, count - retain)
    if retain_for is None:
        return by_count
    now = clock.now() if now is None else now
    drop = 0
    while drop < by_count and completed_at[drop] <= now - retain_for:
        drop += 1
    return max(drop, count - max(retain, MAX_RETAINED))


__all__ = [
    "ANSWER_KEEP_SECONDS",
    "BOOKKEEPING_TEMP_GRACE_SECONDS",
    "JobDirectoryRule",
    "MAX_RETAINED",
    "LiveAttempt",
    "TEMP_GRACE_SECONDS",
    "Verdict",
    "View",
    "check_discard",
    "check_discardable",
    "check_discardable_names",
    "history_to_prune",
    "judge",
    "judge_names",
    "parse",
    "requests_to_remove",
    "retention_split",
]
