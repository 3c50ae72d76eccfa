"""The sources' logs as a restart reads them: which line of an offsets file is which
source, and which log entries of a file source a restart at a batch reads.

A file source (Spark's ``FileStreamSource``) writes ``sources/I/K`` when it finds new
files, inside ``latestOffset``, *before* ``offsets/N`` is written; ``offsets/N`` then
records ``{"logOffset": K}``. K is the source's own count: a batch that found no file
adds no entry, and a driver that died between the two writes leaves an entry that the
next ``offsets/N`` counts, so from then on K can be above N. Every tenth entry is a
compaction, ``K.compact``, holding every entry up to K; Spark deletes the plain files
before it some minutes later.

A restart after batch N reads, of each file source's log:

* at start, every file the source has seen: the newest ``C.compact`` at or below the
  log's newest entry and every plain entry after it (a missing one fails the start);
* the files of batch N again: every entry after ``offsets/N-1``'s logOffset up to
  ``offsets/N``'s, each as its plain file or, where that is gone, inside the newest
  compaction ("batch K doesn't exist" otherwise). Both lie within the first read when
  the log's newest entry is at least ``offsets/N``'s logOffset, so one chain check covers
  them.

Which line is which source: ``offsets/N`` has one line per source *reference* of the
query's plan, in the plan's order, while ``sources/I`` is numbered per distinct source in
the order each is first met. A query that reads the same stream twice (``a.union(a)``)
has one more line than sources, the second line a copy of the first at every batch.
Lines are mapped to sources directly when nothing shows a repeated reference, through
the repetitions when the listing's source count says so, and refused when both readings
fit and disagree (nothing is guessed for a rollback or a savepoint).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from statehold.spark_checkpoints.errors import SparkCheckpointError
from statehold.spark_checkpoints.layout import SOURCES_DIR


def log_offset(offset: Any) -> int | None:
    """A file source's offset (``{"logOffset": K}``): K; None for any other source."""
    if isinstance(offset, dict) and type(offset.get("logOffset")) is int:
        return int(offset["logOffset"])
    return None


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def line_owners(
    lines: list[Any],
    sources: set[int],
    history: Callable[[], list[list[Any]]],
    where: str,
) -> list[int | None]:
    """The source id of each line of an offsets file (None: no source of the listing).

    `sources`: the source ids the listing holds logs for; `history`: every held offsets
    file's lines (read only when a line repeats an earlier one in `lines`)."""
    direct: list[int | None] = list(range(len(lines)))
    if not any(_same(lines[j], lines[i]) for j in range(len(lines)) for i in range(j)):
        return direct
    held = [h for h in history() if len(h) == len(lines)] or [lines]
    first: list[int] = []  # indices of the lines that open a distinct source
    repeats: dict[int, int] = {}
    for j in range(len(lines)):
        twin = next((i for i in first if all(_same(h[i], h[j]) for h in held)), None)
        if twin is None:
            first.append(j)
        else:
            repeats[j] = twin
    if not repeats:
        return direct
    through: list[int | None] = [None] * len(lines)
    for number, j in enumerate(first):
        through[j] = number
    for j, twin in repeats.items():
        through[j] = through[twin]
    count = max(sources, default=-1) + 1
    if count > len(first):
        return direct  # more sources than distinct references: the copies are coincidence
    if count == len(first) and count < len(lines):
        return through

    def by(owners: list[int | None]) -> dict[int, Any]:
        return {o: lines[j] for j, o in enumerate(owners) if o is not None and o in sources}

    if _agree(by(direct), by(through)):
        return direct
    raise SparkCheckpointError(
        f"{where}: cannot tell which of its {len(lines)} lines belongs to which of the "
        f"sources {sorted(sources)} (a stream read twice in one query?): refused rather "
        "than guessed"
    )


def _agree(a: Mapping[int, Any], b: Mapping[int, Any]) -> bool:
    return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)


@dataclass
class SourceNeeds:
    """What a restart reads of one source's log: the keys, and what is missing."""

    source: int
    #: The newest entry a restart reads (the log's own count for a file source).
    top: int
    files: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def source_needs(
    source: int, log: Mapping[int, str], top: int, batch: int, file_source: bool
) -> SourceNeeds:
    """The entries of `source`'s log (batch -> key) a restart after `batch` reads, up to
    `top`. A file source's chain, from the newest compaction at or below `top` to `top`,
    must be whole; another source's log (Kafka's initial offsets) is kept as it is."""
    needs = SourceNeeds(source, top, files=[k for b, k in sorted(log.items()) if b <= top])
    if not file_source:
        return needs
    base = max((b for b, k in log.items() if b <= top and k.endswith(".compact")), default=-1)
    start = max(base, 0)
    # the first and last missing entry, found in steps bounded by the log's size: `top`
    # comes from a file and may be huge (a range of it would be materialised)
    first, last = start, top
    while first <= top and first in log:
        first += 1
    while last >= first and last in log:
        last -= 1
    if first <= top:
        gap = f"{first}" + (f"-{last}" if last > first else "")
        needs.problems.append(
            f"{SOURCES_DIR}/{source}/{first}: missing (a restart after batch {batch} "
            f"reads source {source}'s log from {start} to {top}; entries {gap} are gone)"
        )
    return needs


def source_tops(
    lines: list[Any],
    owners: list[int | None],
    logs: Mapping[int, Mapping[int, str]],
    batch: int,
    as_is: bool,
) -> dict[int, tuple[int, bool]]:
    """Per source with a log, or recorded as a file source: the newest entry a restart after
    `batch` reads, and whether it is a file source. A file source reads to its logOffset
    in ``offsets/<batch>`` and, restarted as the location stands (`as_is`: `batch` is
    its newest), to the newest entry of its log (an entry written just before a driver
    died counts as seen); any other source's log is kept up to the batch."""
    recorded: dict[int, int] = {}
    for j, owner in enumerate(owners):
        offset = log_offset(lines[j]) if j < len(lines) else None
        if owner is not None and offset is not None:
            recorded[owner] = max(offset, recorded.get(owner, -1))
    tops: dict[int, tuple[int, bool]] = {}
    for source in sorted({*logs, *recorded}):  # a file source whose log is gone whole too
        log = logs.get(source, {})
        if source in recorded:
            newest = max(log, default=-1)
            tops[source] = (max(recorded[source], newest) if as_is else recorded[source], True)
        else:
            tops[source] = (batch, False)
    return tops
