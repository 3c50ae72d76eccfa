"""The simulation's second world: a Structured Streaming query as Spark runs it, step by
step, over the simulated storage and clock, with statehold's Spark-location code
(`statehold.spark_checkpoints`) acting on its checkpoint location at random moments.

The query (`SparkWorld.query`, one driver process whose tasks run in its actor, and a
`maintenance` process of executors) follows Spark's micro-batch protocol in Spark's
order: the file source's `latestOffset` writes ``sources/0/K`` (``K.compact`` every 10
entries, then Spark's expiry of old entries) BEFORE ``offsets/N`` (a driver dying between
them leaves the log one entry ahead: later offsets carry ``{"logOffset": L}``, L > N);
then each partition's state version N+1 (HDFS-backed: ``V.delta``; RocksDB with changelog
checkpointing: ``V.changelog``; checkpoint format v2: ``V_<uuid>.changelog`` naming its
lineage, the winning attempt's id recorded in ``commits/N``; task retries write another
attempt's files), then ``commits/N``, then Spark's purge of logs older than
``minBatchesToRetain``. Executors' maintenance writes snapshots (``V.snapshot``; RocksDB:
an SST of the keys changed since the last zip, reusing that zip's SSTs, then ``V.zip``
listing them) and deletes what Spark's own retention lets go (old versions, orphan SSTs).
A restart re-reads the logs and the source log as Spark does (the newest ``C.compact`` and
every entry after it). Every storage operation is a scheduler point, so a crash lands
between any two of them.

Beside it, a person runs the real `statehold.spark_checkpoints` code: gc (with the default
grace beside the query, with none on a stopped one), savepoint, verify (of savepoints,
some damaged on purpose), rollback (interrupted by a crash at any of its deletes, then run
again, or not noticed and the query restarted), relocate of the input, and a restart of
the query from a savepoint; with `gc_race`, the race gc's re-check is for (a gc judging
for minutes while a rollback and the query's rerun rewrite a file it judged deletable).

The invariant is the model's, never statehold's: from what its own Spark steps wrote (the
bytes of every file it wrote are registered with their meaning), the model reads what a
restart of each committed batch and of each savepoint would read, by Spark's rules (the
newest snapshot or zip at or below the version and the deltas or changelogs after it, the
zip's SSTs; the newest ``C.compact`` and every entry after it up to the newest, and every
entry up to the batch's logOffset), and requires it whole and equal to the state of the
input files the batch had processed when it was first committed. A missing file is blamed
on whoever deleted it: statehold (a violation), or Spark (its retention of old batches is
fine; a file its own restart needs, or an SST a zip names after it was deleted, is a
``spark-bug`` violation, reported apart). After the quiet phase (stop, heal, gc) no state
file no retained batch needs is left.
"""

from __future__ import annotations

import builtins
import functools
import hashlib
import json
import random
import re
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import statehold.clock
import statehold.spark_checkpoints.rollback
from sim.scheduler import Actor, Process, Scheduler, SimClock
from sim.storage import InjectedFault, SimStorage
from sim.world import Stepping, Stop, Violation
from statehold.errors import StateholdError
from statehold.spark_checkpoints import SparkCheckpointLocation
from statehold.storage.base import StorageError
from tests.support.spark_locations.handmade_files import (
    commit_file,
    file_log,
    lineage_header,
    lz4_stream,
    offsets_file,
    records,
    snapshot_zip,
)

PARTITIONS = 2
KEYS = 4
#: Spark's ``minBatchesToRetain`` (100 by default; small here so retention happens).
RETAIN = 3
#: The file source log's ``compactInterval``.
COMPACT = 10
#: Versions between maintenance snapshots (Spark's ``minDeltasForSnapshot``).
SNAPSHOT_EVERY = 3
MAX_FILES_PER_TRIGGER = 3
PROVIDERS = ("hdfs", "rocksdb", "rocksdb-v2")
INPUTS = ("file:///in/", "file:///moved/in/")
SPARK_KINDS = ("query", "maintenance")

_STATE = re.compile(
    r"^state/0/(?P<p>\d+)/(?P<v>\d+)(?:_(?P<u>[0-9a-f-]+))?\.(?P<ext>delta|snapshot|zip|changelog)$"
)
_SST = re.compile(r"^state/0/(?P<p>\d+)/SSTs/[^/]+\.sst$")
_SOURCE = re.compile(r"^sources/0/(?P<k>\d+)(?P<c>\.compact)?$")
_LOG = re.compile(r"^(?P<log>offsets|commits)/(?P<b>\d+)$")
_INPUT = re.compile(r"^(?P<prefix>.*/)(?P<n>\d{5})\.json$")


def file_key(n: int) -> int:
    return n % KEYS


def file_value(n: int) -> int:
    return (n * 37) % 11 + 1


def partition_of(key: int) -> int:
    return key % PARTITIONS


@functools.lru_cache(maxsize=4096)
def reference(files: frozenset[int]) -> list[dict[int, int]]:
    """The state (per partition: key -> sum) after processing `files`, in any batches."""
    out: list[dict[int, int]] = [{} for _ in range(PARTITIONS)]
    for n in files:
        k = file_key(n)
        part = out[partition_of(k)]
        part[k] = part.get(k, 0) + file_value(n)
    return out


class QueryFailed(Exception):
    """The simulated query failed (a storage error, a file its restart cannot load): the
    driver stops, as Spark's does."""


class SparkFS:
    """Spark's view of the simulated storage: a transient failure is retried (Hadoop's
    client and Spark's task retries), up to three tries, before the query fails."""

    def __init__(self, storage: SimStorage) -> None:
        self.storage = storage
        self.root = storage.root

    def _try(self, fn: Callable[[], Any]) -> Any:
        for attempt in range(3):
            try:
                return fn()
            except InjectedFault:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def stat(self, key: str) -> Any:
        return self._try(lambda: self.storage.stat(key))

    def read(self, key: str) -> bytes:
        return self._try(lambda: self.storage.read(key))  # type: ignore[no-any-return]

    def write(self, key: str, data: bytes) -> None:
        self._try(lambda: self.storage.write(key, data))

    def list(self, prefix: str) -> Any:
        return self._try(lambda: list(self.storage.list(prefix)))

    def delete_many(self, keys: builtins.list[str]) -> None:
        self._try(lambda: self.storage.delete_many(keys))


@dataclass
class Instance:
    """A partition's store as an executor holds it (Spark's loaded provider)."""

    version: int
    state: dict[int, int]
    #: RocksDB: the SSTs of the newest zip it loaded or wrote (reused by its next zip).
    ssts: list[str] = field(default_factory=list)
    zip_state: dict[int, int] = field(default_factory=dict)
    last_snapshot: int = 0
    #: Format v2: (version, unique id) from its last snapshot on; the id of each version.
    lineage: list[tuple[int, str]] = field(default_factory=list)
    uid: str = ""


@dataclass
class Loc:
    """A checkpoint location: the query's, a savepoint, a rollback's kept savepoint."""

    name: str
    storage: SimStorage
    #: The model's record: batch -> the input files processed through it, as of its
    #: (last) commit; and what each source log entry it wrote held.
    committed: dict[int, frozenset[int]] = field(default_factory=dict)
    entries: dict[int, frozenset[int]] = field(default_factory=dict)
    #: A savepoint: its batch, once statehold reported it made; damaged on purpose.
    batch: int | None = None
    damaged: bool = False
    #: An unfinished rollback's target (batches after it are being removed).
    rolling_back: int | None = None
    #: The unfinished rollback has deleted something already.
    rollback_deleted: bool = False
    #: A rollback was interrupted and the query restarted without running it again.
    stale_rollback: bool = False
    retired: bool = False
    mut: int = 0
    checked: int = -1
    #: A rollback's keep location, or a savepoint: the record of the location it was made
    #: from, as it stood when that rollback's run (a rerun reports the first run's
    #: savepoint, of the timeline before) or that savepoint began. The location may have
    #: run on since, on another timeline: a rollback and the query's rerun may rewrite the
    #: batch a savepoint copies (seed 2200057: every file copied before the rollback
    #: deleted, the batch run again over one more input file).
    made_from: tuple[dict[int, frozenset[int]], dict[int, frozenset[int]], bool, bool] | None = (
        None)


class SparkWorld(Stepping):
    """The Spark world: the same scheduler, clock and simulated storage as `World`."""

    def __init__(self, seed: int, steps: int, *, list_lag: float = 0.0, faults: bool = True,
                 plant: str = "", provider: str | None = None, trace_len: int = 3000,
                 tolerate: frozenset[str] = frozenset(), move_rate: float = 0.15,
                 pause_rate: float = 0.002, operate_rate: float = 0.003,
                 snapshot_every: int = SNAPSHOT_EVERY, retain: int = RETAIN,
                 crash_rate: float = 0.002, rollback_crash: float = 0.08,
                 gc_race: float = 0.0) -> None:
        self.seed, self.steps = seed, steps
        self.rng = random.Random(seed)
        self.ids = random.Random(seed * 7 + 3)
        self.clock = SimClock()
        self.sched = Scheduler(self.clock)
        self.objects: dict[str, Any] = {}
        self.tombstones: dict[str, tuple[Any, float]] = {}
        self.page_size = 7
        self.list_lag = list_lag
        self.faults = faults
        self.plant = plant
        #: Violation kinds noted without stopping the run (holes being fixed elsewhere).
        self.tolerate = tolerate
        self.tolerated: dict[str, int] = {}
        #: How often a task runs on the other executor, a person's process is paused (a
        #: laptop closed mid-gc), the query is stopped for a rollback, relocate ...
        self.move_rate, self.pause_rate, self.operate_rate = move_rate, pause_rate, operate_rate
        self.snapshot_every = snapshot_every
        self.retain = retain
        self.crash_rate = crash_rate
        #: The chance that a rollback's process dies right after each of its deletes.
        self.rollback_crash = rollback_crash
        #: The share of the people's operations that are the race gc's re-check is for
        #: (`gc_beside_rerun`); 0 in the soak of record, whose runs it would change.
        self.gc_race = gc_race
        self.provider = provider or PROVIDERS[seed % len(PROVIDERS)]
        self.rates = {"list": 0.004, "read": 0.003, "write": 0.004, "delete": 0.01}
        self.step = 0
        self.trace: deque[str] = deque(maxlen=trace_len)
        self.violations: list[Violation] = []
        self.counts: dict[str, int] = {}
        self.processes: list[Process] = []
        self._serial = 0
        #: The meaning of every byte string the model's Spark steps wrote.
        self.known: dict[bytes, tuple[Any, ...]] = {}
        self.written: dict[str, float] = {}
        self.deleted: dict[str, tuple[str, str, float]] = {}
        #: Older committed batches Spark's own retention made unrestartable (location,
        #: batch): not checked again.
        self.spark_lost: set[tuple[str, int]] = set()
        #: SSTs a zip named though no zip held them any more (`note_orphan_reuse`).
        self.orphan_reuse: set[str] = set()
        self.locs: dict[str, Loc] = {}
        self.live = self.new_loc("ckpt")
        self.savepoints: list[Loc] = []
        self.arrived = 2
        #: Where the input directory is (relocate moves it, then the location follows).
        self.input_prefix = INPUTS[0]
        self.relocate_due = False
        #: The query is started again as soon as a rollback is done (`gc_beside_rerun`).
        self.restart_due = False
        #: A person's operation that needs the query stopped, to run (again).
        self.pending: tuple[str, Any] | None = None
        self.quiet = False

    # -- bookkeeping ---------------------------------------------------------------------
    def count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    def log(self, line: str) -> None:
        self.trace.append(f"#{self.step} t={self.clock.t - 1_700_000_000.0:.3f} {line}")

    def violate(self, kind: str, message: str, loc: Loc | None = None) -> None:
        if kind in self.tolerate:
            self.tolerated[kind] = self.tolerated.get(kind, 0) + 1
            self.log(f"ENV TOLERATED {kind}: {message}")
            if loc is not None:
                loc.damaged = True  # what follows from it is not checked either
            return
        self.violations.append(Violation(self.step, kind, message))
        self.log(f"VIOLATION {kind}: {message}")

    def name(self, prefix: str) -> str:
        self._serial += 1
        return f"{prefix}{self._serial}"

    def uuid(self) -> str:
        import uuid

        return str(uuid.UUID(int=self.ids.getrandbits(128), version=4))

    def new_loc(self, name: str) -> Loc:
        loc = Loc(name, SimStorage(self, name))  # type: ignore[arg-type]
        self.locs[loc.storage.root] = loc
        return loc

    def loc_of(self, full: str) -> Loc | None:
        return self.locs.get(full.split("/", 1)[0] + "/")

    def remember(self, data: bytes, meaning: tuple[Any, ...]) -> bytes:
        self.known[hashlib.sha1(data).digest()] = meaning
        return data

    def meaning(self, data: bytes) -> tuple[Any, ...] | None:
        return self.known.get(hashlib.sha1(data).digest())

    def actor_name(self) -> str:
        a = self.sched.current()
        return a.name if a is not None else "main"

    # -- storage hooks (called by SimStorage) ---------------------------------------------
    def before_op(self, storage: SimStorage, kind: str, method: str, keys: list[str]) -> None:
        actor = self.sched.current()
        if actor is None:
            return
        if actor.process.data.get("slow"):
            # a gc over a large location: minutes between its listing and its deletes
            self.clock.sleep(self.rng.uniform(0, 10))
        if actor.process.data.get("judging") and (method == "delete" or (
                method == "stat" and keys[0].endswith("/_statehold_rollback"))):
            # a gc over 100,000s of files: minutes between its listing and judging and its
            # first batch of deletes (its re-check first: the mark's stat)
            actor.process.data["judging"] = False
            self.clock.sleep(self.rng.uniform(60, 600))
        self.sched.point(f"{method} {keys[0]}")
        self.clock.advance(self.rng.expovariate(1 / 0.005))
        self.log(f"{self.actor_name()} {method} {' '.join(keys[:3])}")
        per_call = kind != "delete" or method == "delete_prefix"
        if self.faults and per_call and self.rng.random() < self.rates[kind]:
            self.log("  -> transient failure")
            # (the process knows which read failed: a refusal naming it is explained)
            actor.process.data.setdefault("failed_keys", set()).add(
                keys[0][len(storage.root):])
            raise InjectedFault(f"{method} {keys[0]}: transient failure (simulated)")

    def forget(self, full: str) -> None:
        o = self.objects.pop(full, None)
        if o is not None and self.list_lag:
            self.tombstones[full] = (o, self.clock.t)

    def lagged_listing(self, base: str, after: str, before: float) -> dict[str, Any]:
        for k in [k for k, (_o, t) in self.tombstones.items() if t < before]:
            del self.tombstones[k]
        shown = {k: o for k, o in self.objects.items()
                 if k.startswith(base) and k > after and o.created < before}
        for k, (o, _t) in self.tombstones.items():
            if k.startswith(base) and k > after and k not in shown:
                shown[k] = o
        return shown

    def delete_fault(self, full: str) -> BaseException | None:
        if self.faults and self.sched.current() is not None and self.rng.random() < self.rates[
            "delete"
        ]:
            return InjectedFault(f"{full}: transient delete failure (simulated)")
        return None

    def after_op(self, storage: SimStorage, method: str, keys: list[str], page: Any) -> None:
        if method not in ("write", "create", "delete"):
            return
        for full in keys:
            loc = self.loc_of(full)
            if loc is not None:
                loc.mut += 1
            if method != "delete":
                self.written[full] = self.clock.t
        if (self.faults and method != "delete" and self.sched.current() is not None
                and self.rng.random() < 0.003):
            self.log("  -> landed, but reported a failure")
            raise InjectedFault(f"{keys[0]}: timed out (the write landed; simulated)")

    def about_to_delete(self, storage: SimStorage, fulls: list[str]) -> None:
        actor = self.sched.current()
        who = actor.process.kind if actor is not None else "main"
        name = actor.name if actor is not None else "main"
        for full in fulls:
            self.deleted[full] = (who, name, self.clock.t)
        if actor is not None and who == "rollback" and fulls:
            loc = self.loc_of(fulls[0])
            if loc is not None and loc.rolling_back is not None:
                loc.rollback_deleted = True
            if actor.process.data.get("may_crash") and self.rng.random() < self.rollback_crash:
                # the crash lands right after this delete (any of them, over the seeds)
                self.log(f"ENV crash {actor.process.name} after deleting {fulls[0]}")
                self.count("rollback-interrupted")
                self.sched.kill(actor.process)

    # -- the model's reading of a location (no scheduler points, no faults) ---------------
    def index(self, loc: Loc) -> dict[str, Any]:
        """A location's files by what they are, from the objects themselves."""
        root = loc.storage.root
        out: dict[str, Any] = {"offsets": {}, "commits": {}, "sources": {}, "state": {},
                               "ssts": {}}
        for full, obj in self.objects.items():
            if not full.startswith(root):
                continue
            key = full[len(root):]
            if m := _LOG.match(key):
                out[m["log"]][int(m["b"])] = obj.data
            elif m := _SOURCE.match(key):
                out["sources"][int(m["k"])] = (key, obj.data)
            elif m := _STATE.match(key):
                out["state"][(int(m["p"]), int(m["v"]), m["u"], m["ext"])] = (key, obj.data)
            elif _SST.match(key):
                out["ssts"][key] = obj.data
        return out

    def missing(self, loc: Loc, key: str, needed_by: str = "") -> tuple[str, str]:
        """(violation kind or '' when Spark's own retention explains it, the story)."""
        full = loc.storage.root + key
        gone = self.deleted.get(full)
        if gone is None:
            if loc.batch is not None or full not in self.written:
                kind = "savepoint-source-log" if key.startswith("sources/") else (
                    "savepoint-incomplete")
                return kind, f"{key} was never written to {loc.name}"
            return "restart-broken", f"{key} is gone (not deleted: never there?)"
        who, actor, t = gone
        if needed_by:
            made = self.written.get(loc.storage.root + needed_by, 0.0)
            if full in self.orphan_reuse and who != "rollback":
                return "spark-bug", (f"{needed_by} names {key}, which the store's newest "
                                     f"zip did not name when it was written; {actor} deleted "
                                     f"it at {t - 1.7e9:.3f} (SPARK-55892: an executor reused "
                                     "an SST of its old zip after a reload)")
            if made > t and who != "rollback":
                return "spark-bug", (f"{needed_by} (written at {made - 1.7e9:.3f}) names {key}, "
                                     f"which {actor} had deleted at {t - 1.7e9:.3f} "
                                     "(SPARK-55892: a reused SST deleted by another "
                                     "executor's cleanup)")
        if who in SPARK_KINDS:
            return "spark-deleted", f"{key} deleted by Spark ({actor})"
        return "restart-broken", f"{key} deleted by {actor} at {t - 1.7e9:.3f}"

    def source_files(self, loc: Loc, idx: dict[str, Any], upto: int,
                     problems: list[tuple[str, str]]) -> frozenset[int] | None:
        """The input files of source log entries 0..`upto`, read as a restart reads the
        log: the newest ``C.compact`` and every entry after it up to the newest entry;
        every entry up to `upto` must be readable."""
        sources = idx["sources"]
        if not sources and upto < 0:
            return frozenset()
        newest = max(sources, default=-1)
        if upto > newest:
            problems.append(self.missing(loc, f"sources/0/{upto}"))
            return None
        compact = max((k for k, (key, _d) in sources.items() if key.endswith(".compact")),
                      default=-1)
        chain = range(compact + 1, newest + 1)
        gaps = [k for k in chain if k not in sources]
        if gaps:
            problems.append(self.missing(loc, f"sources/0/{gaps[0]}"))
            return None
        got: set[int] = set()
        by_entry: dict[int, set[int]] = {}
        for k in [compact, *chain] if compact >= 0 else chain:
            for n, b, _prefix in parse_entries(sources[k][1]):
                by_entry.setdefault(b, set()).add(n)
        missing = [k for k in range(0, upto + 1) if k not in by_entry]
        if missing and not (compact >= 0 and all(k <= compact for k in missing)):
            problems.append(self.missing(loc, f"sources/0/{missing[0]}"))
            return None
        for b, ns in by_entry.items():
            if b <= upto:
                got |= ns
        return frozenset(got)

    def restart_read(self, loc: Loc, idx: dict[str, Any], batch: int,
                     problems: list[tuple[str, str]]) -> tuple[frozenset[int] | None,
                                                                list[dict[int, int]] | None]:
        """What a restart after committed `batch` reads: the input files its offsets say
        it processed and each partition's state (None where a file is missing; the
        reasons in `problems`)."""
        needs_logs = [("offsets", batch), ("commits", batch)] + (
            [("offsets", batch - 1)] if batch > 0 else [])
        for log, b in needs_logs:
            if b not in idx[log]:
                problems.append(self.missing(loc, f"{log}/{b}"))
        if problems:
            return None, None
        offs = parse_offset(idx["offsets"][batch])
        files = self.source_files(loc, idx, offs, problems)
        uids = parse_commit_ids(idx["commits"][batch])
        states: list[dict[int, int]] = []
        for p in range(PARTITIONS):
            st = self.load(loc, idx, p, batch + 1, uids[p] if uids else None, problems)
            if st is None:
                return files, None
            states.append(st)
        return files, states

    def load(self, loc: Loc, idx: dict[str, Any], p: int, version: int, uid: str | None,
             problems: list[tuple[str, str]]) -> dict[int, int] | None:
        """Version `version` of partition `p`'s store, by Spark's rules."""
        state = idx["state"]
        if version == 0:
            return {}
        if uid is not None:
            return self._load_v2(loc, idx, p, version, uid, problems)
        snap_ext, step_ext = ("snapshot", "delta") if self.provider == "hdfs" else (
            "zip", "changelog")
        bases = [v for (q, v, u, e) in state if q == p and e == snap_ext and v <= version
                 and u is None]
        base = max(bases, default=0)
        out: dict[int, int] = {}
        if base:
            got = self._snapshot(loc, idx, state[(p, base, None, snap_ext)], problems)
            if got is None:
                return None
            out = got
        for v in range(base + 1, version + 1):
            f = state.get((p, v, None, step_ext))
            if f is None:
                problems.append(self.missing(loc, f"state/0/{p}/{v}.{step_ext}"))
                return None
            m = self.meaning(f[1])
            if m is None:
                problems.append(("unknown-bytes", f"{f[0]}: bytes the model never wrote"))
                return None
            out.update(m[1])
        return out

    def _snapshot(self, loc: Loc, idx: dict[str, Any], f: tuple[str, bytes],
                  problems: list[tuple[str, str]]) -> dict[int, int] | None:
        m = self.meaning(f[1])
        if m is None:
            problems.append(("unknown-bytes", f"{f[0]}: bytes the model never wrote"))
            return None
        if m[0] in ("full", "changes"):  # (a snapshot's bytes may equal a delta's)
            return dict(m[1])
        out: dict[int, int] = {}
        store = f[0].rsplit("/", 1)[0]
        for sst in m[1]:
            data = idx["ssts"].get(f"{store}/SSTs/{sst}")
            if data is None:
                problems.append(self.missing(loc, f"{store}/SSTs/{sst}", needed_by=f[0]))
                return None
            out.update(self.meaning(data)[1])  # type: ignore[index]
        return out

    def _load_v2(self, loc: Loc, idx: dict[str, Any], p: int, version: int, uid: str,
                 problems: list[tuple[str, str]]) -> dict[int, int] | None:
        state = idx["state"]
        own_zip = state.get((p, version, uid, "zip"))
        if own_zip is not None:
            return self._snapshot(loc, idx, own_zip, problems)
        own = state.get((p, version, uid, "changelog"))
        if own is None:
            problems.append(self.missing(loc, f"state/0/{p}/{version}_{uid}.changelog"))
            return None
        m = self.meaning(own[1])
        if m is None:
            problems.append(("unknown-bytes", f"{own[0]}: bytes the model never wrote"))
            return None
        chain = [tuple(x) for x in m[2]]
        based = [(v, u) for v, u in chain if (p, v, u, "zip") in state]
        out: dict[int, int] = {}
        base = 0
        if based:
            base, bu = max(based)
            got = self._snapshot(loc, idx, state[(p, base, bu, "zip")], problems)
            if got is None:
                return None
            out = got
        elif chain and chain[0][0] > 1:
            problems.append(self.missing(loc, f"state/0/{p}/{chain[0][0]}_{chain[0][1]}.zip"))
            return None
        for v, u in [*[(v, u) for v, u in chain if v > base], (version, uid)]:
            f = state.get((p, v, u, "changelog"))
            if f is None:
                problems.append(self.missing(loc, f"state/0/{p}/{v}_{u}.changelog"))
                return None
            out.update(self.meaning(f[1])[1])  # type: ignore[index]
        return out

    # -- the invariants ------------------------------------------------------------------
    def check(self) -> None:
        for loc in [self.live, *self.savepoints]:
            if loc.retired or loc.damaged or loc.mut == loc.checked:
                continue
            loc.checked = loc.mut
            self.check_loc(loc)

    def check_loc(self, loc: Loc) -> None:
        idx = self.index(loc)
        commits = sorted(idx["commits"])
        if not commits:
            return
        newest = commits[-1]
        if loc is not self.live:
            if loc.batch is None or loc.damaged:
                return
            self.check_batch(loc, idx, newest, must=True)
            return
        # batches after an unfinished rollback's target (its mark says which, if the
        # model's person lost track; the lower of the two when a later rollback to
        # another batch was begun, and refused, while the mark was there) are being
        # removed: not checked
        targets = [t for t in (loc.rolling_back, self.marked(loc)) if t is not None]
        target = min(targets, default=None)
        for b in commits:
            if target is not None and b > target:
                continue
            must = b in (newest, target)
            self.check_batch(loc, idx, b, must=must)

    def check_batch(self, loc: Loc, idx: dict[str, Any], batch: int, must: bool) -> None:
        problems: list[tuple[str, str]] = []
        files, states = self.restart_read(loc, idx, batch, problems)
        if not must and (loc.name, batch) in self.spark_lost:
            return
        if not must and any(kind == "spark-deleted" for kind, _story in problems):
            # Spark's retention let this older batch go: what else goes of it is moot
            self.spark_lost.add((loc.name, batch))
            return
        for kind, story in problems:
            if kind == "spark-deleted":
                if must and loc is self.live and self.provider != "" and batch == max(
                        idx["commits"]):
                    self.violate("spark-bug", f"{loc.name} batch {batch}: {story}, which its "
                                 "restart needs")
                    return
                continue
            what = "savepoint" if loc.batch is not None else "location"
            self.violate(kind, f"{what} {loc.name}, restart after batch {batch}: {story}", loc)
            return
        if files is None or states is None:
            return
        recorded = loc.committed.get(batch)
        if recorded is not None and files != recorded:
            self.violate("source-log", f"{loc.name} batch {batch}: its log names "
                         f"{len(files)} files, the batch had processed {len(recorded)}", loc)
            return
        want = reference(files)
        if states != want:
            kind = "stale-after-rollback" if loc.stale_rollback else "state"
            self.violate(kind, f"{loc.name} batch {batch}: a restart loads {states}, the "
                         f"batch had {want}", loc)

    # -- actors --------------------------------------------------------------------------
    def spawn_process(self, kind: str, fn: Callable[[Process], None]) -> Process:
        proc = Process(self.name(kind), kind)
        self.processes.append(proc)
        self.log(f"ENV start {proc.name}")
        self.count(f"start-{kind}")

        def run() -> None:
            try:
                fn(proc)
            finally:
                proc.done = True

        self.sched.spawn(proc, proc.name, run, self._actor_error)
        return proc

    def _actor_error(self, actor: Actor, e: BaseException) -> None:
        if isinstance(e, (StateholdError, QueryFailed)):
            self.log(f"{actor.name} stopped: {type(e).__name__}: {e}")
            if actor.process.kind == "query":
                self.count("query-failed")
            return
        self.violate("unexpected-exception",
                     f"{actor.name}: {type(e).__name__}: {e}\n{actor.error_trace}")

    def alive(self, kind: str | None = None) -> list[Process]:
        return [p for p in self.processes
                if not p.killed and not p.done and (kind is None or p.kind == kind)]

    # -- the query -----------------------------------------------------------------------
    def query(self, proc: Process) -> None:
        loc: Loc = proc.data["loc"]
        st = SparkFS(loc.storage)
        try:
            self._query(proc, loc, st)
        except StorageError as e:
            raise QueryFailed(str(e)) from None
        except QueryFailed:
            if proc.data.get("after_rollback") is not None and loc.rolling_back is not None:
                # a restart after a half-done rollback fails: noticed, it is run again
                self.pending = ("rollback", loc.rolling_back)
            raise

    def _list(self, st: SparkFS, prefix: str) -> list[str]:
        return sorted(i.key for i in st.list(prefix))

    def _query(self, proc: Process, loc: Loc, st: SparkFS) -> None:
        if st.stat("metadata") is None:
            st.write("metadata", json.dumps({"id": self.uuid()}).encode())
        op_meta = "state/0/_metadata/metadata"
        if st.stat(op_meta) is None:
            info = {"operatorInfo": {"operatorId": 0, "operatorName": "stateStoreSave"},
                    "stateStoreInfo": [{"storeName": "default", "numColsPrefixKey": 0,
                                        "numPartitions": PARTITIONS}]}
            st.write(op_meta, f"v1\n{json.dumps(info)}".encode())
        offsets = [int(k.rsplit("/", 1)[1]) for k in self._list(st, "offsets")
                   if _LOG.match(k)]
        commits = [int(k.rsplit("/", 1)[1]) for k in self._list(st, "commits")
                   if _LOG.match(k)]
        lo, lc = max(offsets, default=-1), max(commits, default=-1)
        # the file source restores its log: the newest compact and every entry after it
        log_keys = {int(m["k"]): k for k in self._list(st, "sources/0")
                    if (m := _SOURCE.match(k))}
        kmax = max(log_keys, default=-1)
        compact = max((k for k, key in log_keys.items() if key.endswith(".compact")),
                      default=-1)
        seen: set[int] = set()
        for k in range(compact if compact >= 0 else 0, kmax + 1):
            if k not in log_keys:
                raise QueryFailed(f"sources/0/{k}: missing (the source log cannot be read)")
            for n, _b, prefix in parse_entries(st.read(log_keys[k])):
                if (prefix != self.input_prefix and not proc.data.get("bound")
                        and not loc.damaged):
                    proc.data["bound"] = True
                    self.violate("relocate", f"{log_keys[k]} names {prefix}: the input moved "
                                 f"to {self.input_prefix} (a restart reads the file again)")
                seen.add(n)
        if lo > lc:
            batch = lo
            end: int | None = parse_offset(st.read(f"offsets/{lo}"))
            start = parse_offset(st.read(f"offsets/{lo - 1}")) if lo > 0 else -1
        else:
            batch, end = lc + 1, None
            start = parse_offset(st.read(f"offsets/{lc}")) if lc >= 0 else -1
        proc.data["after_rollback"] = loc.rolling_back
        self.log(f"{proc.name} restarts at batch {batch} (log offset {start}, newest entry "
                 f"{kmax})")
        while True:
            if end is None:
                new = [n for n in range(self.arrived) if n not in seen][:MAX_FILES_PER_TRIGGER]
                if new:
                    k = kmax + 1
                    self.write_entry(loc, st, k, new, log_keys)
                    log_keys[k] = f"sources/0/{k}" + (".compact" if (k + 1) % COMPACT == 0
                                                      else "")
                    kmax = k
                    seen |= set(new)
                if kmax <= start:
                    self.clock.sleep(self.rng.uniform(0.5, 3.0))  # no new data: no batch
                    continue
                end = kmax
                conf = {"spark.sql.streaming.minBatchesToRetain": str(self.retain)}
                if self.provider == "hdfs":
                    conf["spark.sql.streaming.stateStore.providerClass"] = "hdfs"
                self.write(st, f"offsets/{batch}", offsets_file(batch, [{"logOffset": end}],
                                                                conf), ("offsets", end))
            files = self.read_entries(loc, st, start, end, log_keys)
            uids = [self.task(proc, loc, st, p, batch, files) for p in range(PARTITIONS)]
            ids = {"0": [[u] for u in uids]} if self.provider == "rocksdb-v2" else None
            self.write(st, f"commits/{batch}", commit_file(batch, ids), ("commit", batch))
            loc.committed[batch] = frozenset(
                n for k, ns in loc.entries.items() if k <= end for n in ns)
            if loc.rolling_back is not None:
                # the query ran again with a rollback left half done: nobody noticed
                loc.rolling_back = None
                loc.rollback_deleted = False
                loc.stale_rollback = True
            self.count("batch")
            self.purge(st, batch)
            start, end, batch = end, None, batch + 1

    def write(self, st: SparkFS, key: str, data: bytes, meaning: tuple[Any, ...]) -> None:
        self.remember(data, meaning)
        st.write(key, data)

    def write_entry(self, loc: Loc, st: SparkFS, k: int, new: list[int],
                    log_keys: dict[int, str]) -> None:
        """`latestOffset`: the file source's log entry K (a compaction every COMPACT)."""
        loc.entries[k] = frozenset(new)
        rows = [(f"{self.input_prefix}{n:05d}.json", k) for n in new]
        if (k + 1) % COMPACT:
            self.write(st, f"sources/0/{k}", file_log(rows), ("entry", k))
            return
        prev = max((b for b, key in log_keys.items() if key.endswith(".compact")), default=-1)
        old: list[tuple[str, int]] = []
        for b in range(max(prev, 0), k):
            if b not in log_keys:
                raise QueryFailed(f"sources/0/{b}: missing (compaction cannot read it)")
            old += [(f"{p}{n:05d}.json", bb) for n, bb, p in parse_entries(st.read(log_keys[b]))]
        self.write(st, f"sources/0/{k}.compact", file_log(old + rows), ("compact", k))
        # Spark's expiry of old log files (`deleteExpiredLog`, cleanup delay 0 here)
        expired = [key for b, key in log_keys.items() if b < k - COMPACT]
        if expired:
            st.delete_many(expired)
            for key in expired:
                log_keys.pop(int(_SOURCE.match(key)["k"]))  # type: ignore[index]

    def read_entries(self, loc: Loc, st: SparkFS, start: int, end: int,
                     log_keys: dict[int, str]) -> set[int]:
        """`getBatch`: the files of entries start+1..end (from a compact where needed)."""
        out: set[int] = set()
        cache: dict[str, list[tuple[int, int, str]]] = {}
        for k in range(start + 1, end + 1):
            key = log_keys.get(k)
            if key is None:
                compacts = [b for b, kk in log_keys.items() if kk.endswith(".compact") and b >= k]
                if not compacts:
                    raise QueryFailed(f"sources/0/{k}: missing")
                key = log_keys[min(compacts)]
            if key not in cache:
                cache[key] = parse_entries(st.read(key))
            out |= {n for n, b, _p in cache[key] if b == k}
        return out

    def task(self, proc: Process, loc: Loc, st: SparkFS, p: int, batch: int,
             files: set[int]) -> str:
        """Batch `batch`'s task of partition `p`: load version `batch`, apply, write
        version batch+1. Returns the unique id it wrote (format v2)."""
        # Two executors: a partition's task runs where its store is loaded, now and then
        # on the other one (a retry, a lost executor), which loads it from the location.
        where: dict[int, int] = proc.data["where"]
        if self.rng.random() < self.move_rate:
            where[p] = 1 - where.get(p, 0)
            self.count("store-moved")
        insts: dict[int, Instance] = proc.data["inst"][where.get(p, 0)]
        inst = insts.get(p)
        if inst is None or inst.version != batch:
            old = inst
            inst = insts[p] = self.task_load(st, p, batch)
            if old is not None and self.plant == "spark-55892":
                # SPARK-55892: the executor keeps its file mapping from before the reload
                # and its next snapshot names SSTs of its old zip without uploading them,
                # though another executor's cleanup may have deleted them since
                inst.ssts, inst.zip_state = old.ssts, old.zip_state
                if any(st.root + f"state/0/{p}/SSTs/{n}" not in self.objects for n in old.ssts):
                    self.count("stale-sst-mapping")
        proc.data["active"][p] = inst
        changes: dict[int, int] = {}
        for n in sorted(files):
            k = file_key(n)
            if partition_of(k) == p:
                changes[k] = changes.get(k, inst.state.get(k, 0)) + file_value(n)
        v = batch + 1
        pairs: list[tuple[bytes, bytes | None]] = [
            (b"k%d" % k, b"%d" % val) for k, val in sorted(changes.items())]
        prefix = f"state/0/{p}"
        uid = ""
        attempts = 2 if self.rng.random() < 0.15 else 1
        if self.provider == "rocksdb-v2":
            lineage = list(inst.lineage)
            ids = [self.uuid() for _ in range(attempts)]
            uid = self.rng.choice(ids)  # the attempt the driver hears of first
            for u in ids:
                data = lz4_stream(records(pairs, header=lineage_header(lineage)))
                self.write(st, f"{prefix}/{v}_{u}.changelog", data,
                           ("changes", dict(changes), tuple(lineage)))
        else:
            ext = "delta" if self.provider == "hdfs" else "changelog"
            for _ in range(attempts):
                self.write(st, f"{prefix}/{v}.{ext}", lz4_stream(records(pairs)),
                           ("changes", dict(changes)))
        inst.state = {**inst.state, **changes}
        inst.version = v
        inst.uid = uid
        if uid:
            inst.lineage = [*inst.lineage, (v, uid)]
        return uid

    def task_load(self, st: SparkFS, p: int, version: int) -> Instance:
        """A task on an executor without the store loads it from the location."""
        if version == 0:
            return Instance(0, {})
        loc: Loc = self.live
        uid = None
        if self.provider == "rocksdb-v2":
            ids = parse_commit_ids(st.read(f"commits/{version - 1}"))
            uid = ids[p] if ids else None
        for _ in self._list(st, f"state/0/{p}"):
            pass  # Spark lists the store's directory (a scheduler point per page)
        problems: list[tuple[str, str]] = []
        got = self.load(loc, self.index(loc), p, version, uid, problems)
        if got is None:
            raise QueryFailed(f"partition {p} cannot load version {version}: {problems[0][1]}")
        inst = Instance(version, got, uid=uid or "")
        inst.zip_state = dict(got)  # (its next zip reuses nothing: it uploads all)
        # Spark snapshots again once enough deltas/changelogs follow the newest snapshot
        # the location holds (not right after a load)
        snap_ext = "snapshot" if self.provider == "hdfs" else "zip"
        inst.last_snapshot = max((v for (q, v, _u, e) in self.index(loc)["state"]
                                  if q == p and e == snap_ext and v <= version), default=0)
        if uid:
            # the lineage of the version it loaded, from its snapshot on, and itself
            state = self.index(loc)["state"]
            own = state.get((p, version, uid, "changelog"))
            meant = self.meaning(own[1]) if own and (p, version, uid, "zip") not in state else None
            chain: list[tuple[int, str]] = [(int(v), str(u)) for v, u in meant[2]] if meant else []
            based = [i for i, (v, u) in enumerate(chain) if (p, v, u, "zip") in state]
            start = based[-1] if based else 0
            inst.lineage = [*chain[start:], (version, uid)]
            inst.last_snapshot = inst.lineage[0][0] if based or not chain else 0
        return inst

    def purge(self, st: SparkFS, batch: int) -> None:
        """Spark's purge of the offsets and commit logs (`minBatchesToRetain`)."""
        threshold = batch + 1 - self.retain
        if threshold <= 0:
            return
        doomed = [f"{log}/{b}" for log in ("offsets", "commits")
                  for b in range(max(0, threshold - 3), threshold)]  # (what is left)
        present = [k for k in doomed if st.root + k in self.objects]
        if present:
            st.delete_many(present)

    # -- executors' maintenance ----------------------------------------------------------
    def maintenance(self, proc: Process) -> None:
        query: Process = proc.data["query"]
        loc: Loc = query.data["loc"]
        st = SparkFS(loc.storage)
        try:
            while True:
                self.clock.sleep(self.rng.uniform(2.0, 6.0))
                if query.done or query.killed:
                    return
                for p in range(PARTITIONS):
                    # (the instance of the executor the store is loaded on: Spark unloads
                    # the other's)
                    inst = query.data["active"].get(p)
                    if inst is not None and inst.version > 0:
                        self.snapshot(st, p, inst)
                        self.cleanup(st, p)
                proc.data["passes"] = proc.data.get("passes", 0) + 1
        except StorageError:
            return  # a maintenance task fails; the next one tries again

    def snapshot(self, st: SparkFS, p: int, inst: Instance) -> None:
        v, uid, state = inst.version, inst.uid, dict(inst.state)  # (the task moves on)
        if v - inst.last_snapshot < self.snapshot_every:
            return
        prefix = f"state/0/{p}"
        if self.provider == "hdfs":
            pairs: list[tuple[bytes, bytes | None]] = [
                (b"k%d" % k, b"%d" % x) for k, x in sorted(state.items())]
            self.write(st, f"{prefix}/{v}.snapshot", lz4_stream(records(pairs)),
                       ("full", state))
            inst.last_snapshot = v
            return
        changed = {k: x for k, x in state.items() if inst.zip_state.get(k) != x}
        compacted = self.rng.random() < 0.3 or not inst.ssts
        new = state if compacted else changed
        ssts = [] if compacted else list(inst.ssts)
        if new:
            self._serial += 1
            name = f"{self._serial:06d}-{self.uuid()}.sst"
            data = self.remember(json.dumps(sorted(new.items())).encode(), ("sst", dict(new)))
            st.write(f"{prefix}/SSTs/{name}", data)
            ssts.append(name)
        reused = ssts[:-1] if new else ssts
        self.note_orphan_reuse(st.root, prefix, reused)
        sizes = {n: len(self.objects[st.root + f"{prefix}/SSTs/{n}"].data)
                 if st.root + f"{prefix}/SSTs/{n}" in self.objects else 1 for n in ssts}
        data = snapshot_zip(sizes)
        stem = f"{v}_{uid}" if uid else str(v)
        self.write(st, f"{prefix}/{stem}.zip", data, ("zip", tuple(ssts)))
        inst.ssts, inst.zip_state, inst.last_snapshot = ssts, state, v
        if uid:
            inst.lineage = [(v, uid), *(x for x in inst.lineage if x[0] > v)]

    def note_orphan_reuse(self, root: str, prefix: str, reused: list[str]) -> None:
        """Reused SSTs the store's newest zip does not name: Spark reuses only those of
        the zip its executor wrote last, which is the newest while the store stays there
        (a reload starts afresh). A zip naming others is Spark's doing, whoever deletes
        them later (SPARK-55892)."""
        if not reused:
            return
        zips = [(int(_STATE.match(full[len(root):])["v"]), obj)  # type: ignore[index]
                for full, obj in self.objects.items()
                if full.startswith(root + prefix + "/") and full.endswith(".zip")
                and _STATE.match(full[len(root):])]
        newest = max(zips, key=lambda z: z[0], default=None)
        m = self.meaning(newest[1].data) if newest else None
        held = set(m[1]) if m else set()
        for n in reused:
            if n not in held:
                self.orphan_reuse.add(root + f"{prefix}/SSTs/{n}")

    def cleanup(self, st: SparkFS, p: int) -> None:
        """Spark's deletion of old versions (keeping `minBatchesToRetain`) and orphan SSTs."""
        prefix = f"state/0/{p}/"
        listed = [i.key for i in st.list(prefix.rstrip("/"))]
        versions: dict[int, list[str]] = {}
        snaps: set[int] = set()
        ssts: list[str] = []
        for key in listed:
            if m := _STATE.match(key):
                versions.setdefault(int(m["v"]), []).append(key)
                if m["ext"] in ("snapshot", "zip"):
                    snaps.add(int(m["v"]))
            elif _SST.match(key):
                ssts.append(key)
        if not versions:
            return
        earliest = max(versions) - self.retain
        if earliest <= 0:
            return
        base = max((v for v in snaps if v <= earliest), default=0)
        if not base:
            return
        doomed = [k for v, ks in versions.items() if v < base for k in ks]
        kept_zips = [k for v, ks in versions.items() if v >= base for k in ks
                     if k.endswith(".zip")]
        referenced: set[str] = set()
        for z in kept_zips:
            listed_by = self.meaning(st.read(z))
            referenced |= {f"{prefix}SSTs/{n}" for n in (listed_by[1] if listed_by else ())}
        doomed += [k for k in ssts if k not in referenced]
        if doomed:
            st.delete_many(doomed)

    # -- statehold's actors --------------------------------------------------------------
    def person(self, what: str, arg: Any = None) -> Callable[[Process], None]:
        def run(proc: Process) -> None:
            proc.data["what"] = what
            loc = self.live
            api = SparkCheckpointLocation(loc.storage)
            if what == "gc":
                try:
                    report = api.gc(grace_seconds=arg)
                except StateholdError as e:
                    if "went from" in str(e):
                        self.count("gc-stopped-by-recheck")
                    raise
                if report.changed:
                    self.count("gc-recheck-spared")
                if report.deleted:
                    self.count("gc-deleted")
            elif what == "savepoint":
                dest = self.new_loc(self.name("sp-"))
                dest.made_from = (dict(loc.committed), dict(loc.entries), loc.damaged,
                                  loc.stale_rollback)
                made = api.savepoint(dest.storage)  # type: ignore[arg-type]
                self.made_savepoint(loc, dest, made.batch,
                                    as_it_was=self.copied_as_it_was(loc, dest, made.batch))
            elif what == "verify":
                self.verify(arg)
            elif what == "rollback":
                try:
                    self.rollback(proc, loc, api, arg)
                except StateholdError as e:
                    refused = str(e).startswith(("cannot roll back", "the query looks alive"))
                    failed = self.refused_on_failed_read(proc, str(e))
                    if failed:
                        # a rerun refused because a file it must read could not be read
                        # (the storage failed right then): it deleted nothing, the mark
                        # stays and names it, and a later run finishes it (the quiet
                        # phase runs it again on healed storage and judges that run)
                        self.count("rollback-refused-on-read")
                    elif (str(e).startswith("cannot roll back") and arg == self.marked(loc)
                            and "interrupted" not in str(e) and not self.ran_on(loc)):
                        self.violate("rollback-stuck", f"{loc.name}: the mark of the rollback "
                                     f"to batch {arg} asks for it to be run again, which is "
                                     f"refused: {e}; gc, savepoint and relocate refuse while "
                                     "the mark is there", loc)
                    if refused and not loc.rollback_deleted:
                        # refused before any of its runs deleted anything: given up
                        loc.rolling_back = None
                        self.pending = None
                    raise
            elif what == "relocate":
                # the input has moved (`arg`: it moves now); the location follows it
                if arg == "move":
                    self.input_prefix = INPUTS[1] if self.input_prefix == INPUTS[0] else INPUTS[0]
                    self.relocate_due = True
                self.pending = None
                force = self.rng.random() < 0.5
                if not force:
                    self.clock.sleep(130.0)  # until the stopped query no longer looks alive
                old = INPUTS[1] if self.input_prefix == INPUTS[0] else INPUTS[0]
                try:
                    api.relocate(old, self.input_prefix, force=force)
                except StateholdError as e:
                    if "rollback" in str(e) and self.marked(loc) is not None:
                        # an unfinished rollback's mark: the person finishes it first
                        self.pending = ("rollback", self.marked(loc))
                    raise
                self.relocate_due = False
                self.log(f"{proc.name}: {loc.name} follows its input to {self.input_prefix}")
            proc.data["ok"] = True

        return run

    @staticmethod
    def refused_on_failed_read(proc: Process, message: str) -> bool:
        """Whether a refusal names a file whose read the simulation failed in this very
        process (`before_op`): the refusal is the storage's, not the location's."""
        return any(f"{key}: cannot be read" in message
                   for key in proc.data.get("failed_keys", ()))

    def ran_on(self, loc: Loc) -> bool:
        """Whether the query committed a batch above the mark's target after the mark was
        written (the model's own objects): the mark is then left behind, and any rollback
        is the way out, not the one it names."""
        mark = self.objects.get(loc.storage.root + "_statehold_rollback")
        target = self.marked(loc)
        if mark is None or target is None:
            return False
        prefix = loc.storage.root + "commits/"
        return any(
            key[len(prefix):].isdigit() and int(key[len(prefix):]) > target
            and obj.mtime > mark.mtime
            for key, obj in self.objects.items() if key.startswith(prefix)
        )

    def marked(self, loc: Loc) -> int | None:
        """The batch an unfinished rollback's mark names (what its message tells the
        person to run again), None without a mark."""
        obj = self.objects.get(loc.storage.root + "_statehold_rollback")
        if obj is None:
            return None
        try:
            return int(json.loads(obj.data)["to_batch"])
        except (ValueError, KeyError, TypeError):
            return None

    def copied_as_it_was(self, src: Loc, dest: Loc, batch: int) -> bool:
        """Whether savepoint `dest` holds `batch` as it stood when the savepoint began
        (`Loc.made_from`), where the location has since rewritten it: what a restart of
        the copy reads is that timeline's batch, not today's. A copy that is neither
        timeline's batch whole is judged against today's, and fails."""
        if dest.made_from is None:
            return False
        then, now = dest.made_from[0].get(batch), src.committed.get(batch)
        if then is None or then == now:
            return False
        files, _ = self.restart_read(dest, self.index(dest), batch, [])
        return files == then

    def made_savepoint(self, src: Loc, dest: Loc, batch: int, *, as_it_was: bool = False) -> None:
        """`as_it_was`: `src`'s record when `dest` was made (`Loc.made_from`), not now."""
        record = dest.made_from if as_it_was else None
        committed, entries, damaged, stale = record or (
            src.committed, src.entries, src.damaged, src.stale_rollback)
        dest.batch = batch
        dest.damaged, dest.stale_rollback = damaged, stale
        dest.committed = {b: f for b, f in committed.items() if b <= batch}
        dest.entries = dict(entries)
        dest.checked = -1
        self.savepoints.append(dest)
        self.log(f"savepoint {dest.name} of batch {batch} made")

    def verify(self, loc: Loc) -> None:
        before = loc.mut
        report = SparkCheckpointLocation(loc.storage).verify()
        if not report.ok or loc.retired or loc.mut != before:
            return
        idx = self.index(loc)
        if not idx["commits"]:
            return
        problems: list[tuple[str, str]] = []
        self.restart_read(loc, idx, max(idx["commits"]), problems)
        if problems:
            self.violate("verify-missed", f"verify of {loc.name} says ok; the model's "
                         f"restart: {problems[0][1]}", loc)

    def rollback(self, proc: Process, loc: Loc, api: SparkCheckpointLocation,
                 target: int) -> None:
        loc.rolling_back = target
        force = proc.data.get("force") or self.rng.random() < 0.5
        if not force:
            self.clock.sleep(130.0)  # the person waits until it no longer looks alive
        keep = self.new_loc(self.name("keep-"))
        keep.made_from = (dict(loc.committed), dict(loc.entries), loc.damaged,
                          loc.stale_rollback)
        report = api.rollback(target, keep=f"sim://{keep.name}", force=force)
        if report.kept is not None and report.kept_batch is not None:
            # the savepoint the first run of this rollback kept (a rerun's `keep` is unused)
            kept = self.locs.get(report.kept.removeprefix("sim://").rstrip("/") + "/")
            if kept is not None and kept not in self.savepoints and not kept.retired:
                self.made_savepoint(loc, kept, report.kept_batch, as_it_was=True)
        loc.committed = {b: f for b, f in loc.committed.items() if b <= target}
        loc.rolling_back = None
        loc.rollback_deleted = False
        self.pending = None
        loc.checked = -1
        self.log(f"{proc.name}: rolled back to batch {target}")
        if proc.data.get("restart"):
            self.restart_due = True  # (started by the environment, at its next step)

    def _open(self, uri: str, options: Any) -> SimStorage:
        name = uri.removeprefix("sim://").rstrip("/")
        found = self.locs.get(name + "/")
        return found.storage if found else self.new_loc(name).storage

    # -- the environment -----------------------------------------------------------------
    def stop_query(self) -> None:
        for p in self.alive():
            if p.kind in SPARK_KINDS:
                self.sched.kill(p)

    def start_query(self) -> None:
        q = self.spawn_process("query", self.query)
        q.data["loc"] = self.live
        q.data["inst"] = {0: {}, 1: {}}
        q.data["where"] = {}
        q.data["active"] = {}

        def maint(proc: Process) -> None:
            proc.data["query"] = q
            self.maintenance(proc)

        self.spawn_process("maintenance", maint)

    def committed_batches(self) -> list[int]:
        return sorted(self.index(self.live)["commits"])

    def environment(self) -> None:
        rng = self.rng
        running = [p for p in self.alive("query")]
        persons = [p for p in self.alive() if p.kind not in SPARK_KINDS]
        exclusive = [p for p in persons if p.data.get("exclusive")]
        if self.restart_due:
            self.restart_due = False
            if not running and not exclusive and not self.relocate_due:
                self.start_query()
                return
        if persons and rng.random() < self.pause_rate:
            p = rng.choice(persons)
            span = rng.uniform(1, 300)
            p.paused_until = self.clock.t + span
            self.log(f"ENV pause {p.name} for {span:.0f}s")
            self.count("pause-person")
        r = rng.random()
        if not running and not exclusive:
            if self.pending is not None and rng.random() < 0.05:
                what, arg = self.pending
                if what == "rollback" and rng.random() < 0.4 and not self.relocate_due:
                    # the interruption went unnoticed: the query is started again
                    self.log("ENV the interrupted rollback goes unnoticed")
                    self.pending = None
                    self.start_query()
                    return
                else:
                    self._exclusive(what, arg)
                    return
            elif self.pending is None and rng.random() < 0.05:
                if self.relocate_due:
                    self._exclusive("relocate", None)  # before the query starts again
                else:
                    self.start_query()
                return
        if r < self.crash_rate and running:
            self.log("ENV crash the query")
            self.count("crash")
            self.stop_query()
        elif r < self.crash_rate + 0.0035:
            if persons:
                p = rng.choice(persons)
                self.log(f"ENV crash {p.name}")
                self.count("crash-person")
                self.sched.kill(p)
        elif r < 0.05:
            self.arrived += rng.randint(1, 3)
        elif r < 0.054:
            grace = 3600.0 if running else rng.choice([0.0, 3600.0])
            self.spawn_process("gc", self.person("gc", grace))
        elif r < 0.057:
            self.spawn_process("savepoint", self.person("savepoint"))
        elif r < 0.059:
            done = [s for s in self.savepoints if not s.retired]
            damaged = [s for s in done if s.damaged]
            if done:
                pick = rng.choice(damaged if damaged and rng.random() < 0.5 else done)
                self.spawn_process("verify", self.person("verify", pick))
        elif r < 0.0605:
            self.damage()
        elif r < 0.0605 + self.operate_rate and not exclusive and self.pending is None:
            batches = self.committed_batches()
            if self.gc_race and len(batches) > 2 and rng.random() < self.gc_race:
                self.gc_beside_rerun(batches)
                return
            choice = rng.random()
            if choice < 0.55 and len(batches) > 2:
                # (the oldest retained batch cannot be restarted from: Spark purged the
                # offsets before it)
                target = rng.choice(batches[1:-1])
                self.stop_query()
                self._exclusive("rollback", target)
            elif choice < 0.7:
                self.stop_query()
                self._exclusive("relocate", "move")
            elif choice < 0.85:
                self.restart_from_savepoint()
            else:
                # a maintenance window: the query stopped, gc without grace, and maybe a
                # rollback beside it (two terminals), then the query starts again
                self.stop_query()
                self.clock.advance(rng.uniform(100, 4000))
                gc = self.spawn_process("gc", self.person("gc", 0.0))
                gc.data["slow"] = rng.random() < 0.5
                if len(batches) > 2 and rng.random() < 0.5:
                    self._exclusive("rollback", rng.choice(batches[1:-1]))
        elif 0.07 < r < 0.09:
            self.clock.advance(rng.uniform(0.5, 5))
        elif 0.09 < r < 0.1 and self.idle():
            # no input for a while: the query waits (a time jump only while every Spark
            # actor sleeps; an upload stalled past gc's grace is beyond its assumptions)
            self.clock.advance(rng.uniform(600, 5000))
            self.count("idle")

    def gc_beside_rerun(self, batches: list[int]) -> None:
        """The race gc's re-check is for: the query stopped, a gc without grace lists the
        location and judges it for minutes (a large one); meanwhile a rollback beside it
        deletes what the later batches wrote and the query, started again once it is
        done, reruns them, writing some of the files the gc judged deletable (a delta
        under a snapshot the rollback deleted) anew: then the gc deletes."""
        self.log("ENV gc beside a rollback and the query's rerun")
        self.count("gc-race")
        self.stop_query()
        self.clock.advance(self.rng.uniform(100, 4000))
        gc = self.spawn_process("gc", self.person("gc", 0.0))
        gc.data["judging"] = gc.data["race"] = True
        # a batch below the newest snapshot (or zip): its rerun writes that version's
        # delta or changelog anew, which the gc's listing judged superseded
        snaps = [v for (_p, v, _u, ext) in self.index(self.live)["state"]
                 if ext in ("snapshot", "zip")]
        below = [b for b in batches[1:-1] if any(b + 1 < v <= batches[-1] + 1 for v in snaps)]
        marked = self.marked(self.live)  # (an unfinished one is finished first)
        self._exclusive("rollback", marked if marked is not None else self.rng.choice(
            below or batches[1:-1]))
        rollback = self.alive("rollback")[-1]
        rollback.data["force"] = rollback.data["restart"] = rollback.data["race"] = True

    def idle(self) -> bool:
        if any(p.data.get("race") for p in self.alive()):
            return False  # (`gc_beside_rerun`: its timing is the gc's judging, not a lull)
        return all(a.state == "parked" and a.what.startswith("sleep")
                   for a in self.sched.actors if a.process.kind in SPARK_KINDS
                   and not a.process.killed and a.state != "done")

    def _exclusive(self, what: str, arg: Any) -> None:
        self.pending = (what, arg)
        proc = self.spawn_process(what, self.person(what, arg))
        proc.data["exclusive"] = True
        if what == "rollback" and self.faults:
            proc.data["may_crash"] = True

    def damage(self) -> None:
        """A file of a savepoint is lost (a person's mistake): verify must say so."""
        done = [s for s in self.savepoints if not s.retired and not s.damaged]
        if not done:
            return
        loc = self.rng.choice(done)
        keys = sorted(k for k in self.objects if k.startswith(loc.storage.root)
                      and (_SOURCE.match(k[len(loc.storage.root):])
                           or _STATE.match(k[len(loc.storage.root):])))
        if not keys:
            return
        sources = [k for k in keys if "/sources/" in k]
        key = self.rng.choice(sources if sources and self.rng.random() < 0.6 else keys)
        loc.damaged = True
        loc.mut += 1
        self.forget(key)
        self.deleted[key] = ("damage", "ENV", self.clock.t)
        self.log(f"ENV damage {key}")
        self.count("damage")

    def restart_from_savepoint(self) -> None:
        done = [s for s in self.savepoints if not s.retired and not s.damaged]
        if not done:
            return
        sp = self.rng.choice(done)
        self.stop_query()
        self.log(f"ENV the query restarts from savepoint {sp.name} (batch {sp.batch})")
        self.count("restart-from-savepoint")
        self.live.retired = True
        self.savepoints.remove(sp)
        sp.batch = None
        self.live = sp
        sp.checked = -1
        self.relocate_due = True  # (a no-op unless the input moved since)

    # -- running -------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        previous_clock = statehold.clock.use(self.clock)
        saved_open = statehold.spark_checkpoints.rollback._open
        statehold.spark_checkpoints.rollback._open = self._open
        undo = self._plant()
        try:
            try:
                while self.step < self.steps:
                    self.grant_one(env=True)
                self.quiesce()
            except Stop:
                pass
        finally:
            for p in self.processes:
                self.sched.kill(p)
            try:
                self.sched.unwind_killed()
            except Exception:  # noqa: BLE001 - the run is over either way
                traceback.print_exc()
            statehold.clock.use(previous_clock)
            statehold.spark_checkpoints.rollback._open = saved_open
            undo()
        return self.result()

    def _plant(self) -> Callable[[], None]:
        """Switch on the planted bug `plant` names (`PLANTS`); returns how to undo it."""
        if not self.plant:
            return lambda: None
        _what, _kinds, patches, _options = PLANTS[self.plant]
        saved = []
        for module, attr, make in patches:
            import importlib

            owner = importlib.import_module(module)
            real = getattr(owner, attr)
            saved.append((owner, attr, real))
            setattr(owner, attr, make(real))

        def undo() -> None:
            for owner, attr, real in reversed(saved):
                setattr(owner, attr, real)

        return undo

    def quiesce(self) -> None:
        """Stop the query, heal, finish what a person left half done, let time pass, gc:
        then no state file a retained batch does not need may be left."""
        self.log("QUIET: stop everything, heal, gc")
        for p in self.alive():
            self.sched.kill(p)
        self.sched.unwind_killed()
        self.faults = False
        self.quiet = True
        if self.pending is not None:
            what, arg = self.pending
            proc = self.spawn_process(what, self.person(what, arg))
            self.run_until_done([proc])
        target = self.marked(self.live)
        if target is not None:
            # a rollback whose mark is left (the query ran on unnoticed): finished now
            proc = self.spawn_process("rollback", self.person("rollback", target))
            self.run_until_done([proc])
        if self.violations:
            return
        self.clock.advance(2 * 3600 + self.list_lag)
        for _ in range(3):
            proc = self.spawn_process("gc", self.person("gc", 3600.0))
            self.run_until_done([proc])
            if proc.data.get("ok"):
                break
        self.sched.settle()
        self.live.checked = -1
        self.check()
        if self.violations or self.live.damaged:
            return
        orphans = self.orphans(self.live)
        if orphans:
            self.violate("orphans", f"{len(orphans)} left after a quiet gc: {orphans[:5]}")

    def orphans(self, loc: Loc) -> list[str]:
        """State files no batch in the commit log needs (by the model's resolution), other
        than those of versions above the newest committed one's (in flight, by the rule)."""
        idx = self.index(loc)
        if not idx["commits"]:
            return []
        newest_version = max(idx["commits"]) + 1
        needed: set[str] = set()
        for b in idx["commits"]:
            uids = parse_commit_ids(idx["commits"][b])
            for p in range(PARTITIONS):
                needed |= self.needed_files(loc, idx, p, b + 1, uids[p] if uids else None)
        out = []
        above: set[str] = set()
        for (p, v, _u, ext), (key, data) in idx["state"].items():
            if v > newest_version:
                above.add(key)
                if ext == "zip":
                    m = self.meaning(data)
                    above |= {f"state/0/{p}/SSTs/{n}" for n in (m[1] if m else ())}
        for key in [*(k for k, _d in idx["state"].values()), *idx["ssts"]]:
            if key not in needed and key not in above:
                out.append(key)
        return sorted(out)

    def needed_files(self, loc: Loc, idx: dict[str, Any], p: int, version: int,
                     uid: str | None) -> set[str]:
        """The files a load of `version` reads (the model's rule), for the orphan check."""
        return self._needed(loc, idx, p, version, uid)

    def _needed(self, loc: Loc, idx: dict[str, Any], p: int, version: int,
                uid: str | None) -> set[str]:
        state = idx["state"]
        out: set[str] = set()
        if version == 0:
            return out

        def snap(f: tuple[str, bytes]) -> None:
            out.add(f[0])
            m = self.meaning(f[1])
            if m is not None and m[0] == "zip":
                out.update(f"state/0/{p}/SSTs/{n}" for n in m[1])

        if uid is not None:
            own_zip = state.get((p, version, uid, "zip"))
            if own_zip is not None:
                snap(own_zip)
                return out
            own = state.get((p, version, uid, "changelog"))
            if own is None:
                return out
            m = self.meaning(own[1])
            chain = [tuple(x) for x in (m[2] if m else ())]
            based = [(v, u) for v, u in chain if (p, v, u, "zip") in state]
            base = 0
            if based:
                base, bu = max(based)
                snap(state[(p, base, bu, "zip")])
            for v, u in [*[(v, u) for v, u in chain if v > base], (version, uid)]:
                if (p, v, u, "changelog") in state:
                    out.add(state[(p, v, u, "changelog")][0])
            return out
        snap_ext, step_ext = ("snapshot", "delta") if self.provider == "hdfs" else (
            "zip", "changelog")
        bases = [v for (q, v, u, e) in state if q == p and e == snap_ext and v <= version]
        base = max(bases, default=0)
        if base:
            snap(state[(p, base, None, snap_ext)])
        for v in range(base + 1, version + 1):
            if (p, v, None, step_ext) in state:
                out.add(state[(p, v, None, step_ext)][0])
        return out

    def result(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "world": "spark",
            "provider": self.provider,
            "steps": self.step,
            "sim_seconds": round(self.clock.t - 1_700_000_000.0, 3),
            "violations": [v.as_dict() for v in self.violations],
            "events": dict(sorted(self.counts.items())),
            **({"tolerated": dict(sorted(self.tolerated.items()))} if self.tolerated else {}),
        }

    def minimal_trace(self, limit: int = 60) -> list[str]:
        if not self.violations:
            return []
        v = self.violations[0]
        words = set(re.findall(r"(?:state|sources|offsets|commits)/[\w./-]+", v.message))
        lines = list(self.trace)
        picked = [ln for ln in lines[:-limit]
                  if " ENV " in ln or " QUIET" in ln or any(w in ln for w in words)
                  or re.search(r"(restarts at|rolled back|savepoint sp|moved)", ln)]
        return picked[-limit:] + ["..."] + lines[-limit:]


# -- the model's parsing of its own files ---------------------------------------------------
@functools.lru_cache(maxsize=8192)
def parse_entries(data: bytes) -> list[tuple[int, int, str]]:
    """A source log file's entries: (input file number, batch id, the input's prefix)."""
    out = []
    for line in data.decode().splitlines()[1:]:
        doc = json.loads(line)
        m = _INPUT.match(doc["path"])
        assert m is not None, doc
        out.append((int(m["n"]), int(doc["batchId"]), m["prefix"]))
    return out


def parse_offset(data: bytes) -> int:
    return int(json.loads(data.decode().splitlines()[2])["logOffset"])


def parse_commit_ids(data: bytes) -> list[str] | None:
    doc = json.loads(data.decode().splitlines()[1])
    ids = doc.get("stateUniqueIds")
    return [part[0] for part in ids["0"]] if ids else None


# -- planted bugs: each wraps the real function it breaks (never an edit of src) -----------
def _savepoint_to_batch_number(real: Callable[..., Any]) -> Callable[..., Any]:
    """(a) The savepoint copies the file source's log entries only up to the batch number,
    not up to the batch's logOffset (and trusts its copy without verifying it)."""

    def restart_files(checkpoint: Any, found: Any, needs: Any) -> dict[str, int]:
        files: dict[str, int] = real(checkpoint, found, needs)
        return {k: v for k, v in files.items()
                if not ((m := _SOURCE.match(k.lstrip("."))) and int(m["k"]) > needs.batch)}

    return restart_files


def _no_verify(real: Callable[..., Any]) -> Callable[..., Any]:
    """Does nothing (the savepoint's verification of its copy; the rollback's mark)."""
    return lambda *args, **kwargs: None


def _logs_before_state(real: Callable[..., Any]) -> Callable[..., Any]:
    """(b) A rollback deletes the logs (commits, offsets, newest first) before the state
    files, and leaves nothing to notice it by when it is cut short."""

    def delete(storage: Any, keys: list[str]) -> None:
        logs = [k for k in keys if k.split("/", 1)[0] in ("commits", "offsets")]
        real(storage, [*logs, *(k for k in keys if k not in logs)])

    return delete


def _verify_without_source_chain(real: Callable[..., Any]) -> Callable[..., Any]:
    """(c) verify does not check the file source log's chain (entries missing from it)."""

    def verify(checkpoint: Any, batch: int | None = None, **options: Any) -> Any:
        report = real(checkpoint, batch, **options)
        problems = [p for p in report.problems if not p.path.startswith("sources/")]
        return report.model_copy(update={"problems": problems, "ok": not problems})

    return verify


def _no_recheck(real: Callable[..., Any]) -> Callable[..., Any]:
    """(d) gc deletes what its listing judged without re-checking the commit log and each
    file's size and mtime first."""
    return lambda *args, **kwargs: None


def _unchanged_unchecked(real: Callable[..., Any]) -> Callable[..., Any]:
    return lambda storage, directory, names, batch, view: batch


def _any_attempt(real: Callable[..., Any]) -> Callable[..., Any]:
    """(e) gc ignores the format-v2 unique id commits/N records: it keeps the newest
    attempt's files of each version, whichever attempt the batch committed."""

    def resolve(files: Any, version: int, reader: Any, unique_id: str | None = None) -> Any:
        if unique_id is not None:
            ids = sorted(u for (_k, v, u) in files.versions if v == version and u)
            unique_id = ids[-1] if ids else unique_id
        return real(files, version, reader, unique_id)

    return resolve


#: Planted bugs: (what it breaks, the violation kinds that find it, patches: (module,
#: attribute, wrapper of the real attribute)); `spark-55892` is a switch of the model's
#: own Spark (the old executor's maintenance runs on after the store moved).
PLANTS: dict[str, tuple[str, tuple[str, ...], list[tuple[str, str, Any]], dict[str, Any]]] = {
    "savepoint-to-batch-number": (
        "a savepoint copies source log entries only up to the batch number",
        ("savepoint-source-log", "verify-missed"),
        [("statehold.spark_checkpoints.savepoint", "restart_files", _savepoint_to_batch_number),
         ("statehold.spark_checkpoints.savepoint", "verify_copy", _no_verify)],
        {"crash_rate": 0.01},
    ),
    "rollback-logs-first": (
        "a rollback deletes logs before state files, unnoticeable when cut short",
        ("stale-after-rollback",),
        [("statehold.spark_checkpoints.rollback", "_delete", _logs_before_state),
         ("statehold.spark_checkpoints.rollback", "write_marker", _no_verify)],
        {"provider": "hdfs", "operate_rate": 0.01, "snapshot_every": 1, "retain": 6,
         "rollback_crash": 0.25},
    ),
    "verify-without-source-chain": (
        "verify does not check the file source log's chain",
        ("verify-missed",),
        [("statehold.spark_checkpoints.api", "verify", _verify_without_source_chain)],
        {"crash_rate": 0.01},  # (more savepoints and kept ones to damage: found sooner)
    ),
    "gc-without-recheck": (
        "gc without its re-check of liveness after listing",
        ("restart-broken",),
        [("statehold.spark_checkpoints.policy", "_check_commits", _no_recheck),
         ("statehold.spark_checkpoints.policy", "_unchanged", _unchanged_unchecked)],
        {"provider": "hdfs", "gc_race": 1.0, "operate_rate": 0.005, "snapshot_every": 2,
         "retain": 5, "rollback_crash": 0.0},
    ),
    "v2-lineage-ignored": (
        "gc ignores the format-v2 unique ids commits/N records",
        ("restart-broken", "orphans"),
        [("statehold.spark_checkpoints.gc", "resolve", _any_attempt)],
        {"provider": "rocksdb-v2"},
    ),
    "spark-55892": (
        "Spark's own race: a store reloaded on an executor reuses SSTs of its old zip that "
        "another executor's cleanup deleted (a Spark bug, reported as one)",
        ("spark-bug",),
        [],
        {"provider": "rocksdb", "move_rate": 0.2, "snapshot_every": 1, "operate_rate": 0.0005,
         "crash_rate": 0.0005},
    ),
}


def run_spark_seed(seed: int, steps: int, **options: Any) -> tuple[dict[str, Any], SparkWorld]:
    world = SparkWorld(seed, steps, **options)
    return world.run(), world


__all__ = ["PLANTS", "PROVIDERS", "SparkWorld", "run_spark_seed"]
