"""`statehold.open`: a location's kind decided once, one handle per kind, and one clear
error for anything else (absent, empty, a file, something else, the marks of both)."""

from __future__ import annotations

from pathlib import Path

import pytest

import statehold
from statehold.errors import InvalidArgumentError
from statehold.format.location_kind import AmbiguousLocationError
from statehold.job.directory import NotAJobDirectoryError
from statehold.spark_checkpoints import NotASparkCheckpointError, SparkLocation
from statehold.storage import open_storage
from statehold.tools.locations import JobLocation, UnknownLocationError
from tests.support.jobs import build_job


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("open") / "job"
    build_job(open_storage(str(root)))
    return root


def spark_like(root: Path) -> Path:
    """A location with a Spark checkpoint's top level (what tells the kind; nothing of
    it is read by `open`)."""
    (root / "offsets").mkdir(parents=True)
    (root / "commits").mkdir()
    (root / "metadata").write_text('{"id":"q"}\n')
    return root


def test_a_job_directory_and_a_checkpoint_in_it(job: Path, tmp_path: Path) -> None:
    with statehold.open(str(job)) as location:
        assert isinstance(location, JobLocation)
        assert location.inspect().checkpoint_id == 5  # the newest retained
        assert location.listing().location_kind == "job"
        with pytest.raises(InvalidArgumentError, match="grace"):
            location.gc(dry_run=True, grace=1.0)
        copied = location.copy(str(tmp_path / "copy"), at=3)
    assert (copied.checkpoint_id, copied.uri) == (3, copied.source)
    with statehold.open(str(job / "chk-4")) as location:
        assert isinstance(location, JobLocation)
        assert location.inspect().checkpoint_id == 4
        assert location.verify().metadata_path == "chk-4/_metadata"
    with statehold.open(str(job / "savepoints" / "sp")) as location:
        assert location.inspect().kind == "savepoint"


def test_a_spark_location_even_where_a_job_would_name_a_savepoint(tmp_path: Path) -> None:
    for where in (tmp_path / "ckpt", tmp_path / "backups" / "savepoints" / "orders"):
        location = statehold.open(str(spark_like(where)))
        assert isinstance(location, SparkLocation) and location.uri.endswith(where.name)


@pytest.mark.parametrize("what", ["absent", "empty", "a file", "other files"])
def test_anything_else_is_one_error_of_both_kinds(what: str, tmp_path: Path) -> None:
    target = tmp_path / "here"
    if what == "empty":
        target.mkdir()
    elif what == "a file":
        target.write_text("x")
    elif what == "other files":
        (target / "data").mkdir(parents=True)
        (target / "data" / "report.csv").write_text("a,b\n")
    with pytest.raises(UnknownLocationError) as caught:
        statehold.open(str(target))
    assert isinstance(caught.value, NotAJobDirectoryError)
    assert isinstance(caught.value, NotASparkCheckpointError)
    message = str(caught.value)
    assert "\n" not in message and str(target) in message
    if what in ("empty", "other files"):
        assert "not a statehold job directory" in message
        assert "not a Spark checkpoint location" in message


def test_the_marks_of_both_are_refused(job: Path, tmp_path: Path) -> None:
    both = spark_like(tmp_path / "both")
    (both / "_ha").mkdir()
    with pytest.raises(AmbiguousLocationError, match="refusing to guess"):
        statehold.open(str(both))
    assert list(both.iterdir())  # nothing deleted or written
