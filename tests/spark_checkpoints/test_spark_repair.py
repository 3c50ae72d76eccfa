"""`repair` on the committed fixtures of the newest PySpark (tests/fixtures/spark/, written by
real Spark; no JVM here): each damage of `verify --deep`'s tests (tests/support/spark_damage)
planted in a copy, then the plan chosen for the damaged store (a snapshot set aside, a
rollback, or nothing that can repair it), `--dry-run` changing nothing (every file's size
and mtime), the files set aside moved under ``_repaired/<time>/`` with their bytes,
`verify --deep` passing after, the ``--keep`` copy holding the whole location as it was,
gc and its rule leaving ``_repaired/`` alone and `list` showing it; the rule a set-aside
asks; the same on a location on S3 (moto), its keep there too, proven by listing the
bucket. Spark restarting from a repaired location is test_spark_repair_live.py's."""

from __future__ import annotations

import json
import re
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from statehold.cli.app import app
from statehold.spark_checkpoints import SparkCheckpointError, open_spark_checkpoint
from statehold.spark_checkpoints.layout import Kind, parse
from statehold.spark_checkpoints.policy import (
    DeletionRefusedError,
    check_deletable,
    check_rollback_deletable,
    check_set_aside,
)
from statehold.spark_checkpoints.repair import _move
from statehold.storage import open_storage
from statehold.storage.base import UnsafePathError
from tests.support.infra.object_store_servers import S3Server
from tests.support.spark_locations.committed_fixtures import copy_of, make_old, manifests
from tests.support.spark_locations.disk_trees import TWO_HOURS
from tests.support.spark_locations.planted_damage import (
    CASES,
    Plant,
    hdfs_snapshot_corrupted,
    needs_of,
    newest_changelog_cut_short,
    queries,
    zip_cut_short,
)

VERSION = sorted(manifests())[-1]
runner = CliRunner()

#: The step each damage gets on its store, on the newest PySpark's fixtures: set aside
#: where an older snapshot and its changelogs or deltas rebuild the version, else a
#: rollback, else nothing (the batches retained before it are not whole either).
EXPECTED: dict[tuple[str, str], str] = {
    ("sst-same-size", "rocksdb"): "rollback",
    ("sst-same-size", "rocksdb_changelog"): "set-aside",
    ("sst-wrong-size", "rocksdb"): "rollback",
    ("zip-cut-short", "rocksdb"): "rollback",
    ("zip-deleted", "rocksdb"): "rollback",
    ("changelog-deleted", "rocksdb_changelog"): "rollback",
    ("changelog-deleted", "rocksdb_v2"): "rollback",
    ("changelog-cut-short", "rocksdb_changelog"): "rollback",
    ("changelog-cut-short", "rocksdb_v2"): "rollback",
    ("delta-deleted", "hdfs"): "unrepairable",
    ("hdfs-snapshot-corrupt", "hdfs"): "set-aside",
    ("hdfs-snapshot-bit-rot", "hdfs"): "set-aside",
    ("version-missing", "hdfs"): "rollback",
    ("version-missing", "rocksdb_changelog"): "rollback",
    ("version-missing", "rocksdb_v2"): "rollback",
}
PARAMS = [(name, plant, provider, tried) for name, plant, provider, tried in CASES
          if queries(VERSION, provider)]


def files_of(root: Path) -> dict[str, tuple[int, int]]:
    """Every file below `root` with its size and mtime (ns)."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in root.rglob("*") if p.is_file()}


def planted(extracted: Callable[[str], Path], tmp_path: Path, name: str, plant: Plant,
            provider: str, tried: list[str]) -> tuple[Path, str]:
    """A copy of the first location of `tried` the damage can be planted in, made old
    again (a stopped query's); the location and the damaged file's key."""
    for query in tried:
        fx = copy_of(extracted(VERSION), VERSION, query, provider, tmp_path / query)
        damage = plant(fx.checkpoint, needs_of(open_spark_checkpoint(str(fx.checkpoint))))
        if damage is not None:
            make_old(fx.checkpoint, TWO_HOURS)
            return fx.checkpoint, damage.path
        shutil.rmtree(tmp_path / query)
    raise AssertionError(f"no location of {provider} to plant {name} in: {tried}")


@pytest.mark.parametrize(("name", "plant", "provider", "tried"), PARAMS,
                         ids=[f"{n}-{p}" for n, _f, p, _q in PARAMS])
def test_repair_each_damage(
    extracted: Callable[[str], Path], tmp_path: Path, name: str, plant: Plant,
    provider: str, tried: list[str],
) -> None:
    ckpt, damaged = planted(extracted, tmp_path, name, plant, provider, tried)
    keep = tmp_path / "keep"
    before = files_of(ckpt)
    damaged_bytes = (ckpt / damaged).read_bytes() if (ckpt / damaged).exists() else None

    # the plan, and --dry-run stops there: not a byte, not an mtime changed
    dry = runner.invoke(app, ["repair", str(ckpt), "--dry-run", "--keep", str(keep),
                              "--json"])
    assert dry.exit_code == 0, dry.stdout
    plan = json.loads(dry.stdout)
    assert files_of(ckpt) == before and not keep.exists()
    store = parse(damaged).store
    [mine] = [s for s in plan["stores"] if (s["operator"], s["partition"], s["name"]) == (
        store.operator, store.partition, store.name)]
    expected = EXPECTED[(name, provider)]
    assert mine["step"] == expected, mine
    assert damaged in [d["path"] for d in mine["damage"]], mine
    if expected != "set-aside":  # why the two steps before a rollback were not taken
        assert [n.split(":")[0] for n in mine["not_chosen"]] == [
            f"another way to version {mine['version']}", "a rebuilt snapshot"], mine
    assert plan["keep"] == str(keep) and plan["dry_run"] is True

    result = runner.invoke(app, ["repair", str(ckpt), "--keep", str(keep), "--json"])
    report = json.loads(result.stdout)
    assert report["stores"] == plan["stores"] and report["batch"] == plan["batch"]
    assert (report["rollback_to"], report["unrepairable"]) == (
        plan["rollback_to"], plan["unrepairable"])
    if expected == "unrepairable":
        assert result.exit_code == 1 and report["ok"] is False, report
        assert report["unrepairable"] and report["remaining"], report
        assert damaged in [p["path"] for p in report["remaining"]]
        assert files_of(ckpt) == before and not keep.exists()  # nothing changed
        return
    assert result.exit_code == 0 and report["ok"] is True, result.stdout
    location = open_spark_checkpoint(str(ckpt))
    after = location.verify(deep=True)
    assert after.ok, after.problems
    newest = max(int(k.split("/")[1]) for k in before
                 if k.startswith("commits/") and k.split("/")[1].isdigit())
    if expected == "set-aside":
        # the same batch, the damaged snapshot moved with its bytes, nothing else gone
        assert report["restart_batch"] == newest and report["rollback"] is None
        folder = report["repaired_dir"]
        assert folder.startswith("_repaired/") and damaged in report["moved"]
        assert not (ckpt / damaged).exists()
        if damaged_bytes is not None:
            assert (ckpt / folder / damaged).read_bytes() == damaged_bytes
        now = files_of(ckpt)
        assert {k for k in before if k not in now} == set(report["moved"])
        assert {k for k in now if k not in before} == {f"{folder}/{k}" for k in report["moved"]}
        # list shows it; gc (no grace) and its rule leave it alone
        assert location.listing().repaired == {folder: len(report["moved"])}
        listed = runner.invoke(app, ["list", str(ckpt)])
        assert f"set aside by a repair: {folder}/" in listed.stdout, listed.stdout
        gc = location.gc(grace_seconds=0.0)
        assert gc.ok and not gc.foreign_keys, gc
        assert all((ckpt / folder / k).exists() for k in report["moved"])
        with pytest.raises(UnsafePathError):
            check_deletable(f"{folder}/{damaged}")
        assert location.verify().ok  # what gc deleted no restart needed
    else:
        # an earlier batch, by rollback's rules: what it removed is in the keep
        assert report["rollback_to"] < newest and report["restart_batch"] == report[
            "rollback_to"], report
        assert report["rollback"]["kept"] == report["keep"]
        assert report["keep"].endswith(str(keep))
        assert max(int(k.split("/")[1]) for k in files_of(ckpt) if k.startswith(
            "commits/") and k.split("/")[1].isdigit()) == report["rollback_to"]
    # the keep is the whole location as it was, its damage included (to undo the repair):
    # every file with its size, the damaged one with its bytes
    assert report["kept_batch"] == newest
    assert {k: n for k, (n, _t) in files_of(keep).items()} == {
        k: n for k, (n, _t) in before.items()}
    if damaged_bytes is not None:
        assert (keep / damaged).read_bytes() == damaged_bytes


def test_repaired_is_a_kind_no_rule_deletes(tmp_path: Path) -> None:
    for key in ("_repaired/20261129T230000Z/state/0/0/6.snapshot",
                "_repaired/20261129T230000Z/state/0/0/.6.snapshot.crc",
                "_repaired/20261129T230000Z/state/0/0/SSTs/000013-x.sst"):
        assert parse(key).kind is Kind.REPAIRED
        with pytest.raises(UnsafePathError):
            check_deletable(key)
        with pytest.raises(Exception, match="never deletes"):
            check_rollback_deletable(key)


def test_a_repair_sets_aside_only_snapshots_and_ssts_and_asks_before_moving_any(
    extracted: Callable[[str], Path], tmp_path: Path
) -> None:
    """A set-aside is a move, on an object store a copy then a delete: the deletion rule
    is asked for every file first (`check_set_aside`), so a refused one moves nothing."""
    to = "_repaired/20261130T000000Z"
    for key in ("state/0/0/6.zip", "state/0/0/.6.zip.crc", "state/0/0/6.snapshot",
                "state/0/0/SSTs/000013-7c3e2b1a-0000-4000-8000-000000000000.sst"):
        check_set_aside(key, f"{to}/{key}")
        with pytest.raises(DeletionRefusedError, match="only under _repaired/"):
            check_set_aside(key, f"elsewhere/{key}")
    for key in ("offsets/5", "commits/5", "metadata", "state/0/0/6.changelog",
                "state/0/0/6.delta", "state/0/_metadata/metadata", "sources/0/5"):
        with pytest.raises(DeletionRefusedError, match="never sets this file aside"):
            check_set_aside(key, f"{to}/{key}")

    fx = copy_of(extracted(VERSION), VERSION, "window", "rocksdb_changelog", tmp_path / "w")
    location = open_spark_checkpoint(str(fx.checkpoint))
    before = files_of(fx.checkpoint)
    with pytest.raises(DeletionRefusedError, match="offsets/5"):
        _move(location, location.scan(), ["state/0/0/6.zip", "offsets/5"], to)
    assert files_of(fx.checkpoint) == before


def test_nothing_to_repair_and_refused_while_alive(
    extracted: Callable[[str], Path], tmp_path: Path
) -> None:
    fx = copy_of(extracted(VERSION), VERSION, "window", "hdfs", tmp_path / "w")
    keep = tmp_path / "keep"
    whole = open_spark_checkpoint(str(fx.checkpoint)).repair(keep=str(keep))
    assert whole.ok and not whole.stores and not whole.changed and not keep.exists()
    result = runner.invoke(app, ["repair", str(fx.checkpoint)])
    assert result.exit_code == 0 and "nothing to repair" in result.stdout
    # a file written just now: the query looks alive, as for rollback
    location = open_spark_checkpoint(str(fx.checkpoint))
    assert hdfs_snapshot_corrupted(fx.checkpoint, needs_of(location)) is not None
    before = files_of(fx.checkpoint)
    with pytest.raises(SparkCheckpointError, match="looks alive"):
        open_spark_checkpoint(str(fx.checkpoint)).repair(keep=str(keep))
    refused = runner.invoke(app, ["repair", str(fx.checkpoint), "--keep", str(keep)])
    assert refused.exit_code == 1 and "force the repair" in refused.stderr
    assert files_of(fx.checkpoint) == before and not keep.exists()
    text = runner.invoke(app, ["repair", str(fx.checkpoint), "--dry-run", "--force",
                               "--keep", str(keep)])
    assert text.exit_code == 0, text.stdout
    assert "set aside state/0/0/6.snapshot" in text.stdout, text.stdout
    assert "dry run: nothing changed" in text.stdout
    assert files_of(fx.checkpoint) == before and not keep.exists()
    forced = open_spark_checkpoint(str(fx.checkpoint)).repair(keep=str(keep), force=True)
    assert forced.ok and forced.moved, forced


# -- S3 -----------------------------------------------------------------------------------
S3_CASES = [
    # the newest zip cut short: the older zip and the changelogs after it rebuild the version
    ("zip-cut-short", zip_cut_short, "set-aside"),
    # the newest changelog cut short: only a rollback avoids it
    ("changelog-cut-short", newest_changelog_cut_short, "rollback"),
]


@pytest.mark.parametrize(("name", "plant", "expected"), S3_CASES,
                         ids=[n for n, _p, _e in S3_CASES])
def test_repair_on_s3(
    extracted: Callable[[str], Path], tmp_path: Path, s3_server: S3Server, name: str,
    plant: Plant, expected: str,
) -> None:
    """A location on S3 (a committed fixture uploaded, the damage planted first) repaired
    with its keep on S3 too: the bucket's listing shows the damaged file moved under
    ``_repaired/<time>/`` with its bytes (or the rollback's files gone), nothing else
    lost, the keep holding every file as it was; `verify --deep` passes after."""
    local, damaged = planted(extracted, tmp_path, name, plant, "rocksdb_changelog", ["window"])
    run = f"s3://{s3_server.bucket}/repair-{uuid.uuid4().hex}"
    uri, keep_uri = f"{run}/ckpt", f"{run}/keep"
    bucket = open_storage(run, **s3_server.options)
    for rel in files_of(local):
        bucket.write(f"ckpt/{rel}", (local / rel).read_bytes())
    before = {i.key.removeprefix("ckpt/"): i.size for i in bucket.list("ckpt")}
    assert before.keys() == files_of(local).keys()
    damaged_bytes = (local / damaged).read_bytes()

    # every object was uploaded just now: the query would look alive (its files' times)
    report = open_spark_checkpoint(uri, **s3_server.options).repair(
        keep=keep_uri, force=True, **s3_server.options)
    assert report.ok, report
    [mine] = [s for s in report.stores if damaged in [d.path for d in s.damage]]
    assert mine.step == expected, mine

    listed = {i.key: i.size for i in bucket.list()}
    after = {k.removeprefix("ckpt/"): n for k, n in listed.items() if k.startswith("ckpt/")}
    kept = {k.removeprefix("keep/"): n for k, n in listed.items() if k.startswith("keep/")}
    assert listed.keys() == {f"ckpt/{k}" for k in after} | {f"keep/{k}" for k in kept}
    assert kept == before  # the whole location as it was, its damage included
    assert bucket.read(f"keep/{damaged}") == damaged_bytes
    if expected == "set-aside":
        folder = report.repaired_dir
        assert folder is not None and re.fullmatch(r"_repaired/\d{8}T\d{6}Z", folder)
        assert damaged in report.moved and report.rollback is None
        assert {k for k in before if k not in after} == set(report.moved)
        assert {k for k in after if k not in before} == {f"{folder}/{k}" for k in report.moved}
        assert all(after[f"{folder}/{k}"] == before[k] for k in report.moved)
        assert bucket.read(f"ckpt/{folder}/{damaged}") == damaged_bytes
    else:
        assert report.rollback is not None and not report.moved
        assert damaged in report.rollback.deleted
        assert {k for k in before if k not in after} == set(report.rollback.deleted)
        assert after.keys() <= before.keys()
    assert all(after[k] == n for k, n in before.items() if k in after)  # none rewritten
    assert open_spark_checkpoint(uri, **s3_server.options).verify(deep=True).ok
