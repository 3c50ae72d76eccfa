"""The Python API: a Spark checkpoint location opened once, with every operation on it
as a method (the CLI's commands, for scripts and notebooks). ``statehold.open`` returns
one for a Spark location; `open_spark_checkpoint` opens one and refuses anything else.

    location = statehold.open("s3://bucket/checkpoints/orders")
    location.verify().ok
    location.savepoint("s3://bucket/savepoints/orders-before-upgrade")
    location.rollback(41, sink="s3://bucket/tables/orders")
    location.repair(dry_run=True).stores  # the plan for each damaged store version
    location.gc(dry_run=True)
    for batch in location.read_state(operator=0):  # pyarrow RecordBatches
        ...
    location.transform("s3://bucket/checkpoints/orders-fixed", operator=0,
                       fn=lambda batch: batch.filter(...))  # delete, change, migrate
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from statehold.format.location_kind import SPARK_NEEDS, AmbiguousLocationError, location_kind
from statehold.format.results import WebReport
from statehold.progress import Progress
from statehold.spark_checkpoints import web_page
from statehold.spark_checkpoints.errors import NotASparkCheckpointError, SparkCheckpointError
from statehold.spark_checkpoints.gc import SparkGcReport, gc
from statehold.spark_checkpoints.history import SparkHistory, history
from statehold.spark_checkpoints.layout import DEFAULT_STORE, StoreId
from statehold.spark_checkpoints.location import SparkCheckpoint
from statehold.spark_checkpoints.policy import SPARK_GC_GRACE_SECONDS
from statehold.spark_checkpoints.relocate import BoundPath, RelocateReport, absolute_paths, relocate
from statehold.spark_checkpoints.reports import (
    SparkInspection,
    SparkListing,
    SparkUsage,
    SparkVerifyReport,
    du,
    inspect,
    listing,
    verify,
)
from statehold.spark_checkpoints.rollback import DEFAULT_GRACE_SECONDS, RollbackReport, rollback
from statehold.spark_checkpoints.savepoint import SavepointReport, savepoint
from statehold.storage import open_storage
from statehold.storage.local import LocalStorage

if TYPE_CHECKING:
    import pyarrow as pa

    from statehold.spark_checkpoints.repair import RepairReport
    from statehold.spark_checkpoints.repartition import RepartitionReport
    from statehold.spark_checkpoints.state_schema import StateSchema
    from statehold.spark_checkpoints.transform import (
        DeleteReport,
        TransformFn,
        TransformReport,
    )


class SparkLocation(SparkCheckpoint):
    """A query's ``checkpointLocation`` (what ``statehold.open`` returns for one). Reads
    never leave it; writes (gc, rollback, repair, relocate) delete or rewrite only what the
    deletion rule allows. The verbs a job directory has too (`listing`, `inspect`,
    `verify`, `du`, `history`, `gc`, `copy`) return the same result models
    (`statehold.format.results`)."""

    def close(self) -> None:
        """Nothing to close (as a job directory's handle has its HA store)."""

    def __enter__(self) -> SparkLocation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def listing(self, *, progress: Progress | None = None) -> SparkListing:
        """The batches, which a restart can start after, each store's versions
        (`progress`: as a job directory's listing takes; one listing, not counted)."""
        return listing(self)

    def inspect(self) -> SparkInspection:
        """`listing`, as `inspect`'s result: each store's versions and how the restart
        batch's version is held."""
        return inspect(self)

    def verify(
        self,
        batch: int | None = None,
        *,
        deep: bool = False,
        operator: int | None = None,
        progress: Progress | None = None,
    ) -> SparkVerifyReport:
        """Every file a restart after `batch` (default: the newest committed) needs is
        there and whole; `deep`: every store version it needs (of `operator` only, if
        given) is also loaded, a RocksDB one by RocksDB, and each problem found names its
        kind and the Spark bug whose signature it carries (`Problem.kind`,
        `.spark_bug`)."""
        return verify(self, batch, deep=deep, operator=operator, progress=progress)

    def du(self, *, progress: Progress | None = None) -> SparkUsage:
        """Bytes and files by kind, and what gc would delete whatever its age
        (`progress`: as a job directory's du takes; not counted)."""
        unreferenced = gc(self, dry_run=True, grace_seconds=0.0)
        return du(self).model_copy(update={
            "unreferenced_bytes": unreferenced.deletable_bytes,
            "unreferenced_files": unreferenced.deletable,
        })

    def history(self, limit: int | None = None) -> SparkHistory:
        return history(self, limit)

    def report(self) -> WebReport:
        """The web page (`statehold.web_page`): per batch its time, watermark, input offsets
        and state per operator; the stores; bytes by kind; verify."""
        return web_page.report(self)

    def gc(
        self,
        *,
        dry_run: bool = False,
        grace: float | None = None,
        grace_seconds: float | None = None,
        progress: Progress | None = None,
    ) -> SparkGcReport:
        """Delete what no batch Spark may still restart from needs, never a file younger
        than `grace` seconds (default `SPARK_GC_GRACE_SECONDS`; `grace_seconds`: its old
        name); safe beside the query."""
        chosen = grace if grace is not None else grace_seconds
        return gc(self, dry_run=dry_run, progress=progress,
                  grace_seconds=SPARK_GC_GRACE_SECONDS if chosen is None else chosen)

    def copy(
        self, dest: str, *, at: int | None = None, progress: Progress | None = None,
        **dest_options: Any,
    ) -> SavepointReport:
        """The savepoint (`savepoint`) of batch `at`: what a restart after it needs."""
        return savepoint(self, dest, batch=at, progress=progress,
                         dest_options=dest_options or None)

    def savepoint(
        self, dest: str, *, batch: int | None = None, **dest_options: Any
    ) -> SavepointReport:
        """A new checkpoint location at `dest` with exactly what a restart after `batch`
        needs; a query started on it continues from the next batch. `dest_options`: the
        destination's storage options (as `open_spark_checkpoint`'s)."""
        return savepoint(self, dest, batch=batch, dest_options=dest_options or None)

    def rollback(
        self,
        to_batch: int,
        *,
        keep: str | None = None,
        force: bool = False,
        sink: str | None = None,
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
        **storage_options: Any,
    ) -> RollbackReport:
        """The next start reprocesses from `to_batch` + 1 with state as of `to_batch`;
        what is removed is kept first as a savepoint (`keep`). `storage_options`: those of
        `keep` and `sink`."""
        return rollback(
            self, to_batch, keep=keep, force=force, sink=sink, grace_seconds=grace_seconds,
            storage_options=storage_options or None,
        )

    def repair(
        self,
        *,
        dry_run: bool = False,
        keep: str | None = None,
        force: bool = False,
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
        progress: Progress | None = None,
        **storage_options: Any,
    ) -> RepairReport:
        """Bring a damaged location back to the newest batch that can be made whole: per
        damaged store version, a snapshot that does not load set aside (moved under
        ``_repaired/<time>/``) where another way rebuilds the version, else a rollback to
        the newest batch whose every store version loads. The plan is the report's
        (`dry_run`: only the plan); a copy of the whole location as it was goes to `keep`
        first; `verify(deep=True)` decides `ok` after. `storage_options`: `keep`'s."""
        from statehold.spark_checkpoints.repair import repair

        return repair(self, dry_run=dry_run, keep=keep, force=force,
                      grace_seconds=grace_seconds, storage_options=storage_options or None,
                      progress=progress)

    def absolute_paths(self, sink: str | None = None) -> list[BoundPath]:
        return absolute_paths(self, sink=sink)

    def relocate(
        self,
        from_prefix: str,
        to_prefix: str,
        *,
        sink: str | None = None,
        dry_run: bool = False,
        force: bool = False,
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
    ) -> RelocateReport:
        """Rewrite the absolute paths from one prefix to another; refused while the query
        looks alive (`force` to go on)."""
        return relocate(
            self, from_prefix, to_prefix, sink=sink, dry_run=dry_run, force=force,
            grace_seconds=grace_seconds,
        )

    def repartition(
        self, dest: str, *, partitions: int, batch: int | None = None,
        progress: Progress | None = None, **dest_options: Any
    ) -> RepartitionReport:
        """A new checkpoint location at `dest` (empty or absent) whose `batch` (default:
        the newest restartable) restarts with `partitions` shuffle partitions: every key
        moved to the partition Spark's hash sends it to, in the store's own format
        (HDFS-backed, RocksDB, checkpoint format v2; transformWithState's column families
        by their grouping key); the source is only read. `dest_options`: the
        destination's storage options."""
        # imported when used, as the state reader (Arrow, RocksDB) it needs
        from statehold.spark_checkpoints.repartition import repartition

        return repartition(self, dest, partitions=partitions, batch=batch, progress=progress,
                           dest_options=dest_options or None)

    def transform(
        self, dest: str, *, operator: int, fn: TransformFn, state_var: str | None = None,
        batch: int | None = None, key_schema: Any = None, value_schema: Any = None,
        partitions: int | None = None, progress: Progress | None = None,
        **dest_options: Any,
    ) -> TransformReport:
        """A new checkpoint location at `dest` (empty or absent) whose `batch` (default:
        the newest restartable) holds what `fn` made of `operator`'s state: `fn` gets
        pyarrow RecordBatches of the store's key columns then value columns (one source
        partition at a time, so memory does not grow with the state) and returns a
        RecordBatch or Table of the rows to keep, in the new schema (`key_schema`,
        `value_schema`: a pyarrow schema or Spark's StructType JSON / a PySpark
        StructType; default the store's), or None. Each row goes to the partition
        Spark's hash of its new key sends it to (`partitions`: repartition too); the
        store's schema file says the new schema, so the query with the changed state
        restarts on `dest`. Operators with one store only (not a join). A
        transformWithState operator's state variable `state_var` (value, list or map
        state, without TTL): `fn` gets its rows as ``read_state(state_var=...)`` gives
        them and returns those to keep, in the variable's schema; its other families are
        copied. Other operators are copied as they are; the source is only read; `dest`'s
        commit is written last and `dest` is verified."""
        from statehold.spark_checkpoints.transform import transform

        return transform(self, dest, operator=operator, fn=fn, state_var=state_var, batch=batch,
                         key_schema=key_schema, value_schema=value_schema,
                         partitions=partitions, progress=progress,
                         dest_options=dest_options or None)

    def delete_keys(
        self, dest: str, *, operator: int, keys: Iterable[Mapping[str, Any]],
        side: str | None = None, batch: int | None = None, progress: Progress | None = None,
        **dest_options: Any,
    ) -> DeleteReport:
        """`transform` keeping every row but those whose key is in `keys` (each a mapping of
        the key's column names to values, as JSON gives them: timestamps as ISO 8601
        text, a window as ``{"start": ..., "end": ...}``). A stream-stream join's keys are
        its join key's columns: each key's count and every buffered row of it removed
        from both sides, or from `side` (``left``, ``right``) only. A transformWithState
        operator's are its grouping key's (the ``groupBy`` columns): every record of every
        column family (state variables, timers, TTL) of those keys removed."""
        from statehold.spark_checkpoints.key_delete import delete_keys

        return delete_keys(self, dest, operator=operator, keys=keys, side=side, batch=batch,
                           progress=progress, dest_options=dest_options or None)

    def state_schema(
        self, *, operator: int = 0, store: str = DEFAULT_STORE, partition: int = 0
    ) -> StateSchema:
        """A store's key and value schemas, from its ``_metadata/schema``."""
        # imported when used: the other commands start without Arrow's and RocksDB's import
        from statehold.spark_checkpoints.state_reader import store_schema

        return store_schema(self, self.scan(), StoreId(operator, partition, store))

    def read_state(
        self,
        batch: int | None = None,
        *,
        operator: int = 0,
        store: str = DEFAULT_STORE,
        partition: int | None = None,
        schema: StateSchema | None = None,
        batch_rows: int = 4096,
        state_var: str | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """The state of one operator's store as `batch` (default: the newest committed)
        left it, read without Spark: Arrow record batches of the key columns, then the
        value columns (the schema's metadata ``statehold.key_columns`` says how many are
        the key), one partition after another (`partition`: only that one), streamed.
        `schema`: the key and value schemas, where the location holds none.
        `state_var`: a transformWithState operator's state variable (its column family,
        Spark's ``stateVarName``; the registered timers are ``$eventTimers_keyToTimestamp``
        or ``$procTimers_keyToTimestamp``), read with the schema its state schema v3 file
        gives; a list state's rows one per element."""
        from statehold.spark_checkpoints.state_reader import read_store
        from statehold.spark_checkpoints.tws_state import read_variable, tws_operator

        found = self.scan()
        tws = tws_operator(self, found, operator, store)
        if tws is None and state_var is not None:
            raise SparkCheckpointError(
                f"{self.uri}: operator {operator} is not transformWithState's; it has no "
                "state variables")
        if tws is not None and state_var is None:
            raise SparkCheckpointError(
                f"{self.uri}: operator {operator} is transformWithState's: name a state "
                f"variable (state_var, --state-var): {', '.join(tws.variables)}")
        if batch is None:
            batch = found.newest_committed
            if batch is None:
                raise SparkCheckpointError(f"{self.uri}: no committed batch to read state at")
        if partition is None:
            stores = sorted(s for s in found.stores if (s.operator, s.name) == (operator, store))
            if not stores:
                raise SparkCheckpointError(
                    f"{self.uri}: no store {store!r} of operator {operator} in the location")
        else:
            stores = [StoreId(operator, partition, store)]
        for one in stores:
            if tws is not None and state_var is not None:
                yield from read_variable(self, found, tws, one, batch, state_var, batch_rows)
            else:
                yield from read_store(self, found, one, batch, schema=schema,
                                      batch_rows=batch_rows)


#: The old name of `SparkLocation`.
SparkCheckpointLocation = SparkLocation


def open_spark_checkpoint(uri: str, **storage_options: Any) -> SparkLocation:
    """Open the checkpoint location at `uri` (path, file://, s3://, s3a://, gs://, az://);
    NotASparkCheckpointError if it holds none (a statehold job directory included)."""
    storage = open_storage(uri, **storage_options)
    problem = storage.root_problem() if isinstance(storage, LocalStorage) else None
    if problem is not None:
        raise NotASparkCheckpointError(
            f"{uri}: {problem} (a Spark checkpoint location is expected)"
        )
    try:
        kind = location_kind(storage)
    except AmbiguousLocationError as e:
        raise NotASparkCheckpointError(str(e)) from None
    if kind != "spark":
        raise NotASparkCheckpointError(f"{uri}: {SPARK_NEEDS}")
    return SparkLocation(storage)
