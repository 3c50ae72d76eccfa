"""Repair a damaged Spark checkpoint location (`statehold repair CKPT`): bring it back to
the newest batch that can be made whole, keeping everything that could be kept.

`verify --deep` (`deep_verify`) says which store versions of the newest committed batch
do not load. For each damaged store version the plan takes the first of these that works:

1. **Another way to the same version** (``set-aside``): a snapshot that does not load (an
   HDFS-backed ``V.snapshot``, a RocksDB ``V.zip``, or the zip listing an SST that does not
   match its MANIFEST) is set aside when an older snapshot and its deltas or changelogs
   rebuild the version. Spark's load takes the newest snapshot present at or below the
   version (HDFS-backed: it walks down the versions; RocksDB: the newest zip, or by the
   changelog's lineage with checkpoint format v2), so once the damaged snapshot is gone
   Spark replays the other way itself. The way is tried before it is chosen: the store's
   version is loaded with the damaged snapshots left out (older ones that also fail are
   set aside in turn).
2. **A rebuilt snapshot** (``rebuilt-snapshot``): the version's state replayed into a new
   snapshot. Every replay there is goes through an older snapshot and the deltas or
   changelogs after it, the very ways step 1 tries, and Spark's load takes such a way by
   itself once the damaged file is set aside; where step 1 finds none, the version's
   state is read only through the damaged file (RocksDB without changelog checkpointing:
   each version is its own zip; a cut delta or changelog: the batch's changes are lost),
   so there is nothing to replay. A rebuilt snapshot (`state_writer.SnapshotWriter`,
   `rocksdb_writer`, which repartition writes with) would never keep more than step 1 or
   step 3 does and is not written. The plan says so, per store, in one line.
3. **A rollback** (``rollback``) to the newest batch whose every store version loads
   (deep), by `rollback.rollback` under its own rules: the sources' logs and the state
   versions after it removed, the sink note, its mark while under way.

Before anything changes, a copy of the whole location as it stands, every file and its
damage included (`keep`, default ``<location>-before-repair-<UTC time>`` beside it;
`savepoint.keep_whole`: hard links on a local disk), is written, so the repair can be
undone; the rollback step keeps that one instead of taking a savepoint of its own. A file
set aside is moved, never deleted, to ``_repaired/<UTC time>/<its key>`` inside the
location (its checksum companions with it): Spark never reads that folder, gc never
deletes from it (`policy.KEPT_KINDS`), and `list` shows it. After the repair, `verify
--deep` runs again: the report is ok only if it passes, and names what could not be
repaired.

Refused, nothing changed, while the query looks alive (`location.refuse_alive`, as
rollback) and while an interrupted rollback is unfinished.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field

from statehold import clock
from statehold.progress import Progress
from statehold.spark_checkpoints.deep_verify import DeepResult, Finding, Kind, Loads, deep_check
from statehold.spark_checkpoints.errors import SparkCheckpointError
from statehold.spark_checkpoints.layout import REPAIRED_DIR, StoreId, parse
from statehold.spark_checkpoints.location import SparkCheckpoint, refuse_alive
from statehold.spark_checkpoints.policy import check_set_aside
from statehold.spark_checkpoints.reports import SparkProblem, default_batch, verify
from statehold.spark_checkpoints.rollback import (
    DEFAULT_GRACE_SECONDS,
    RollbackReport,
    rollback,
    rollback_plan,
)
from statehold.spark_checkpoints.rollback_marker import refuse_unfinished
from statehold.spark_checkpoints.savepoint import companions, keep_whole
from statehold.spark_checkpoints.scan import Scan
from statehold.spark_checkpoints.state_reader import resolved
from statehold.storage import StorageError

Step = Literal["set-aside", "rollback", "unrepairable"]

#: Damage a snapshot carries, which another way to its version can avoid.
_SNAPSHOT_DAMAGE = {
    Kind.ZIP_CUT_SHORT, Kind.ZIP_CORRUPT, Kind.ROCKSDB_CANNOT_OPEN,
    Kind.SNAPSHOT_CUT_SHORT, Kind.SNAPSHOT_CORRUPT,
}
#: Damage of an SST: the zip listing it is what is set aside (with the SST).
_SST_DAMAGE = {Kind.SST_UNIQUE_ID, Kind.SST_SIZE, Kind.SST_CORRUPT, Kind.SST_MISSING}
#: Snapshots set aside in turn for one store version at most (older ones failing too).
_MAX_SET_ASIDE = 8


class Damage(BaseModel):
    """One problem `verify --deep` found."""

    path: str
    kind: str
    problem: str
    spark_bug: str | None = None


class StoreRepair(BaseModel):
    """The plan for one damaged store version."""

    store: str
    operator: int
    partition: int
    name: str
    provider: str
    version: int
    damage: list[Damage]
    step: Step
    #: set-aside: the keys moved under ``_repaired/<time>/`` (with their companions), and
    #: how the version loads without them.
    set_aside: list[str] = Field(default_factory=list)
    loads_from: str | None = None
    #: Why each step before the chosen one does not apply (one line each).
    not_chosen: list[str] = Field(default_factory=list)


class RepairReport(BaseModel):
    checkpoint: str
    dry_run: bool
    #: The newest committed batch before the repair.
    batch: int
    stores: list[StoreRepair]
    #: Problems of the batch that are no store's (its logs): only a rollback avoids them.
    other_damage: list[Damage] = Field(default_factory=list)
    #: The batch the rollback step goes back to (None: no rollback), and the files it
    #: removes (counted, after the keep holds them).
    rollback_to: int | None = None
    rollback_removes: int = 0
    #: Why the damage cannot be repaired at all (no batch loads whole), else None.
    unrepairable: str | None = None
    #: The copy of the whole location as it stood (written unless a dry run or nothing to
    #: do), and its newest committed batch.
    keep: str | None = None
    kept_batch: int | None = None
    #: The folder set-aside files went to, and the keys moved (as they were).
    repaired_dir: str | None = None
    moved: list[str] = Field(default_factory=list)
    rollback: RollbackReport | None = None
    #: The batch a restart now continues after (the same batch, or the rollback's).
    restart_batch: int | None = None
    #: `verify --deep` after the repair: what is still wrong (empty when ok).
    remaining: list[SparkProblem] = Field(default_factory=list)
    ok: bool = False

    @property
    def changed(self) -> bool:
        return bool(self.moved or self.rollback)


@dataclass
class _Plan:
    batch: int
    stores: list[StoreRepair] = field(default_factory=list)
    other: list[Finding] = field(default_factory=list)
    aside: list[str] = field(default_factory=list)
    rollback_to: int | None = None
    removes: int = 0
    unrepairable: str | None = None


def repair(
    checkpoint: SparkCheckpoint,
    *,
    dry_run: bool = False,
    keep: str | None = None,
    force: bool = False,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    storage_options: Mapping[str, Any] | None = None,
    progress: Progress | None = None,
) -> RepairReport:
    """Plan the repair of `checkpoint` (see the module's docstring) and, unless `dry_run`,
    carry it out: the whole location copied to `keep` first, the set-aside moves, the rollback; then
    `verify --deep` again. `storage_options`: for opening `keep`. Refused (SparkCheckpoint
    Error, nothing changed) while the query looks alive (without `force`) or a rollback
    is unfinished."""
    found = checkpoint.scan()
    refuse_unfinished(checkpoint.storage, found, "repair")
    if not force:
        refuse_alive(found, grace_seconds, "force the repair")
    batch = default_batch(found)
    loads: Loads = {}  # each store version loaded once while its files are unchanged
    plan = _plan(checkpoint, found, batch, progress, loads)
    report = RepairReport(
        checkpoint=checkpoint.uri, dry_run=dry_run, batch=batch, stores=plan.stores,
        other_damage=[_damage(f) for f in plan.other], rollback_to=plan.rollback_to,
        rollback_removes=plan.removes, unrepairable=plan.unrepairable,
        restart_batch=batch if plan.rollback_to is None else plan.rollback_to,
    )
    nothing = not plan.stores and not plan.other
    if nothing:
        return report.model_copy(update={"ok": True})
    keep_uri = keep or _default_keep(checkpoint)
    if dry_run or plan.unrepairable:
        return report.model_copy(update={"keep": keep_uri, "restart_batch": None
                                         if plan.unrepairable else report.restart_batch,
                                         "remaining": _remaining(plan)})
    kept = keep_whole(checkpoint, keep_uri, found, dest_options=storage_options)
    update: dict[str, Any] = {"keep": kept.dest, "kept_batch": kept.batch}
    if plan.aside:
        folder = f"{REPAIRED_DIR}/{_stamp()}"
        update["repaired_dir"] = folder
        update["moved"] = _move(checkpoint, found, plan.aside, folder)
    if plan.rollback_to is not None:
        update["rollback"] = rollback(
            checkpoint, plan.rollback_to, force=True, kept=(kept.dest, kept.batch),
            storage_options=storage_options)
    after = verify(checkpoint, deep=True, loads=loads)
    update |= {"remaining": after.problems, "ok": after.ok, "restart_batch": after.batch}
    return report.model_copy(update=update)


# -- the plan ----------------------------------------------------------------------------
def _plan(checkpoint: SparkCheckpoint, found: Scan, batch: int,
          progress: Progress | None, loads: Loads) -> _Plan:
    plan = _Plan(batch)
    deep = deep_check(checkpoint, found, batch, progress=progress, loads=loads)
    by_store: dict[StoreId, list[Finding]] = {}
    for finding in deep.findings:
        store = parse(finding.path).store
        if store is None:
            plan.other.append(finding)
        else:
            by_store.setdefault(store, []).append(finding)
    aside: set[str] = set()
    for store, findings in sorted(by_store.items()):
        repair_of = _store_repair(checkpoint, found, store, batch, findings, loads)
        plan.stores.append(repair_of)
        aside.update(repair_of.set_aside)
    plan.aside = sorted(aside)
    rest = _without(found, aside)
    whole = checkpoint.restart_needs(rest, batch)
    if plan.other or not whole.ok or any(s.step == "rollback" for s in plan.stores):
        _plan_rollback(checkpoint, rest, plan, whole.problems, loads)
    return plan


def _store_repair(checkpoint: SparkCheckpoint, found: Scan, store: StoreId, batch: int,
                  findings: list[Finding], loads: Loads) -> StoreRepair:
    files = found.stores.get(store)
    provider = files.provider if files else "hdfs"
    out = StoreRepair(
        store=str(store), operator=store.operator, partition=store.partition,
        name=store.name, provider=provider, version=batch + 1,
        damage=[_damage(f) for f in findings], step="rollback",
    )
    aside, why = _another_way(checkpoint, found, store, batch, findings, loads)
    if aside is not None:
        _files, needs = resolved(checkpoint, _without(found, aside), store, batch)
        out.step, out.set_aside = "set-aside", sorted(aside)
        out.loads_from = _how(needs.how, needs.base, needs.version)
        return out
    out.not_chosen.append(f"another way to version {batch + 1}: {why}")
    out.not_chosen.append(
        "a rebuilt snapshot: nothing to replay it from (the version's state is read only "
        "through the damaged file; any other way Spark replays itself, step 1)")
    return out


def _another_way(checkpoint: SparkCheckpoint, found: Scan, store: StoreId, batch: int,
                 findings: list[Finding], loads: Loads) -> tuple[set[str] | None, str]:
    """The snapshots (and SSTs) to set aside so that the store's version loads another
    way, tried by loading it without them; None, and why, when there is none."""
    aside: set[str] = set()
    current = findings
    for _ in range(_MAX_SET_ASIDE):
        more: set[str] = set()
        for finding in current:
            targets = _snapshot_of(checkpoint, _without(found, aside), store, batch, finding)
            if not targets:
                return None, _why(finding, aside)
            more.update(targets)
        if more <= aside:
            return None, _why(current[0], aside)
        aside |= more
        rest = _without(found, aside)
        try:
            result: DeepResult = deep_check(checkpoint, rest, batch, only=[store],
                                            loads=loads)
        except SparkCheckpointError as e:
            return None, f"without {_names(aside)}: {e}"
        if not result.findings:
            return aside, ""
        current = result.findings
    return None, f"every snapshot tried fails ({_names(aside)})"


def _snapshot_of(checkpoint: SparkCheckpoint, found: Scan, store: StoreId, batch: int,
                 finding: Finding) -> list[str]:
    """What to set aside for `finding`: its snapshot, or the zip listing its SST (and the
    SST); nothing where the damage is not a snapshot's."""
    kind = finding.kind
    if kind in _SNAPSHOT_DAMAGE and finding.path.endswith((".zip", ".snapshot")):
        return [finding.path]
    if kind in _SST_DAMAGE:
        try:
            _files, needs = resolved(checkpoint, found, store, batch)
        except SparkCheckpointError:
            return []
        zips = [k for k in needs.files if k.endswith(".zip")]
        sst = [finding.path] if finding.path in found.files else []
        return [*zips, *sst] if zips else []
    return []


def _why(finding: Finding, aside: set[str]) -> str:
    what = f"{finding.path}: {finding.kind}"
    if not aside:
        return f"{what}, not a snapshot another way could replace"
    return f"with {_names(aside)} set aside, {what}"


def _plan_rollback(checkpoint: SparkCheckpoint, rest: Scan, plan: _Plan,
                   problems: list[str], loads: Loads) -> None:
    """The newest batch before `plan.batch` whose every store version loads."""
    failing = [StoreId(s.operator, s.partition, s.name) for s in plan.stores
               if s.step == "rollback"]
    for candidate in sorted(rest.commits, reverse=True):
        if candidate >= plan.batch or not checkpoint.restart_needs(rest, candidate).ok:
            continue
        # the failing stores first: an older version of them fails too, more often than not
        if failing and deep_check(checkpoint, rest, candidate, only=failing,
                                  loads=loads).findings:
            continue
        if deep_check(checkpoint, rest, candidate, loads=loads).findings:
            continue
        plan.rollback_to = candidate
        try:
            plan.removes = len(rollback_plan(checkpoint, rest, candidate))
        except SparkCheckpointError as e:
            plan.unrepairable = f"a rollback to batch {candidate} is refused: {e}"
            plan.rollback_to = None
        break
    else:
        first = problems[0] if problems else "every older batch's state is damaged too"
        plan.unrepairable = (
            f"no batch before {plan.batch} loads whole to roll back to ({first})")
    for store in plan.stores:
        if store.step == "rollback" and plan.rollback_to is None:
            store.step = "unrepairable"


def _remaining(plan: _Plan) -> list[SparkProblem]:
    """What a dry run or an unrepairable plan leaves: every damage found."""
    out = [SparkProblem(path=d.path, problem=f"{d.kind}: {d.problem}", kind=d.kind,
                        spark_bug=d.spark_bug)
           for s in plan.stores if s.step != "set-aside" or plan.unrepairable
           for d in s.damage]
    out += [SparkProblem(path=f.path, problem=f"{f.kind}: {f.problem}", kind=f.kind,
                         spark_bug=f.spark_bug) for f in plan.other]
    return out


# -- carrying it out ---------------------------------------------------------------------
def _move(checkpoint: SparkCheckpoint, found: Scan, keys: Iterable[str], folder: str
          ) -> list[str]:
    """Each key, then its checksum companions, moved to ``folder/<key>``; every one
    asked of the deletion rule first (`policy.check_set_aside`: a move removes it from
    where Spark reads it), so a refusal moves nothing."""
    moves = [one for key in keys for one in [key, *companions(key, found)]]
    for one in moves:
        check_set_aside(one, f"{folder}/{one}")
    moved: list[str] = []
    for one in moves:
        try:
            checkpoint.storage.move(one, f"{folder}/{one}")
        except StorageError as e:
            raise SparkCheckpointError(
                f"repair of {checkpoint.uri} stopped moving {one} to {folder}/ ({e}); "
                f"what was moved is there; the keep holds the location as it was"
            ) from None
        moved.append(one)
    return moved


# -- helpers -----------------------------------------------------------------------------
def _without(found: Scan, keys: Iterable[str]) -> Scan:
    """`found` as if `keys` (and their companions) were not there."""
    gone = set(keys)
    gone.update(c for k in list(gone) for c in companions(k, found))
    if not gone:
        return found
    return Scan.of((i for k, i in found.files.items() if k not in gone), found.started_at)


def _damage(finding: Finding) -> Damage:
    return Damage(path=finding.path, kind=str(finding.kind), problem=finding.problem,
                  spark_bug=finding.spark_bug)


def _how(how: str, base: int, version: int) -> str:
    step = "changelogs" if "changelog" in how else "deltas"
    if how == "snapshot":
        return f"snapshot {version}"
    if base:
        return f"snapshot {base} + {step} {base + 1}-{version}"
    return f"an empty store + {step} 1-{version}"


def _names(keys: Iterable[str]) -> str:
    return ", ".join(sorted(keys))


def _stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(clock.now()))


def _default_keep(checkpoint: SparkCheckpoint) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(clock.now()))
    return f"{checkpoint.uri.rstrip('/')}-before-repair-{stamp}"


__all__ = ["RepairReport", "StoreRepair", "repair"]
