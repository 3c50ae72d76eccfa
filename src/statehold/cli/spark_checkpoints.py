"""The commands on a Spark checkpoint location (a Structured Streaming query's
``checkpointLocation``): how each shared command (list, inspect, verify, du, gc,
history) shows a Spark location's result, and savepoint, rollback, repair,
relocate and repartition."""

from __future__ import annotations

from typing import Annotated

import typer

from statehold.cli.common import (
    HaOption,
    JsonOption,
    emit,
    error_line,
    fail,
    handle_errors,
    opened,
    spark_only,
)
from statehold.cli.operate import DEFAULT_TIMEOUT, TimeoutOption, WaitOption
from statehold.cli.output import RichProgress, say, size, table, when
from statehold.spark_checkpoints.gc import SparkGcReport
from statehold.spark_checkpoints.history import SparkHistory
from statehold.spark_checkpoints.reports import (
    SparkInspection,
    SparkListing,
    SparkUsage,
    SparkVerifyReport,
)
from statehold.tools.locations import JobLocation

BatchOption = Annotated[
    int | None,
    typer.Option(
        "--batch",
        min=0,
        help="A Spark checkpoint location only: the batch a restart starts after (default: "
        "the newest committed).",
    ),
]

DeepOption = Annotated[
    bool,
    typer.Option(
        "--deep",
        help="A Spark checkpoint location only: also load every store version the restart "
        "needs (RocksDB's opened by RocksDB, changelogs, deltas and snapshots read to their "
        "end, every record decoded), naming each problem's kind and the Spark bug it is the "
        "signature of.",
    ),
]
OperatorOption = Annotated[
    int | None,
    typer.Option(
        "--operator",
        min=0,
        help="With --deep: load the stores of this stateful operator only (its number under "
        "state/).",
    ),
]


def show_spark_listing(result: SparkListing) -> None:
    restart = "none" if result.restart_batch is None else f"after batch {result.restart_batch}"
    say(f"{result.uri} (Spark checkpoint, query {result.query_id}; restart {restart})")
    if result.interrupted_rollback is not None:
        say(f"an interrupted rollback to batch {result.interrupted_rollback}: run "
            f"`statehold rollback {result.uri} --to-batch {result.interrupted_rollback}` "
            "again to finish it")
    if result.stale_state:
        say(f"{len(result.stale_state)} state files above what any batch wrote "
            f"({result.stale_state[0]}, ...): see `statehold verify`")
    for folder, count in result.repaired.items():
        say(f"set aside by a repair: {folder}/ ({count} files; gc leaves them alone)")
    table(
        ("batch", "committed", "restartable", "time", "watermark", "why not"),
        [
            (
                str(b.batch),
                "yes" if b.committed else "no",
                "yes" if b.restartable else "no",
                when(b.timestamp_ms / 1000 if b.timestamp_ms else None),
                when(b.watermark_ms / 1000 if b.watermark_ms else None),
                b.why_not or "",
            )
            for b in result.batches
        ],
    )


def show_spark_inspection(result: SparkInspection) -> None:
    say(
        f"{result.uri}: query {result.query_id}, newest committed batch "
        f"{result.newest_committed} (oldest {result.oldest_committed}), restart after "
        f"{result.restart_batch}"
    )
    table(
        ("operator", "partition", "store", "provider", "versions", "held as", "base",
         "needed", "bytes"),
        [
            (
                str(s.operator), str(s.partition), s.store, s.provider, _versions(s.versions),
                s.how or "-", "-" if s.base is None else str(s.base), size(s.needed_bytes),
                size(s.bytes),
            )
            for s in result.stores
        ],
    )


def show_spark_verify(result: SparkVerifyReport) -> None:
    if result.ok:
        say(
            f"OK {result.uri}: a restart after batch {result.batch} has all "
            f"{result.files_checked} files it needs, {size(result.bytes_checked)}"
        )
        if result.deep:
            of = "" if result.operator is None else f" of operator {result.operator}"
            say(f"OK loaded {result.stores_loaded} store versions{of}, "
                f"{result.records_read} records read")
    else:
        for p in result.problems:
            say(f"{p.path}: {p.problem}" if not p.problem.startswith(p.path) else p.problem)
    for directory, count in result.bound_to.items():
        say(f"bound to {directory} ({count} input files named by absolute path)")
    for line in result.not_decoded:
        say(f"not decoded: {line}")


def show_spark_usage(result: SparkUsage) -> None:
    say(f"{result.uri}: {size(result.total_bytes)}")
    rows = [(k, str(result.files[k]), size(result.bytes[k])) for k in sorted(result.bytes)]
    rows.append(
        ("unreferenced (gc's)", str(result.unreferenced_files),
         size(result.unreferenced_bytes or 0))
    )
    table(("kind", "files", "bytes"), rows)


def show_spark_gc(result: SparkGcReport) -> None:
    verb = "would delete" if result.dry_run else "deleted"
    count, amount = (
        (result.deletable, result.deletable_bytes)
        if result.dry_run
        else (result.deleted, result.deleted_bytes)
    )
    say(
        f"{result.uri}: {verb} {count} file(s), {size(amount)}; kept {result.referenced} "
        f"a retained batch needs, {result.kept} logs and metadata, "
        f"{result.protected_count} young or in flight"
    )
    for line in [*result.problems, *result.notes]:
        say(line)
    for key in result.foreign:
        say(f"left alone (not Spark's): {key}")


def show_spark_history(result: SparkHistory) -> None:
    if not result.records:
        say(f"{result.uri}: no batches")
        return
    table(
        ("batch", "committed", "time", "watermark", "input offsets", "state", "files",
         "problem"),
        [
            (
                str(r.batch), "yes" if r.committed else "no",
                when(r.timestamp_ms / 1000 if r.timestamp_ms else None),
                when(r.watermark_ms / 1000 if r.watermark_ms else None),
                " ".join(str(o) for o in r.offsets),
                "-" if r.operators is None else size(sum(o.bytes for o in r.operators)),
                "-" if r.operators is None else str(sum(o.files for o in r.operators)),
                r.problem or "",
            )
            for r in result.records
        ],
        title=result.uri,
    )


def _versions(versions: list[int]) -> str:
    if not versions:
        return "-"
    return f"{versions[0]}-{versions[-1]}" if len(versions) > 1 else str(versions[0])


CheckpointLocationArg = Annotated[
    str,
    typer.Argument(
        help="A Spark checkpoint location (a query's checkpointLocation: path, file://, "
        "s3://, s3a://, gs://, az://)."
    ),
]


def savepoint_command(
    location: Annotated[
        str,
        typer.Argument(
            help="A Spark checkpoint location (a query's checkpointLocation), or a "
            "statehold job directory whose driver is running.", show_default=False,
        ),
    ],
    target: Annotated[
        str,
        typer.Argument(
            help="For a Spark checkpoint location: an empty or absent destination (path, "
            "file://, s3://, ...). For a job directory: the savepoint's name "
            "(savepoints/NAME/).", show_default=False,
        ),
    ],
    batch: Annotated[
        int | None,
        typer.Option("--batch", min=0, help="A Spark checkpoint location only: the batch "
                     "to restart after (default: the newest committed one a restart can "
                     "start after)."),
    ] = None,
    wait: WaitOption = False,
    timeout: TimeoutOption = DEFAULT_TIMEOUT,
    ha: HaOption = None,
    as_json: JsonOption = False,
) -> None:
    """Two forms, told apart by the kind of directory LOCATION is.

    statehold savepoint CKPT DEST [--batch N]: for a Spark checkpoint location, write a
    new checkpoint location at DEST holding exactly what a restart after --batch needs
    (hard links on a local disk, server-side copies on object stores; the source is never
    modified). A query started with checkpointLocation=DEST continues from the next
    batch.

    statehold savepoint JOB NAME [--wait] [--timeout S]: for a statehold job directory,
    ask its running driver for savepoint NAME after its current batch, or while it waits
    for input (the driver does what job.savepoint(NAME) does: its newest checkpoint).
    Fails (one line, exit 1) when no driver is running, and with --wait on a timeout (the
    request is then withdrawn)."""
    with handle_errors(as_json), opened(
        location, ha, or_else="statehold savepoint works on a query's checkpointLocation "
        "or a running statehold job's directory"
    ) as found:
        if isinstance(found, JobLocation):
            if batch is not None:
                fail("--batch is for a Spark checkpoint location; a running job's savepoint "
                     "is of its next batch boundary", as_json=as_json)
            from statehold.cli.operate import savepoint_of_job

            return savepoint_of_job(found, target, wait=wait, timeout=timeout,
                                    as_json=as_json)
        if wait:
            fail("--wait is for a running statehold job (a Spark checkpoint location's "
                 "savepoint is written before the command returns)", as_json=as_json)
        with RichProgress(not as_json) as progress:
            result = found.copy(target, at=batch, progress=progress)

    def render() -> None:
        say(
            f"savepoint of batch {result.batch}: {result.dest} ({result.files} files, "
            f"{size(result.bytes)} of the source's {size(result.source_bytes)}; "
            f"{size(result.bytes_written)} written, {result.linked} hard links)"
            + (", verified" if result.verified else "")
        )

    emit(result, as_json, render)


def rollback_command(
    location: CheckpointLocationArg,
    to_batch: Annotated[
        int, typer.Option("--to-batch", min=0, help="The batch whose state the next start "
                          "has; it reprocesses from the batch after it.")
    ],
    keep: Annotated[
        str | None,
        typer.Option("--keep", help="Where the savepoint of what is removed goes (default: "
                     "<location>-before-rollback-<UTC time>, beside the location)."),
    ] = None,
    sink: Annotated[
        str | None,
        typer.Option("--sink", help="A file sink's output directory: roll its _spark_metadata "
                     "log back too, or Spark skips the batch ids it already has."),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Roll back even though the query looks alive.")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Make a stopped query's next start reprocess from batch N+1 with state as of N:
    the logs, the sources' logs and the state versions after N are removed, after a
    savepoint of them (the command says where, so a rollback can be undone). Refuses when
    N's state is no longer held, or when the query looks alive (without --force)."""
    with handle_errors(as_json), opened(location, None) as found:
        result = spark_only(found, "rollback").rollback(to_batch, keep=keep, force=force,
                                                        sink=sink)

    def render() -> None:
        say(
            f"rolled {result.checkpoint} back from batch {result.from_batch} to "
            f"{result.to_batch}: {len(result.deleted)} files removed"
            + (f", {len(result.sink_deleted)} from the sink's log" if result.sink else "")
        )
        if result.kept:
            say(f"what was removed is kept as a savepoint of batch {result.kept_batch}: "
                f"{result.kept}")
        for note in result.sinks:
            say(note)

    emit(result, as_json, render)


def repair_command(
    location: CheckpointLocationArg,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the plan; change nothing.")
    ] = False,
    keep: Annotated[
        str | None,
        typer.Option("--keep", help="Where the copy of the whole location as it was goes "
                     "before anything changes (default: <location>-before-repair-<UTC "
                     "time>, beside the location)."),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Repair even though the query looks alive.")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Bring a damaged location back to the newest batch that can be made whole. For each
    store version `verify --deep` finds damaged: a snapshot that does not load is set
    aside (moved under _repaired/<UTC time>/ in the location, never deleted) when an older
    snapshot and its deltas or changelogs rebuild the version; otherwise the location is
    rolled back (as `statehold rollback`) to the newest batch whose every store version
    loads. The plan is printed first (--dry-run stops there); a copy of the whole location
    as it was (every file, its damage too) is written to --keep before anything changes.
    Exits 1 unless `verify --deep` passes afterwards, naming what could not be
    repaired."""
    with handle_errors(as_json), RichProgress(not as_json) as progress, opened(
        location, None
    ) as found:
        result = spark_only(found, "repair").repair(dry_run=dry_run, keep=keep, force=force,
                                                    progress=progress)

    def render() -> None:
        if not result.stores and not result.other_damage:
            say(f"OK {result.checkpoint}: every store version of batch {result.batch} "
                "loads; nothing to repair")
            return
        say(f"plan for {result.checkpoint} (newest committed batch {result.batch}):")
        for store in result.stores:
            kinds = ", ".join(sorted({d.kind for d in store.damage}))
            head = f"  {store.store} version {store.version} ({store.provider}; {kinds}): "
            if store.step == "set-aside":
                say(head + f"set aside {', '.join(store.set_aside)}; loads from "
                    f"{store.loads_from}")
            else:
                say(head + store.step)
                for line in store.not_chosen:
                    say(f"    not: {line}")
        for damage in result.other_damage:
            say(f"  {damage.path}: {damage.kind}: rollback")
        if result.rollback_to is not None:
            say(f"  rollback to batch {result.rollback_to} ({result.rollback_removes} files "
                "removed, after the keep holds them)")
        if result.unrepairable:
            say(f"  cannot repair: {result.unrepairable}")
        if result.dry_run:
            say(f"dry run: nothing changed (the location's copy would go to {result.keep})")
            return
        if result.keep and result.kept_batch is not None:
            say(f"the location as it was (newest batch {result.kept_batch}) is kept at "
                f"{result.keep}")
        if result.repaired_dir:
            say(f"set aside under {result.repaired_dir}/: {len(result.moved)} files")
        if result.ok:
            say(f"OK repaired: verify --deep passes; the query restarts after batch "
                f"{result.restart_batch}")
        for p in result.remaining:
            say(f"not repaired: {p.path}: {p.problem}" if not p.problem.startswith(p.path)
                else f"not repaired: {p.problem}")

    emit(result, as_json, render)
    if not result.ok and not result.dry_run:
        error_line(f"repair failed: {len(result.remaining)} problem(s) remain")
        raise typer.Exit(1)


def relocate_command(
    location: CheckpointLocationArg,
    from_prefix: Annotated[str, typer.Option("--from", help="The old prefix of the paths.")],
    to_prefix: Annotated[str, typer.Option("--to", help="The new prefix.")],
    sink: Annotated[
        str | None,
        typer.Option("--sink", help="A file sink's output directory whose _spark_metadata "
                     "log is rewritten too."),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show what would be rewritten; write nothing.")
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Rewrite even though the query looks alive.")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Rewrite the absolute paths that bind a Spark checkpoint location to its old place
    (the file source's log, a file sink's log, Spark 4's schema paths) from one prefix to
    another, after the location (or its input) moved. `statehold verify` names them.
    Refuses when the query looks alive (without --force)."""
    with handle_errors(as_json), opened(location, None) as found:
        result = spark_only(found, "relocate").relocate(
            from_prefix, to_prefix, sink=sink, dry_run=dry_run, force=force
        )

    def render() -> None:
        verb = "would rewrite" if result.dry_run else "rewrote"
        say(f"{verb} {result.paths} paths in {len(result.files)} files")
        for other in result.others:
            say(f"still bound elsewhere: {other.key}: {other.path}")

    emit(result, as_json, render)


def repartition_command(
    location: CheckpointLocationArg,
    target: Annotated[
        str,
        typer.Argument(help="An empty or absent destination (path, file://, s3://, ...).",
                       show_default=False),
    ],
    partitions: Annotated[
        int,
        typer.Option("--partitions", min=1, help="The shuffle partitions the query "
                     "restarts with on the destination.", show_default=False),
    ],
    batch: Annotated[
        int | None,
        typer.Option("--batch", min=0, help="The batch to restart after (default: the "
                     "newest committed one a restart can start after)."),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Write a new checkpoint location at DEST whose batch restarts with --partitions
    shuffle partitions (the number Spark fixes at a query's first run): every state key
    moved to the partition Spark's hash sends its rows to, the offsets and operator
    metadata rewritten to match, each new partition's state one snapshot in the store's
    own format (HDFS-backed, or RocksDB with changelog checkpointing off or on; format v2
    and transformWithState are refused). The source is never modified; DEST's commit is
    written last and DEST is verified before the command returns. A query started with
    checkpointLocation=DEST continues from the next batch with the new partitions."""
    with handle_errors(as_json), RichProgress(not as_json) as progress, opened(
        location, None
    ) as found:
        result = spark_only(found, "repartition").repartition(
            target, partitions=partitions, batch=batch, progress=progress)

    def render() -> None:
        say(f"batch {result.batch} repartitioned from {result.partitions_before} to "
            f"{result.partitions} partitions: {result.dest} ({result.files} files, "
            f"{size(result.bytes)})" + (", verified" if result.verified else ""))
        for op in result.operators:
            for store in op.stores:
                say(f"operator {op.operator} ({op.name}) store {store.store}: {store.rows} "
                    f"rows by ({', '.join(store.partitioning)})")

    emit(result, as_json, render)


def register(app: typer.Typer) -> None:
    app.command("savepoint")(savepoint_command)
    app.command("rollback")(rollback_command)
    app.command("relocate")(relocate_command)
    app.command("repair")(repair_command)
    app.command("repartition")(repartition_command)
