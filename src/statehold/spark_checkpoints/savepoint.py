"""A savepoint of a Spark checkpoint location: a new location holding exactly what a
restart at one batch needs, so a query started on it continues from the next batch.

What is copied is `SparkCheckpoint.restart_needs` of the batch: the sources' logs as a
restart reads them (a file source's up to the logOffset the batch recorded, which can be
above the batch number, and to its newest entry when the batch is the newest; the
compaction its chain starts from included: `source_logs`), and operator metadata v2 /
state schema v3 files only of batches up to it (Spark 4 names them by the batch that
wrote them; a later one would describe a later run). Each copied file's checksum
companions (Hadoop's ``.NAME.crc``, Spark 4's ``NAME.crc``) come with it, so Spark reads
the copy as it read the original.

Copies are hard links on a local disk and server-side copies on object stores
(`Storage.copy`); the source is only read. A hard link shares the file with the source,
which is safe because Spark never rewrites a checkpoint file in place: it writes a new
file and renames it over the old name.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any, Literal

from statehold.format import results as shared
from statehold.progress import NoProgress, Progress
from statehold.spark_checkpoints.errors import SparkCheckpointError
from statehold.spark_checkpoints.layout import COMMITS_DIR, crc_of
from statehold.spark_checkpoints.location import RestartNeeds, SparkCheckpoint
from statehold.spark_checkpoints.rollback_marker import refuse_unfinished
from statehold.spark_checkpoints.scan import Scan
from statehold.storage import Storage, StorageError, open_storage
from statehold.storage.destination import destination_problem
from statehold.storage.local import LocalStorage

#: Operator metadata v2 (``_metadata/v2/<batch>``) and state schema v3
#: (``_stateSchema/<store>/<batch>_<uuid>``) files: the batch that wrote them.
_BATCH_NAMED = re.compile(
    r"^state/\d+/(?:_metadata/v2/(?P<meta>\d+)|_stateSchema/[^/]+/(?P<schema>\d+)_[^/]+)$",
    re.ASCII,
)


class SavepointReport(shared.CopyReport):
    """What a savepoint copied, and from what."""

    location_kind: Literal["spark"] = "spark"
    source: str
    dest: str
    #: The batch a query started on `dest` has completed (it continues with batch + 1).
    batch: int
    files: int
    #: The bytes the savepoint holds.
    bytes: int
    #: New bytes written for it: 0 for hard links, all of them for streamed copies.
    bytes_written: int
    #: Files that are hard links to the source's.
    linked: int
    #: The bytes of the whole source location (the savepoint's share of it).
    source_bytes: int
    verified: bool


def operator_file_batch(key: str) -> int | None:
    """The batch an operator metadata v2 or state schema v3 file was written by."""
    match = _BATCH_NAMED.match(key)
    if match is None:
        return None
    return int(match["meta"] or match["schema"])


def companions(key: str, found: Scan) -> list[str]:
    """The checksum files beside `key` that the listing holds."""
    own = f"{key}.crc"
    candidates = [crc_of(key), own, crc_of(own)]
    return [k for k in candidates if k in found.files]


def restart_files(
    checkpoint: SparkCheckpoint, found: Scan, needs: RestartNeeds
) -> dict[str, int]:
    """The files a restart at `needs.batch` reads, narrowed to that batch, with their
    companions: key -> size in the listing. Refuses (SparkCheckpointError) when one is
    missing or of another size than its snapshot's list says."""
    keep: list[str] = []
    problems: list[str] = []
    for key, expected in needs.files.items():
        written_by = operator_file_batch(key)
        if written_by is not None and written_by > needs.batch:
            continue
        info = found.files.get(key)
        if info is None:
            problems.append(f"{key}: missing")
        elif expected is not None and info.size != expected:
            problems.append(f"{key}: {info.size} bytes, its snapshot lists {expected}")
        keep.append(key)
    _refuse(f"batch {needs.batch} cannot be restarted from", problems)
    files = {k: found.size(k) for k in keep}
    for key in keep:
        files.update((c, found.size(c)) for c in companions(key, found))
    return files


def newest_restartable(checkpoint: SparkCheckpoint, found: Scan) -> RestartNeeds:
    """What a restart at the newest committed batch that has everything it needs reads."""
    first: RestartNeeds | None = None
    for batch in sorted(found.commits, reverse=True):
        needs = checkpoint.restart_needs(found, batch)
        if needs.ok:
            return needs
        first = first or needs
    if first is None:
        raise SparkCheckpointError(f"{checkpoint.uri}: no committed batch to restart from")
    _refuse(f"{checkpoint.uri}: no committed batch can be restarted from", first.problems)
    raise AssertionError("unreachable")


def needs_at(checkpoint: SparkCheckpoint, found: Scan, batch: int | None) -> RestartNeeds:
    """`restart_needs` of `batch` (default: the newest restartable), refused unless whole."""
    if batch is None:
        return newest_restartable(checkpoint, found)
    needs = checkpoint.restart_needs(found, batch)
    _refuse(f"batch {batch} cannot be restarted from", needs.problems)
    return needs


def savepoint(
    checkpoint: SparkCheckpoint,
    dest: str | Storage,
    *,
    batch: int | None = None,
    progress: Progress | None = None,
    dest_options: Mapping[str, Any] | None = None,
) -> SavepointReport:
    """Write a new checkpoint location at `dest` (empty or absent) holding exactly what a
    restart at `batch` needs (default: the newest committed batch that has all of it);
    refused, with the reason, when the batch cannot be restarted from.

    ``commits/<batch>`` is written last: Spark restarts from the newest batch with a
    commit, so a savepoint cut short is never a location a query would start from as if
    it were whole. The copy is then verified: every file present with its size, and
    `restart_needs` of the batch whole on `dest`. The source is never modified."""
    out = open_destination(dest, dest_options)
    found = checkpoint.scan()
    refuse_unfinished(checkpoint.storage, found, "take a savepoint")
    needs = needs_at(checkpoint, found, batch)
    files = restart_files(checkpoint, found, needs)
    check_destination(checkpoint, out)
    report = _copy(checkpoint, out, files, needs.batch, progress or NoProgress())
    verify_copy(out, files, needs.batch)
    return report.model_copy(
        update={"source_bytes": sum(i.size for i in found.files.values()), "verified": True}
    )


def keep_whole(
    checkpoint: SparkCheckpoint,
    dest: str | Storage,
    found: Scan,
    *,
    progress: Progress | None = None,
    dest_options: Mapping[str, Any] | None = None,
) -> SavepointReport:
    """A copy at `dest` (empty or absent) of the whole location as `found` lists it, every
    file byte for byte, its damage included (what `repair` keeps before it changes
    anything, so the repair can be undone): not a savepoint of one batch, which a damaged
    location may not have whole. Symlinks are not followed (not copied). Its batch is
    the newest committed one, its ``commits/`` file copied last; verified as copied
    (every file there with its size), not as restartable."""
    out = open_destination(dest, dest_options)
    refuse_unfinished(checkpoint.storage, found, "keep a copy")
    if found.newest_committed is None:
        raise SparkCheckpointError(f"{checkpoint.uri}: no committed batch to keep")
    check_destination(checkpoint, out)
    files = {k: i.size for k, i in found.files.items() if not i.symlink}
    report = _copy(checkpoint, out, files, found.newest_committed,
                   progress or NoProgress())
    copied = SparkCheckpoint(out).scan()
    problems = [
        f"{k}: {'missing' if k not in copied.files else f'{copied.size(k)} bytes, not {n}'}"
        for k, n in sorted(files.items()) if k not in copied.files or copied.size(k) != n
    ]
    _refuse(f"the copy at {out.uri} does not verify", problems)
    return report.model_copy(update={"source_bytes": report.bytes, "verified": True})


def open_destination(dest: str | Storage, options: Mapping[str, Any] | None) -> Storage:
    if isinstance(dest, Storage):
        return dest
    try:
        return open_storage(dest, **dict(options or {}))
    except (StorageError, ValueError) as e:
        raise SparkCheckpointError(f"{dest}: cannot open ({e})") from None


def check_destination(checkpoint: SparkCheckpoint, out: Storage) -> None:
    problem = destination_problem(checkpoint.uri, out)
    if problem:
        raise SparkCheckpointError(f"{out.uri}: {problem}")


def _copy(
    checkpoint: SparkCheckpoint,
    out: Storage,
    files: dict[str, int],
    batch: int,
    progress: Progress,
) -> SavepointReport:
    """Copy `files`, ``commits/<batch>`` last (its companions just before it)."""
    last = f"{COMMITS_DIR}/{batch}"
    rank = {k: 1 for k in _crcs(last)} | {last: 2}
    order = sorted(files, key=lambda k: (rank.get(k, 0), k))
    progress.start(f"savepoint of batch {batch}", sum(files.values()))
    written = linked = 0
    for key in order:
        try:
            checkpoint.storage.copy(key, key, target=out)
        except StorageError as e:
            raise SparkCheckpointError(f"copying {key} to {out.uri} failed ({e})") from None
        if _is_link(checkpoint.storage, out, key):
            linked += 1
        else:
            written += files[key]
        progress.advance(files[key])
    return SavepointReport(
        source=checkpoint.uri,
        dest=out.uri,
        batch=batch,
        files=len(files),
        bytes=sum(files.values()),
        bytes_written=written,
        linked=linked,
        source_bytes=0,
        verified=False,
    )


def _crcs(key: str) -> set[str]:
    return {crc_of(key), f"{key}.crc", crc_of(f"{key}.crc")}


def _is_link(source: Storage, out: Storage, key: str) -> bool:
    if not (isinstance(source, LocalStorage) and isinstance(out, LocalStorage)):
        return False
    try:
        a, b = os.stat(source.root / key), os.stat(out.root / key)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def verify_copy(out: Storage, files: dict[str, int], batch: int) -> None:
    """Every file copied is there with its size, and a restart at `batch` on `out` has
    everything it needs."""
    copy = SparkCheckpoint(out)
    found = copy.scan()
    problems = [
        f"{k}: {'missing' if k not in found.files else f'{found.size(k)} bytes, not {size}'}"
        for k, size in sorted(files.items())
        if k not in found.files or found.size(k) != size
    ]
    if not problems:
        problems = copy.restart_needs(found, batch).problems
    if not problems and found.newest_committed != batch:
        problems = [f"its newest commit is {found.newest_committed}, not {batch}"]
    _refuse(f"the savepoint at {out.uri} does not verify", problems)


def _refuse(what: str, problems: list[str]) -> None:
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise SparkCheckpointError(f"{what}: {problems[0]}{more}")
