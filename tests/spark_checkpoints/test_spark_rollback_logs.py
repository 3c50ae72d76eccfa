"""Rollback and relocation of the file logs on hand-made locations (a stateless query's
logs): compacted logs that cannot be rolled back, a file sink's log, checksum files, and
the deletion rule's refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from statehold.spark_checkpoints import SparkCheckpointError, open_spark_checkpoint
from statehold.spark_checkpoints.policy import DeletionRefusedError, check_rollback_deletable
from statehold.spark_checkpoints.relocate import absolute_paths, hadoop_crc, relocate
from statehold.spark_checkpoints.rollback import rollback


def _log(path: Path, entries: list[dict[str, object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "\n".join(["v1", *(json.dumps(e, separators=(",", ":")) for e in entries)]).encode()
    path.write_bytes(data)
    (path.parent / f".{path.name}.crc").write_bytes(hadoop_crc(data))


def _location(root: Path, batches: int, compact_source_at: int | None = None) -> None:
    (root / "metadata").parent.mkdir(parents=True, exist_ok=True)
    (root / "metadata").write_text('{"id":"q"}')
    for b in range(batches):
        meta = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": b, "conf": {}})
        (root / "offsets").mkdir(exist_ok=True)
        (root / "commits").mkdir(exist_ok=True)
        (root / "offsets" / str(b)).write_text(f'v1\n{meta}\n{{"logOffset":{b}}}')
        (root / "commits" / str(b)).write_text('v1\n{"nextBatchWatermarkMs":0}')
        entry = {"path": f"file:///data/in/{b}.json", "timestamp": 7, "batchId": b}
        if compact_source_at == b:
            entries = [
                {"path": f"file:///data/in/{i}.json", "timestamp": 7, "batchId": i}
                for i in range(b + 1)
            ]
            _log(root / "sources" / "0" / f"{b}.compact", entries)
        elif compact_source_at is None or b > compact_source_at:
            _log(root / "sources" / "0" / str(b), [entry])


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_a_compacted_source_log_after_the_batch_without_the_plain_files_is_refused(
    tmp_path: Path,
) -> None:
    _location(tmp_path / "ckpt", 6, compact_source_at=3)
    before = _listing(tmp_path / "ckpt")
    with pytest.raises(SparkCheckpointError, match=r"sources/0/0: missing .* entries 0-1 are gone"):
        rollback(open_spark_checkpoint(str(tmp_path / "ckpt")), 1, grace_seconds=0)
    assert _listing(tmp_path / "ckpt") == before
    report = rollback(
        open_spark_checkpoint(str(tmp_path / "ckpt")), 4, grace_seconds=0, keep=str(tmp_path / "k")
    )
    assert report.deleted == ["commits/5", "offsets/5", "sources/0/.5.crc", "sources/0/5"]
    assert "sources/0/3.compact" in _listing(tmp_path / "ckpt")


def test_a_file_sinks_log_is_rolled_back_with_the_checkpoint(tmp_path: Path) -> None:
    _location(tmp_path / "ckpt", 5)
    sink = tmp_path / "sink"
    for b in range(5):
        _log(
            sink / "_spark_metadata" / str(b),
            [
                {
                    "path": f"file://{sink}/part-{b}.parquet",
                    "size": 10,
                    "isDir": False,
                    "action": "add",
                }
            ],
        )
    report = rollback(
        open_spark_checkpoint(str(tmp_path / "ckpt")),
        2,
        grace_seconds=0,
        keep=str(tmp_path / "kept"),
        sink=str(sink),
    )
    assert report.sink_deleted == [
        "_spark_metadata/.4.crc",
        "_spark_metadata/4",
        "_spark_metadata/.3.crc",
        "_spark_metadata/3",
    ]
    assert _listing(sink) == [
        f"_spark_metadata/{n}" for n in (".0.crc", ".1.crc", ".2.crc", "0", "1", "2")
    ]
    assert _listing(tmp_path / "kept")  # what was removed is kept
    assert "offsets/4" in _listing(tmp_path / "kept") and "offsets/4" not in _listing(
        tmp_path / "ckpt"
    )


def test_relocate_rewrites_source_and_sink_logs_and_their_checksums(tmp_path: Path) -> None:
    _location(tmp_path / "ckpt", 3)
    sink = tmp_path / "sink"
    _log(sink / "_spark_metadata" / "0", [{"path": "file:///data/out/p0", "size": 3}])
    ckpt = open_spark_checkpoint(str(tmp_path / "ckpt"))
    assert len(absolute_paths(ckpt, sink=str(sink))) == 4

    report = relocate(ckpt, "/data", "/moved/data", sink=str(sink), force=True)

    assert report.paths == 4 and report.files[-1] == "_spark_metadata/0"
    text = (tmp_path / "ckpt" / "sources" / "0" / "1").read_bytes()
    assert text == b'v1\n{"path":"file:///moved/data/in/1.json","timestamp":7,"batchId":1}'
    assert (tmp_path / "ckpt" / "sources" / "0" / ".1.crc").read_bytes() == hadoop_crc(text)
    assert json.loads((sink / "_spark_metadata" / "0").read_text().split("\n")[1]) == {
        "path": "file:///moved/data/out/p0",
        "size": 3,
    }


@pytest.mark.parametrize(
    "key",
    [
        "metadata",
        "state/0/1/SSTs/000001-x.sst",
        "state/0/1/_metadata/schema",
        "state/0/_metadata/metadata",
        "notes.txt",
        ".metadata.crc",
    ],
)
def test_the_rollback_rule_refuses_what_a_rollback_has_no_business_with(key: str) -> None:
    with pytest.raises(DeletionRefusedError):
        check_rollback_deletable(key)


@pytest.mark.parametrize(
    "key",
    [
        "offsets/3",
        "commits/.3.crc",
        "sources/0/9.compact",
        "state/0/1/7.zip",
        "state/0/1/left-keyToNumValues/7_ab-12.changelog",
        "state/0/1/.7.delta.crc",
        "state/0/1/7_ab.zip.crc",
        "state/0/_metadata/v2/9",
        "state/0/_stateSchema/default/9_ab-1",
        "_spark_metadata/4",
    ],
)
def test_the_rollback_rule_allows_later_batches_files(key: str) -> None:
    check_rollback_deletable(key)
