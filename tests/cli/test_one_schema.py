"""One ``--json`` schema per verb whatever the location (issue 42): ``list``, ``inspect``,
``verify``, ``du``, ``gc --dry-run`` and ``history`` on a statehold job directory and on a
Spark checkpoint location (a committed fixture: no Spark starts) print the same keys with
the same JSON types, the keys of the verb's model in `statehold.format.results`."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

import statehold
from statehold.cli import app
from statehold.format import results
from statehold.storage import open_storage
from tests.support.jobs import build_job
from tests.support.spark_locations.committed_fixtures import extract, fixture

VERBS: list[tuple[list[str], type[BaseModel]]] = [
    (["list"], results.Listing),
    (["inspect"], results.InspectReport),
    (["verify"], results.VerifyReport),
    (["du"], results.UsageReport),
    (["gc", "--dry-run"], results.GcReport),
    (["history"], results.History),
]


@pytest.fixture(scope="module")
def locations(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("one-schema")
    build_job(open_storage(str(root / "job")))
    spark = fixture(extract("4.3.0", root / "spark"), "4.3.0", "window", "rocksdb")
    return {"job": str(root / "job"), "spark": str(spark.checkpoint)}


def _json_type(value: Any) -> str:
    return type(value).__name__


def run_json(*args: str) -> dict[str, Any]:
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, (args, result.stdout, result.stderr)
    doc = json.loads(result.stdout)
    assert isinstance(doc, dict)
    return doc


@pytest.mark.parametrize(("verb", "model"), VERBS, ids=[v[0] for v, _ in VERBS])
def test_same_keys_and_types(verb: list[str], model: type[BaseModel],
                             locations: dict[str, str]) -> None:
    job = run_json(*verb, locations["job"])
    spark = run_json(*verb, locations["spark"])
    assert (job["location_kind"], spark["location_kind"]) == ("job", "spark")
    assert set(job) == set(spark) == set(model.model_fields), set(job) ^ set(spark)
    # A key only one world fills is null in the other; where both fill it, one type.
    differ = {k: (_json_type(job[k]), _json_type(spark[k])) for k in job
              if None not in (job[k], spark[k]) and _json_type(job[k]) != _json_type(spark[k])}
    assert differ == {}, differ
    # ... and the keys both worlds have for every location are filled by both
    for key in ("uri", "location_kind"):
        assert job[key] and spark[key]


def test_gc_counts_and_samples(locations: dict[str, str]) -> None:
    """gc's ``protected`` and ``foreign`` are key samples in both worlds, counted apart."""
    for where in ("job", "spark"):
        doc = run_json("gc", "--dry-run", locations[where])
        for key in ("protected", "foreign"):
            assert isinstance(doc[key], list) and isinstance(doc[f"{key}_count"], int)
            assert len(doc[key]) <= doc[f"{key}_count"], (where, key, doc)


def test_a_copy_has_one_schema(locations: dict[str, str], tmp_path: Path) -> None:
    """``export`` of a job's checkpoint and ``savepoint`` of a Spark location: a
    `CopyReport` each."""
    job = run_json("export", locations["job"], str(tmp_path / "exported"))
    spark = run_json("savepoint", locations["spark"], str(tmp_path / "saved"))
    assert set(job) == set(spark) == set(results.CopyReport.model_fields)
    assert job["verified"] is spark["verified"] is True
    assert (job["location_kind"], spark["location_kind"]) == ("job", "spark")


def test_the_report_has_one_schema_and_one_frame(locations: dict[str, str],
                                                 tmp_path: Path) -> None:
    """``report``: one `ReportSummary` in both worlds, and one page frame (its style and
    heading shared, the sections each kind's); the Python verb says what the CLI says."""
    pages = {}
    for where, heading in (("job", "Job directory"), ("spark", "Spark checkpoint")):
        html = tmp_path / f"{where}.html"
        doc = run_json("report", "--html", str(html), locations[where])
        assert doc["location_kind"] == where and doc["html"] == str(html)
        assert set(doc) == set(results.ReportSummary.model_fields)
        pages[where] = html.read_text(encoding="utf-8")
        assert f"<h1>{heading}: " in pages[where]
        with statehold.open(locations[where]) as location:
            made = location.report()
        assert made.summary.model_dump() == {**doc, "html": ""}
        assert '<table id="problems">' not in made.page and 'id="problems"' in made.page
    style = [re.search(r"<style>(.*?)</style>", page, re.S) for page in pages.values()]
    assert style[0] is not None and style[1] is not None and style[0][1] == style[1][1]
