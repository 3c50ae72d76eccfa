"""A tool's view of a job directory's files: its listing page by page, counted by a
`Progress`, and the savepoints in it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from statehold.cleanup.policy import parse
from statehold.format.layout import Kind
from statehold.job.directory import JobDirectory
from statehold.job.locate import ToolError
from statehold.progress import NoProgress, Progress
from statehold.storage import FileInfo, StorageError
from statehold.storage.base import NamePage

__all__ = [
    "NoProgress",
    "Progress",
    "listing",
    "one_line",
    "pages",
    "parse",
    "savepoint_keys",
    "stat_pages",
]


def listing(job: JobDirectory, progress: Progress | None = None) -> list[FileInfo]:
    return [info for page in pages(job, progress) for info in page]


#: A page of a listing: files with their stat, or one directory's names (`NamePage`).
_Page = TypeVar("_Page", list[FileInfo], NamePage)


def pages(job: JobDirectory, progress: Progress | None = None) -> Iterator[list[FileInfo]]:
    """The job directory's listing, page by page (ToolError if it cannot be listed);
    `progress` counts the files listed."""
    return _counted(job, job.storage.list_pages, progress)


def stat_pages(job: JobDirectory, progress: Progress | None = None) -> Iterator[NamePage]:
    """`pages` as `Storage.list_stat_pages` gives them: one directory's plain files as
    names with their sizes, or files with their stat."""
    return _counted(job, job.storage.list_stat_pages, progress)


def _counted(
    job: JobDirectory, listing: Callable[[], Iterator[_Page]], progress: Progress | None
) -> Iterator[_Page]:
    """`listing()`'s pages, counted by `progress`; a storage error as a ToolError."""
    progress = progress or NoProgress()
    progress.start(f"listing {job.uri}", None, "files")
    try:
        for page in listing():
            yield page
            progress.advance(len(page))
    except StorageError as e:
        raise ToolError(f"{job.uri}: cannot list: {e}") from e


def savepoint_keys(files: Iterable[FileInfo]) -> list[str]:
    return sorted(i.key for i in files if parse(i.key).kind is Kind.SAVEPOINT_METADATA)


def one_line(e: BaseException) -> str:
    return " ".join(str(e).split())
