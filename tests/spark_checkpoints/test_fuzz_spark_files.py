"""Every decoder of a Spark checkpoint file, fuzzed: the offsets, commit (v1 and v2) and
file-source logs, a RocksDB snapshot zip and the file list inside it, an lz4 stream
(changelog, delta, HDFS snapshot: whole, and read in small chunks; with lz4-java's block
checksums verified, as `verify --deep` reads them), a format-v2 changelog's lineage
header, a typed changelog read to its end, the schema files (v2 and v3), UnsafeRows,
transformWithState's RocksDB keys (prefix scan; range scan, with its marker bytes) and a
list state's values, a session window's prefix-scan key, and the names of a location's
files. Then
whole locations: one file of a small location replaced by a mutation, and the location
read as the tools read it (listing, verify, verify --deep, du, history, the absolute
paths, a dry-run gc).

The strategies are tests/format/test_fuzz_decoders.py's (tests/support/fuzz.py): arbitrary
bytes, and mutations of a valid file (its JSON lines' values replaced by extreme ones,
bytes flipped, inserted, deleted, truncated). A decode either succeeds or raises
SparkCheckpointError with one bounded line; nothing else escapes. A 1 MB input, and an
lz4 block header claiming a 2 GB block, are decoded within a bounded peak of memory.

A crafted Spark checkpoint location is what an outside tool meets most: it is written by
Spark, by a user's copy, or by anyone who can write the bucket. tests/spark_checkpoints/
test_spark_verify.py has the crafted cases; this module looks for what nobody thought of.
"""

from __future__ import annotations

import io
import json
import shutil
import struct
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statehold.spark_checkpoints import open_spark_checkpoint
from statehold.spark_checkpoints.errors import SparkCheckpointError
from statehold.spark_checkpoints.layout import Kind, parse
from statehold.spark_checkpoints.logs import parse_commit, parse_file_log, parse_offsets
from statehold.spark_checkpoints.prefix_keys import PrefixKeys
from statehold.spark_checkpoints.spark_types import (
    Array,
    Atomic,
    Decimal,
    Field,
    Map,
    Struct,
)
from statehold.spark_checkpoints.state_files import (
    check_stream,
    decompressed,
    lineage,
    read_zip_metadata,
)
from statehold.spark_checkpoints.state_reader import arrow_batch
from statehold.spark_checkpoints.state_records import changelog_records, typed_changelog_records
from statehold.spark_checkpoints.state_records import records as read_records
from statehold.spark_checkpoints.state_schema import (
    StateSchema,
    read_state_schema,
    read_state_schema_v3,
)
from statehold.spark_checkpoints.tws_state import Family, family_prefix
from statehold.spark_checkpoints.unsafe_row import decode_row, row_decoder
from tests.support.fuzz import (
    FUZZ,
    JSONISH,
    MAX_MESSAGE,
    MAX_PEAK,
    byte_mutations,
    decoded_or_refused,
    json_mutations,
    peaks_over,
)
from tests.support.spark_locations.handmade_files import (
    lineage_header,
    logs,
    lz4_stream,
    records,
    rocksdb_changelog_store,
    snapshot_zip,
    utf,
    write,
)
from tests.support.spark_locations.unsafe_rows import encode_row

STORE = "state/0/0"


def _offsets() -> bytes:
    meta = {"batchWatermarkMs": 5000, "batchTimestampMs": 1_700_000_000_000,
            "conf": {"spark.sql.streaming.stateStore.providerClass":
                     "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"}}
    return f'v1\n{json.dumps(meta)}\n{{"logOffset":3}}\n-'.encode()


def _commit_v2() -> bytes:
    doc = {"nextBatchWatermarkMs": 5000,
           "stateUniqueIds": {"0": [["6b0c6fd4-6a8c-4ae2-9d43-3b4f6c1b1c1e"]]}}
    return f"v2\n{json.dumps(doc)}".encode()


def _file_log() -> bytes:
    entries = [{"path": f"file:///data/in/{i:05d}.json", "timestamp": 1, "batchId": 3}
               for i in range(3)]
    return ("v1\n" + "\n".join(json.dumps(e) for e in entries)).encode()


def _zip_text() -> bytes:
    """The `metadata` member of a snapshot zip, as text (mutated, then zipped)."""
    with zipfile.ZipFile(io.BytesIO(_zip())) as archive:
        return archive.read("metadata")


def _zip() -> bytes:
    return snapshot_zip({"000011-6b0c6fd4-6a8c-4ae2-9d43-3b4f6c1b1c1e.sst": 120,
                         "000012-0d6cbe0e-3f37-4a5e-9c1a-6a3f3f0e2b11.sst": 340})


def _zipped(text: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("CURRENT", "MANIFEST-000005\n")
        archive.writestr("metadata", text)
    return buffer.getvalue()


def _stream() -> bytes:
    return lz4_stream(records([(b"k%d" % i, b"v" * i) for i in range(40)] + [(b"gone", None)]),
                      block=256)


def _chunks(data: bytes, size: int = 7) -> object:
    return iter([data[i : i + size] for i in range(0, len(data), size)])


def _lineage() -> bytes:
    return lineage_header([(4, "6b0c6fd4-6a8c"), (5, "0d6cbe0e-3f37")]) + b"\x00\x00\x00\x05"


#: A key and a value schema with every kind of layout: fixed slots, variable-length
#: values, a wide decimal, nesting, an array and a map.
_KEY = Struct((Field("k", Atomic("string")), Field("w", Struct((
    Field("start", Atomic("timestamp")), Field("end", Atomic("timestamp_ntz")))))))
_VALUE = Struct(tuple(Field(f"v{i}", t) for i, t in enumerate([
    Atomic("long"), Atomic("integer"), Atomic("boolean"), Atomic("double"), Atomic("date"),
    Atomic("binary"), Decimal(10, 2), Decimal(30, 4), Array(Atomic("string")),
    Map(Atomic("integer"), Array(Atomic("short"))), Atomic("void")])))
_STATE = StateSchema(_KEY, _VALUE)


def _key_row() -> bytes:
    return encode_row(("k1", (1_699_999_800_000_000, 5)), _KEY)


def _value_row() -> bytes:
    from decimal import Decimal as D

    return encode_row((7, -3, True, 0.5, 19_000, b"\x01\x02", D("1.25"), D("-12345.6789"),
                       ["a", None, "bc"], [(1, [2, None]), (3, [])], None), _VALUE)


def _decode_value(data: bytes) -> object:
    """A value row decoded, then made an Arrow batch (where a value out of its Arrow
    type's range would show)."""
    row = decode_row(data, _VALUE, f"{STORE}/3.delta (a value)")
    return arrow_batch([("k", None, *row)], _STATE.arrow(), "store")


#: A flat row (fixed-width, string and binary fields): `row_decoder`'s own fast path.
_FLAT = Struct(tuple(Field(f"f{i}", Atomic(t)) for i, t in enumerate(
    ["long", "string", "integer", "binary", "boolean", "double", "short", "string"])))


def _flat_row() -> bytes:
    return encode_row((-5, "héllo", 7, b"\x00\xff", False, 2.5, -2, None), _FLAT)


def _schema_file() -> bytes:
    key = json.dumps({"type": "struct", "fields": [
        {"name": "key", "type": "string", "nullable": True, "metadata": {}},
        {"name": "a", "type": {"type": "array", "elementType": "decimal(30,2)",
                               "containsNull": True}, "nullable": True, "metadata": {}}]})
    value = json.dumps({"type": "struct", "fields": [
        {"name": "count", "type": "long", "nullable": False, "metadata": {}}]})
    return (utf("v2") + struct.pack(">i", 2) + utf(key[:40]) + utf(key[40:])
            + struct.pack(">i", 1) + utf(value))


def _delta() -> bytes:
    pairs: list[tuple[bytes, bytes | None]] = [(_key_row(), _value_row()) for _ in range(8)]
    return lz4_stream(records([*pairs, (_key_row(), None)]), block=512)


def _decode_delta(data: bytes) -> object:
    """How many records the stream holds, each decoded (memory: one record)."""
    key = f"{STORE}/3.delta"
    count = 0
    for k, v in read_records(decompressed(iter([data]), key), key, deletes=True):
        decode_row(k, _KEY, key)
        if v is not None:
            _decode_value(v)
        count += 1
    return count


def _changelog_v3() -> bytes:
    """A format-v2 changelog: its lineage header, then RocksDB's records (the state
    encoding version byte before each row)."""
    pairs: list[tuple[bytes, bytes | None]] = [
        (b"\x00" + _key_row(), b"\x00" + _value_row()), (b"\x00" + _key_row(), None)]
    return lz4_stream(records(pairs, header=lineage_header([(4, "6b0c6fd4-6a8c")])),
                      block=256)


def _decode_changelog(data: bytes) -> object:
    key = f"{STORE}/5_u.changelog"
    return sum(1 for _ in changelog_records(decompressed(iter([data]), key), key))


def _decode_checksummed(data: bytes) -> object:
    """`verify --deep`'s read of a stream: each block's lz4-java checksum verified."""
    key = f"{STORE}/3.delta"
    return sum(len(b) for b in decompressed(iter([data]), key, checksums=True))


def _changelog_typed() -> bytes:
    """A changelog of column families (v4: its lineage, typed records, a 0 ending them),
    which `verify --deep` reads to its end without its records."""
    lineage_json = json.dumps([{"version": 4, "checkpointUniqueId": "6b0c6fd4-6a8c"}])
    body = utf("v4") + utf(lineage_json) + b"\x01" + struct.pack(">i", 3) + b"key" + b"\x00"
    return lz4_stream(body, block=256)


def _decode_typed_changelog(data: bytes) -> object:
    key = f"{STORE}/5_u.changelog"
    return sum(1 for _ in changelog_records(decompressed(iter([data]), key, checksums=True),
                                            key, typed=True))


def _changelog_typed_records() -> bytes:
    """A v2 changelog of column families with a put, a merge, a delete and a range delete."""
    def record(op: int, key: bytes, value: bytes | None) -> bytes:
        size = -1 if value is None else len(value)
        return (bytes([op]) + struct.pack(">i", len(key)) + key + struct.pack(">i", size)
                + (value or b""))

    body = (utf("v2") + record(1, b"\x02\x00k", b"\x00v") + record(0x11, b"\x03\x00k", b"\x00w")
            + record(0x10, b"\x02\x00j", None) + record(0x20, b"\x04\x00", b"\x05\x00") + b"\x00")
    return lz4_stream(body, block=64)


def _decode_typed_records(data: bytes) -> object:
    key = f"{STORE}/5.changelog"
    return list(typed_changelog_records(decompressed(iter([data]), key), key))


def _schema_v3() -> bytes:
    def chunks(text: str) -> bytes:
        return struct.pack(">i", 1) + utf(text)

    family = (utf("count") + b"\x00\x00" + chunks(json.dumps(_KEY_JSON)) + b"\x00\x00"
              + chunks(json.dumps(_KEY_JSON))
              + chunks('{"keyStateEncoderType":"NoPrefixKeyStateEncoderSpec"}')
              + chunks("{    }"))
    return utf("v3") + struct.pack(">i", 1) + family


_KEY_JSON = {"type": "struct", "fields": [
    {"name": "key", "type": "string", "nullable": True, "metadata": {}}]}

#: transformWithState's families (tws_state.Family): a map state's key (its grouping key,
#: then the map's key: a prefix scan on the first), a TTL index ordered by an expiry and a
#: double (a range scan: each ordering field a marker byte and its value big-endian, a
#: negative double's bits flipped), and a list state's values.
_GROUPING = Struct((Field("key", Atomic("string")),))
_MAP_KEY = Struct((Field("key", _GROUPING), Field("userKey", Struct((
    Field("b", Atomic("long")),)))))
_TTL_KEY = Struct((Field("expirationMs", Atomic("long")), Field("d", Atomic("double")),
                   Field("elementKey", _MAP_KEY)))
_LIST_VALUE = Struct((Field("v", Atomic("long")), Field("s", Atomic("string"))))
_MAP_FAMILY = Family("buckets", _MAP_KEY, Struct(()), "prefix", prefix=1)
_TTL_FAMILY = Family("$ttl_firsts", _TTL_KEY, Struct(()), "range", ordering=(0, 1))
_LIST_FAMILY = Family("items", Struct(_GROUPING.fields), _LIST_VALUE, "none", multiple=True)
#: A session window's RocksDB key (prefix_keys): the grouping key, then the session start.
_SESSION = PrefixKeys(Struct((Field("key", Atomic("string")),
                              Field("sessionStartTime", Atomic("timestamp")))), 1)


def _versioned(values: tuple[object, ...], schema: Struct) -> bytes:
    return b"\x00" + encode_row(values, schema)


def _tws_prefix_key() -> bytes:
    head = _versioned((("k1",),), Struct(_MAP_KEY.fields[:1]))
    return (family_prefix(3) + struct.pack("<i", len(head)) + head
            + _versioned(((7,),), Struct(_MAP_KEY.fields[1:])))


def _tws_range_key() -> bytes:
    flipped = struct.unpack(">Q", struct.pack(">d", -2.5))[0] ^ ((1 << 64) - 1)
    ordering = Struct((Field("o0", Atomic("binary")), Field("o1", Atomic("binary"))))
    head = _versioned((b"\x01" + struct.pack(">q", 1_700_000_000_000),
                       b"\x00" + struct.pack(">Q", flipped)), ordering)
    return (family_prefix(5) + struct.pack("<i", len(head)) + head
            + _versioned(((("k2",), (4,)),), Struct(_TTL_KEY.fields[2:])))


def _list_value() -> bytes:
    """Three elements, each its size and row, the first two followed by a ``,``."""
    elements = [_versioned((n, "x" * n), _LIST_VALUE) for n in (0, 3, 9)]
    return b",".join(struct.pack("<i", len(e)) + e for e in elements)


def _session_key() -> bytes:
    return _SESSION.encode(["k3", 1_699_999_800_000_000], "fuzz")


@dataclass(frozen=True)
class Decoder:
    name: str
    sample: Callable[[], bytes]
    decode: Callable[[bytes], object]
    #: Whether the sample's lines after the first are JSON (mutated as JSON too).
    json_lines: bool = False

    def __str__(self) -> str:
        return self.name


DECODERS = [
    Decoder("offsets", _offsets, lambda d: parse_offsets(d, "offsets/3"), json_lines=True),
    Decoder("commit-v1", lambda: b'v1\n{"nextBatchWatermarkMs":5000}',
            lambda d: parse_commit(d, "commits/3"), json_lines=True),
    Decoder("commit-v2", _commit_v2, lambda d: parse_commit(d, "commits/3"), json_lines=True),
    Decoder("file-log", _file_log, lambda d: parse_file_log(d, "sources/0/3"), json_lines=True),
    Decoder("snapshot-zip", _zip, lambda d: read_zip_metadata(d, f"{STORE}/12.zip")),
    Decoder("zip-file-list", _zip_text,
            lambda d: read_zip_metadata(_zipped(d), f"{STORE}/12.zip"), json_lines=True),
    Decoder("lz4-stream", _stream, lambda d: check_stream(iter([d]), f"{STORE}/12.delta")),
    Decoder("lz4-stream-chunks", _stream,
            lambda d: check_stream(_chunks(d), f"{STORE}/12.changelog")),  # type: ignore[arg-type]
    Decoder("lineage", _lineage, lambda d: lineage(d, f"{STORE}/12_u.changelog")),
    Decoder("unsafe-row-key", _key_row, lambda d: decode_row(d, _KEY, f"{STORE}/3.delta")),
    Decoder("unsafe-row-value", _value_row, _decode_value),
    Decoder("unsafe-row-flat", _flat_row, row_decoder(_FLAT, f"{STORE}/3.delta (a value)")),
    Decoder("state-schema", _schema_file,
            lambda d: read_state_schema(d, f"{STORE}/_metadata/schema")),
    Decoder("delta-records", _delta, _decode_delta),
    Decoder("changelog-records", _changelog_v3, _decode_changelog),
    Decoder("lz4-checksummed", _delta, _decode_checksummed),
    Decoder("changelog-typed", _changelog_typed, _decode_typed_changelog),
    Decoder("changelog-typed-records", _changelog_typed_records, _decode_typed_records),
    Decoder("state-schema-v3", _schema_v3,
            lambda d: read_state_schema_v3(d, "state/0/_stateSchema/default/0_u")),
    Decoder("tws-prefix-key", _tws_prefix_key, _MAP_FAMILY.key_decoder(f"{STORE} (buckets)")),
    Decoder("tws-range-key", _tws_range_key, _TTL_FAMILY.key_decoder(f"{STORE} ($ttl)")),
    Decoder("tws-list-value", _list_value, _LIST_FAMILY.values_decoder(f"{STORE} (items)")),
    Decoder("session-prefix-key", _session_key, _SESSION.decoder(f"{STORE}/3.zip")),
]


def decodes_or_refuses(decoder: Decoder, data: bytes) -> object:
    """A value, or SparkCheckpointError with one bounded line; anything else fails the
    test with its traceback."""
    return decoded_or_refused(decoder.decode, data, SparkCheckpointError)


@pytest.mark.parametrize("decoder", DECODERS, ids=str)
def test_the_sample_decodes(decoder: Decoder) -> None:
    value = decodes_or_refuses(decoder, decoder.sample())
    assert value is not None and not isinstance(value, Exception)


@pytest.mark.parametrize("decoder", DECODERS, ids=str)
@FUZZ
@given(data=st.one_of(st.binary(max_size=2048), st.lists(JSONISH, max_size=300).map(b"".join),
                      st.binary(max_size=200).map(lambda b: b"v1\n" + b)))
def test_arbitrary_bytes(decoder: Decoder, data: bytes) -> None:
    decodes_or_refuses(decoder, data)


@st.composite
def line_mutations(draw: st.DrawFn, sample: bytes) -> bytes:
    """One JSON line of a versioned log file mutated as JSON; the version line kept."""
    first, *lines = sample.split(b"\n")
    at = draw(st.sampled_from([i for i, line in enumerate(lines) if line.startswith(b"{")]))
    lines[at] = draw(json_mutations(lines[at]))
    return b"\n".join([first, *lines])


@pytest.mark.parametrize("decoder", DECODERS, ids=str)
@FUZZ
@given(data=st.data())
def test_mutated_files(decoder: Decoder, data: st.DataObject) -> None:
    sample = decoder.sample()
    mutations = byte_mutations(sample)
    if decoder.json_lines:
        mutations = st.one_of(mutations, line_mutations(sample))
    decodes_or_refuses(decoder, data.draw(mutations))


# -- names ---------------------------------------------------------------------------------
#: Where Spark writes numbers in a name; filled with numbers, near-numbers and other text.
_TEMPLATES = ["offsets/{}", "commits/{}", "sources/{}/{}", "sources/{}/{}.compact",
              "state/{}/{}/{}.delta", "state/{}/{}/{}.snapshot", "state/{}/{}/{}.changelog",
              "state/{}/{}/{}.zip", "state/{}/{}/{}_{}.zip", "state/{}/{}/default/{}.changelog",
              "state/{}/_metadata/v2/{}", "state/{}/_stateSchema/default/{}_{}",
              "state/{}/{}/SSTs/{}-{}.sst", "state/{}/{}/.{}.delta.crc", "state/{}/{}/{}.delta.crc"]
_NUMBERS = st.one_of(
    st.sampled_from(["0", "1", "12", "007", "\u00b2", "\u0661\u0662", "\u0663", "-1", "",
                     "1e3", " 1", "1 ", "+1", "0x1f", "9" * 40, "..", "a/b"]),
    st.text(max_size=4),
)
_PARTS = st.one_of(
    st.sampled_from(["state", "offsets", "commits", "sources", "_metadata", "metadata", "v2",
                     "SSTs", "logs", "0", "12", "1.zip", "1_ab.zip", "1.changelog", "..", ".",
                     "", "default", "1.delta.tmp", ".1.delta.abc.tmp"]),
    st.text(max_size=12),
)


@st.composite
def _names(draw: st.DrawFn) -> str:
    template = draw(st.sampled_from(_TEMPLATES))
    return template.format(*(draw(_NUMBERS) for _ in range(template.count("{}"))))


@FUZZ
@given(key=st.one_of(_names(), st.lists(_PARTS, min_size=1, max_size=6).map("/".join),
                     st.text()))
def test_any_name_gets_a_kind(key: str) -> None:
    """A listing's names come from whoever wrote the location: each gets a kind (UNKNOWN
    for what Spark does not write), never an exception; a number in a name is ASCII."""
    name = parse(key)
    assert isinstance(name.kind, Kind)
    assert name.key == key
    partition = name.store.partition if name.store else None
    for number in (name.batch, name.version, name.source, partition):
        # as written in the key, in ASCII digits (``١٢`` read as 12 would alias batch 12)
        assert number is None or (number >= 0 and str(number) in key), (number, key)


# -- whole locations -----------------------------------------------------------------------
def _location(root: Path) -> dict[str, bytes]:
    """A small location of three batches: logs, a file source, operator metadata, a
    RocksDB store with changelogs and a snapshot zip. Returns its files' bytes by key."""
    logs(root, range(3))
    write(root, "state/0/_metadata/metadata", "v1\n" + json.dumps({
        "operatorInfo": {"operatorId": 0, "operatorName": "stateStoreSave"},
        "stateStoreInfo": [{"storeName": "default", "numColsPrefixKey": 0,
                            "numPartitions": 1}]}))
    rocksdb_changelog_store(root, STORE, range(1, 4), {2})
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


_TEMPLATE: dict[str, bytes] = {}


def _template() -> dict[str, bytes]:
    if not _TEMPLATE:
        with tempfile.TemporaryDirectory() as tmp:
            _TEMPLATE.update(_location(Path(tmp)))
    return _TEMPLATE


@FUZZ
@given(data=st.data())
def test_a_location_with_one_file_mutated_is_read_or_refused(data: st.DataObject) -> None:
    files = _template()
    key = data.draw(st.sampled_from(sorted(files)))
    sample = files[key]
    mutations = byte_mutations(sample) if sample else st.binary(max_size=64)
    if sample.startswith(b"v") and b"\n{" in sample:
        mutations = st.one_of(mutations, line_mutations(sample))
    mutated = data.draw(mutations)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "loc"
        for k, v in files.items():
            write(root, k, mutated if k == key else v)
        before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
        try:
            location = open_spark_checkpoint(str(root))
            location.listing()
            location.verify()
            location.du()
            location.history()
            location.absolute_paths()
            location.gc(dry_run=True, grace_seconds=0)
            # the deep load (RocksDB opened on the zip's files, every record read): each
            # problem one bounded line
            for problem in location.verify(deep=True).problems:
                assert len(problem.problem) <= MAX_MESSAGE and "\n" not in problem.problem
        except SparkCheckpointError as e:
            message = str(e)
            assert message and len(message) <= MAX_MESSAGE and "\n" not in message, message
        # Reading never writes.
        assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before
        shutil.rmtree(root)


# -- bounded memory ------------------------------------------------------------------------
MB = 1 << 20


def _large_inputs(decoder: Decoder) -> list[tuple[str, bytes]]:
    inputs = [("garbage", bytes(range(256)) * (MB // 256)), ("digits", b"v1\n" + b"1" * MB),
              ("open-brackets", b"v1\n" + b"[" * MB)]
    if decoder.json_lines:
        sample = decoder.sample()
        first, *lines = sample.split(b"\n")
        filler = json.dumps({"path": "file:///x", "batchId": 1, "pad": "x" * 64}).encode()
        inputs.append(("many-lines", b"\n".join([first, *lines, *[filler] * (MB // 100)])))
        inputs.append(("long-string", first + b'\n{"x": "' + b"x" * MB + b'"}'))
    if decoder.name.startswith("lz4"):
        # Block headers that claim far more than they hold, and than lz4-java writes.
        for claimed in (1 << 31) - 1, 1 << 28:
            header = b"LZ4Block" + struct.pack("<Biii", 0x2F, 16, claimed, 0)
            inputs.append((f"claims-{claimed}", header + b"\x00" * 16 + b"x" * MB))
        inputs.append(("many-blocks", lz4_stream(b"k" * MB, block=1024)))
    if decoder.name.startswith("unsafe-row"):
        # Every slot pointing at the whole row; arrays claiming more elements than fit.
        pointer = struct.pack("<q", 8 << 32 | (MB - 8))
        inputs.append(("all-pointers", b"\x00" * 8 + pointer * (MB // 8 - 1)))
        inputs.append(("huge-counts", struct.pack("<q", 2**62) * (MB // 8)))
    if decoder.name == "tws-list-value":
        # A million bytes of the smallest elements (a size and a version byte alone).
        inputs.append(("many-elements", (struct.pack("<i", 1) + b"\x00") * (MB // 5)))
    if decoder.name == "delta-records":
        # A record claiming a 2 GB key, and a million tiny records.
        inputs.append(("claims-2gb", lz4_stream(struct.pack(">i", 2**31 - 1) + b"k" * MB)))
        pair = (_key_row(), _value_row())
        inputs.append(("many-records", lz4_stream(
            records([pair] * (MB // (len(pair[0]) + len(pair[1])))), block=1 << 16)))
    return inputs


@pytest.mark.parametrize("decoder", DECODERS, ids=str)
def test_a_1mb_input_decodes_in_bounded_memory(decoder: Decoder) -> None:
    over = peaks_over(lambda data: decodes_or_refuses(decoder, data), _large_inputs(decoder),
                      MAX_PEAK)
    assert not over, f"peak MB over {MAX_PEAK >> 20}: {over}"


def test_the_location_template_is_whole() -> None:
    """The whole-location fuzz starts from a location verify passes."""
    with tempfile.TemporaryDirectory() as tmp:
        _location(Path(tmp))
        report = open_spark_checkpoint(tmp).verify()
        assert report.ok, report
