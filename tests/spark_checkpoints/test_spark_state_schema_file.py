"""A state store's schema file (statehold.spark_checkpoints.state_schema): versions 1 and 2
as Spark writes them (the committed fixtures' real files, and files built here), and what
is refused in one line: version 3 (transformWithState's, read by its own reader: every
v3 file of the fixtures reads there), another version, a file cut short or
with bytes after its schemas, JSON that is not a schema."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from statehold.spark_checkpoints.errors import SparkCheckpointError
from statehold.spark_checkpoints.spark_types import Atomic, Struct
from statehold.spark_checkpoints.state_schema import read_state_schema, read_state_schema_v3
from tests.support.spark_locations.committed_fixtures import manifests
from tests.support.spark_locations.handmade_files import utf

KEY = {"type": "struct", "fields": [{"name": "key", "type": "string", "nullable": True,
                                     "metadata": {}}]}
VALUE = {"type": "struct", "fields": [{"name": "count", "type": "long", "nullable": False,
                                       "metadata": {}}]}


def v2(key: str, value: str, chunk: int = 30) -> bytes:
    def chunks(text: str) -> bytes:
        parts = [text[i : i + chunk] for i in range(0, len(text), chunk)]
        return struct.pack(">i", len(parts)) + b"".join(utf(p) for p in parts)

    return utf("v2") + chunks(key) + chunks(value)


def test_versions_1_and_2_read_the_same_schemas() -> None:
    key, value = json.dumps(KEY), json.dumps(VALUE)
    one = read_state_schema(utf("v1") + utf(key) + utf(value), "s")
    two = read_state_schema(v2(key, value), "s")
    assert one == two
    assert one.key.fields[0].type == Atomic("string")
    assert one.arrow().names == ["key", "count"]


@pytest.mark.parametrize("version", sorted(manifests()))
def test_every_schema_file_spark_wrote_in_the_fixtures_reads(
    extracted: Callable[[str], Path], version: str
) -> None:
    files = sorted(extracted(version).glob("*/ckpt/state/*/*/**/_metadata/schema"))
    assert len(files) >= 10
    for path in files:
        schema = read_state_schema(path.read_bytes(), str(path))
        assert isinstance(schema.key, Struct) and schema.key.fields, path


@pytest.mark.parametrize("version", [v for v in sorted(manifests()) if v >= "4"])
def test_every_v3_schema_file_spark_wrote_in_the_fixtures_reads(
    extracted: Callable[[str], Path], version: str
) -> None:
    files = sorted(p for p in extracted(version).glob("*/ckpt/state/*/_stateSchema/*/*")
                   if not p.name.startswith("."))
    assert files
    for path in files:
        families = {name: spec for name, _k, _v, spec in
                    read_state_schema_v3(path.read_bytes(), str(path))}
        assert set(families) == {"count", "$eventTimers_keyToTimestamp",
                                 "$eventTimers_timestampToKey"}, path
        assert "RangeKeyScan" in families["$eventTimers_timestampToKey"]


@pytest.mark.parametrize(("data", "match"), [
    (utf("v3") + struct.pack(">i", 1), "v3 .* read it by state variable"),
    (utf("v9"), "version 'v9'"),
    (b"", "cut short"),
    (v2(json.dumps(KEY), json.dumps(VALUE))[:-5], "cut short"),
    (v2(json.dumps(KEY), json.dumps(VALUE)) + b"x", "1 bytes after the schemas"),
    (utf("v2") + struct.pack(">i", 0), "0 chunks"),
    (utf("v2") + struct.pack(">i", 2**30), "chunks"),
    (utf("v1") + utf("{") + utf("{}"), "key schema.*not valid JSON"),
    (utf("v1") + utf(json.dumps(KEY)) + utf('"long"'), "value schema.*not a struct"),
    (utf("v1") + b"\x00\x02\xff\xfe" + utf("{}"), "not UTF-8"),
])
def test_what_is_not_a_schema_file_is_refused_in_one_line(data: bytes, match: str) -> None:
    with pytest.raises(SparkCheckpointError, match=match) as caught:
        read_state_schema(data, "state/0/0/_metadata/schema")
    assert "\n" not in str(caught.value)
