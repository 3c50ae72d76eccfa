"""Crafted and damaged documents fail fast with one clear line, never a traceback, a hang
or a huge allocation: checkpoint `_metadata`, embedded HA pointers, the ZooKeeper znode and
the job result raise their own StateholdError; a lease that is not sane is no lease.

Crafted documents carry a valid checksum (`signed.digest`), so they reach the bounds
instead of stopping at the checksum."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statehold.errors import StateholdError
from statehold.format import layout, metadata, signed
from statehold.format.layout import Scope
from statehold.format.metadata import (
    CheckpointMetadata,
    InlineFile,
    KeyGroupRange,
    KeyGroupState,
    Lineage,
    MetadataError,
    OperatorState,
    RestoreMode,
    StateFile,
)
from statehold.format.signed import (
    MAX_DEPTH,
    MAX_ID,
    MAX_INLINE_DATA,
    MAX_ITEMS,
    MAX_LEASE_TTL,
    MAX_MAX_PARALLELISM,
    MAX_METADATA_BYTES,
    MAX_NAME,
    MAX_SIZE,
    MAX_SMALL_DOCUMENT_BYTES,
    MAX_TIMESTAMP,
)
from statehold.ha import CheckpointPointer, HAStoreError
from statehold.ha import zookeeper as zk
from statehold.ha.embedded import PointerDocument, PointerModel, decode_document, encode_document
from statehold.job.lease import LeaseRecord, lease_key, read_lease
from statehold.job.result import (
    RESULT_KEY,
    JobOutcome,
    JobResultError,
    RetentionPolicy,
    read_result,
    write_result,
)
from statehold.storage import Storage, open_storage

#: A hang fails the test (a bound on hanging, not a timed assertion: the work is bounded by
#: the documents' size, depth and item limits, which the tests below reach).
pytestmark = pytest.mark.timeout(300)
DEEP = b"[" * 100_000 + b"]" * 100_000
NAN = float("nan")
#: Stands for a number json.dumps cannot write; swapped for `raw` in the bytes.
SENTINEL = 987654321987


# -- the documents ----------------------------------------------------------------------------
KEY = layout.checkpoint_metadata_key(7)
META_WHERE = "s3://b/job/chk-7/_metadata"
HA_WHERE = "s3://b/job/_ha/00000000000000000003.json"
ZK_WHERE = "zookeeper:/statehold/job-1"


def _metadata_sample() -> dict[str, Any]:
    f = StateFile(
        path=layout.relativize(KEY, layout.shared_key(2, 5, "000011.sst")),
        scope=Scope.SHARED,
        size=1234,
        checksum="sha256:" + "ab" * 32,
        name="000011.sst",
    )
    meta = CheckpointMetadata(
        job_id="orders",
        checkpoint_id=7,
        epoch=2,
        created_at=1700000000.25,
        completed_at=1700000001.5,
        source_position={"batch_id": 7},
        max_parallelism=128,
        operators=[
            OperatorState(
                operator="dedup",
                ranges=[
                    KeyGroupState(
                        key_groups=KeyGroupRange(start=0, end=127),
                        files=[f],
                        inline=[InlineFile.of("MANIFEST-000012", b"manifest")],
                    )
                ],
            )
        ],
        lineage=Lineage(
            mode=RestoreMode.NO_CLAIM,
            source="s3://other/job/chk-3/_metadata",
            source_job_id="old",
            source_checkpoint_id=3,
        ),
    )
    doc: dict[str, Any] = json.loads(metadata.encode(meta, KEY))
    return doc


def _pointer_sample() -> dict[str, Any]:
    doc = PointerDocument(
        seq=3,
        epoch=2,
        nonce="a" * 32,
        parent="b" * 32,
        written_at=1700000000.5,
        retained=[PointerModel(checkpoint_id=7, metadata=KEY, epoch=2)],
    )
    raw: dict[str, Any] = json.loads(encode_document(doc))
    return raw


def _zk_sample() -> dict[str, Any]:
    raw: dict[str, Any] = json.loads(zk.encode(2, [CheckpointPointer(7, KEY, 2)]))
    return raw


def _result_sample() -> dict[str, Any]:
    return {
        "format": "statehold.job-result",
        "version": 1,
        "job_id": "orders",
        "epoch": 2,
        "outcome": "finished",
        "policy": "keep-latest",
        "state": "dirty",
        "at": 1700000000.5,
    }


def _lease_sample() -> dict[str, Any]:
    return {"epoch": 2, "renewed_at": 1700000000.5, "ttl": 120.0, "status": {"backlog": 3}}


def signed_bytes(doc: dict[str, Any]) -> bytes:
    doc = dict(doc)
    doc["checksum"] = signed.digest(doc)
    return json.dumps(doc).encode()


def plain_bytes(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode()


def _result_storage(tmp_path: Path) -> Storage:
    return open_storage(str(tmp_path / "job"))


def _read_result(data: bytes, tmp_path: Path) -> object:
    storage = _result_storage(tmp_path)
    storage.write(RESULT_KEY, data)
    return read_result(storage)


@dataclass(frozen=True)
class Kind:
    name: str
    sample: Callable[[], dict[str, Any]]
    to_bytes: Callable[[dict[str, Any]], bytes]
    read: Callable[[bytes, Path], object]
    error: type[StateholdError]
    where: str
    max_bytes: int

    def __str__(self) -> str:
        return self.name


KINDS = [
    Kind(
        "metadata",
        _metadata_sample,
        signed_bytes,
        lambda data, _: metadata.decode(data, KEY, META_WHERE),
        MetadataError,
        META_WHERE,
        MAX_METADATA_BYTES,
    ),
    Kind(
        "ha-pointer",
        _pointer_sample,
        signed_bytes,
        lambda data, _: decode_document(data, HA_WHERE),
        HAStoreError,
        HA_WHERE,
        MAX_SMALL_DOCUMENT_BYTES,
    ),
    Kind(
        "zookeeper",
        _zk_sample,
        plain_bytes,
        lambda data, _: zk.decode(data, 0, ZK_WHERE),
        HAStoreError,
        ZK_WHERE,
        MAX_SMALL_DOCUMENT_BYTES,
    ),
    Kind(
        "job-result",
        _result_sample,
        plain_bytes,
        _read_result,
        JobResultError,
        RESULT_KEY,
        MAX_SMALL_DOCUMENT_BYTES,
    ),
]
BY_NAME = {k.name: k for k in KINDS}


def edited(doc: dict[str, Any], path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    """A deep copy of `doc` with the value at `path` replaced."""
    doc = json.loads(json.dumps(doc))
    node: Any = doc
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    return doc


def refused(kind: Kind, data: bytes, tmp_path: Path) -> str:
    """The one-line message `kind`'s reader refuses `data` with."""
    with pytest.raises(kind.error) as err:
        kind.read(data, tmp_path)
    message = str(err.value)
    assert "\n" not in message and "\r" not in message
    assert kind.where in message
    assert len(message) < 1500
    return message


def accepted(kind: Kind, data: bytes, tmp_path: Path) -> None:
    assert kind.read(data, tmp_path) is not None


def with_raw(kind: Kind, path: tuple[str | int, ...], raw: bytes) -> bytes:
    """`kind`'s sample, signed, with the number at `path` written as `raw` (text JSON
    readers accept but json.dumps never writes)."""
    data = kind.to_bytes(edited(kind.sample(), path, SENTINEL))
    assert data.count(str(SENTINEL).encode()) == 1
    return data.replace(str(SENTINEL).encode(), raw)


# -- every kind -------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS, ids=str)
def test_the_sample_is_accepted(kind: Kind, tmp_path: Path) -> None:
    accepted(kind, kind.to_bytes(kind.sample()), tmp_path)


@pytest.mark.parametrize("kind", KINDS, ids=str)
def test_deep_nesting_is_refused_fast(kind: Kind, tmp_path: Path) -> None:
    assert "nested" in refused(kind, DEEP, tmp_path)
    assert "nested" in refused(kind, b"[" * 100_000, tmp_path)  # unclosed, as crafted
    assert "nested" in refused(kind, b'{"a":' * 100_000 + b"1" + b"}" * 100_000, tmp_path)


@pytest.mark.parametrize("kind", KINDS, ids=str)
def test_nesting_inside_a_valid_document_is_refused(kind: Kind, tmp_path: Path) -> None:
    deep: Any = 0
    for _ in range(MAX_DEPTH):
        deep = [deep]
    assert "nested" in refused(kind, kind.to_bytes(dict(kind.sample(), extra=deep)), tmp_path)


@pytest.mark.parametrize("kind", [BY_NAME["metadata"], BY_NAME["job-result"]], ids=str)
def test_brackets_in_strings_are_not_nesting(kind: Kind, tmp_path: Path) -> None:
    name = '[{"\\' * 1000  # with quotes and backslashes, escaped in JSON
    accepted(kind, kind.to_bytes(edited(kind.sample(), ("job_id",), name)), tmp_path)


def test_free_form_nesting_below_the_limit_is_accepted(tmp_path: Path) -> None:
    kind = BY_NAME["metadata"]
    deep: Any = {"offsets": "[[[[{{{{"}
    for _ in range(MAX_DEPTH - 3):  # with the document and source_position: MAX_DEPTH
        deep = [deep]
    position = ("source_position",)
    accepted(kind, kind.to_bytes(edited(kind.sample(), position, {"d": deep})), tmp_path)
    assert "nested" in refused(
        kind, kind.to_bytes(edited(kind.sample(), position, {"d": [deep]})), tmp_path
    )


@pytest.mark.parametrize("kind", KINDS, ids=str)
def test_oversize_is_refused_before_parsing(kind: Kind, tmp_path: Path) -> None:
    data = kind.to_bytes(kind.sample())
    at_limit = data + b" " * (kind.max_bytes - len(data))  # whitespace: still the same JSON
    accepted(kind, at_limit, tmp_path)
    assert "bytes" in refused(kind, at_limit + b" ", tmp_path)


@pytest.mark.parametrize("kind", KINDS, ids=str)
@pytest.mark.parametrize("constant", [b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e999"])
def test_nan_and_infinity_are_refused(kind: Kind, constant: bytes, tmp_path: Path) -> None:
    # In a field no model checks, so only the JSON reader can refuse it.
    doc = dict(kind.sample(), extra=SENTINEL)
    if kind.name == "metadata":
        doc = edited(kind.sample(), ("source_position", "x"), SENTINEL)
    data = kind.to_bytes(doc).replace(str(SENTINEL).encode(), constant)
    message = refused(kind, data, tmp_path)
    assert constant.lstrip(b"-").decode() in message


@pytest.mark.parametrize("kind", KINDS, ids=str)
def test_thousands_of_digits_are_refused(kind: Kind, tmp_path: Path) -> None:
    message = refused(kind, with_raw(kind, ("epoch",), b"1" * 5000), tmp_path)
    assert "digits" in message and "set_int_max_str_digits" not in message


@pytest.mark.parametrize("kind", [BY_NAME["metadata"], BY_NAME["ha-pointer"]], ids=str)
def test_lone_surrogate_is_refused(kind: Kind, tmp_path: Path) -> None:
    data = kind.to_bytes(kind.sample()).replace(b'"format"', b'"\\ud800": 1, "format"')
    assert "surrogate" in refused(kind, data, tmp_path)


# (kind, path, a value at the bound that is accepted, values beyond it that are refused)
BOUNDS: list[tuple[str, tuple[str | int, ...], Any, list[Any]]] = [
    ("metadata", ("epoch",), MAX_ID, [MAX_ID + 1, -1, True, 2.0, "2", None, 10**30]),
    ("metadata", ("checkpoint_id",), MAX_ID, [MAX_ID + 1, -1, False, 7.0, "7"]),
    ("metadata", ("version",), 1, [True, MAX_ID + 1, 10**30, 1.0]),
    ("metadata", ("max_parallelism",), MAX_MAX_PARALLELISM, [MAX_MAX_PARALLELISM + 1, 0, True]),
    ("metadata", ("created_at",), MAX_TIMESTAMP, [MAX_TIMESTAMP * 1.001, -1, True, 1e300, "1"]),
    ("metadata", ("completed_at",), 0, [-0.5, 2**40, False]),
    ("metadata", ("lineage", "source_checkpoint_id"), MAX_ID, [MAX_ID + 1, True, -1]),
    ("metadata", ("job_id",), "j" * MAX_NAME, ["j" * (MAX_NAME + 1), ""]),
    ("metadata", ("savepoint_name",), None, ["s" * (MAX_NAME + 1)]),
    ("metadata", ("lineage", "source"), "s" * MAX_NAME, ["s" * (MAX_NAME + 1)]),
    ("metadata", ("operators", 0, "operator"), "o" * MAX_NAME, ["o" * (MAX_NAME + 1)]),
    ("metadata", ("operators", 0, "ranges", 0, "files", 0, "size"), MAX_SIZE,
     [MAX_SIZE + 1, -1, True, 1.5]),
    ("metadata", ("operators", 0, "ranges", 0, "files", 0, "name"), "n" * MAX_NAME,
     ["n" * (MAX_NAME + 1)]),
    ("metadata", ("operators", 0, "ranges", 0, "files", 0, "path"), None,
     ["shared/" + "p" * MAX_NAME]),
    ("metadata", ("operators", 0, "ranges", 0, "key_groups", "end"), MAX_MAX_PARALLELISM - 1,
     [MAX_MAX_PARALLELISM, MAX_ID, True, 127.0]),
    ("metadata", ("operators", 0, "ranges", 0, "key_groups", "start"), 0, [-1, True, None]),
    ("metadata", ("operators", 0, "ranges", 0, "inline", 0, "data"),
     "QUFB" * (MAX_INLINE_DATA // 4), ["QUFB" * (MAX_INLINE_DATA // 4 + 1)]),
    ("ha-pointer", ("seq",), MAX_ID, [MAX_ID + 1, 0, True, 3.0]),
    ("ha-pointer", ("epoch",), MAX_ID, [MAX_ID + 1, -1, True]),
    ("ha-pointer", ("written_at",), MAX_TIMESTAMP, [MAX_TIMESTAMP * 2, -1, True, "1"]),
    ("ha-pointer", ("retained", 0, "checkpoint_id"), MAX_ID, [MAX_ID + 1, True, -1]),
    ("ha-pointer", ("retained", 0, "epoch"), MAX_ID, [MAX_ID + 1, True]),
    ("ha-pointer", ("retained", 0, "metadata"), None, ["m/" * (MAX_NAME // 2) + "x"]),
    ("ha-pointer", ("version",), 1, [True, MAX_ID + 1]),
    ("zookeeper", ("epoch",), MAX_ID, [MAX_ID + 1, -1, True, 2.0, "2"]),
    ("zookeeper", ("retained", 0, "checkpoint_id"), MAX_ID, [MAX_ID + 1, True]),
    ("zookeeper", ("retained", 0, "epoch"), MAX_ID, [MAX_ID + 1, False]),
    ("zookeeper", ("retained", 0, "metadata"), None, ["m/" * (MAX_NAME // 2) + "x"]),
    ("zookeeper", ("version",), 1, [True, MAX_ID + 1, 10**30]),
    ("job-result", ("epoch",), MAX_ID, [MAX_ID + 1, -1, True, 2.0, "2"]),
    ("job-result", ("at",), MAX_TIMESTAMP, [MAX_TIMESTAMP + 1, -1, True, "1"]),
    ("job-result", ("job_id",), "j" * MAX_NAME, ["j" * (MAX_NAME + 1)]),
]


@pytest.mark.parametrize(
    "kind_name, path, ok, bad",
    [(k, p, ok, b) for k, p, ok, bads in BOUNDS for b in bads],
    ids=lambda v: str(v)[:30],
)
def test_out_of_range_is_refused(
    kind_name: str, path: tuple[str | int, ...], ok: Any, bad: Any, tmp_path: Path
) -> None:
    kind = BY_NAME[kind_name]
    if ok is not None:
        accepted(kind, kind.to_bytes(edited(kind.sample(), path, ok)), tmp_path)
    message = refused(kind, kind.to_bytes(edited(kind.sample(), path, bad)), tmp_path)
    assert str(path[-1]) in message  # names the field


def test_too_many_list_entries_are_refused(tmp_path: Path) -> None:
    kind = BY_NAME["metadata"]
    entry = {"name": "a", "data": ""}
    doc = edited(kind.sample(), ("operators", 0, "ranges", 0, "inline"), [entry] * (MAX_ITEMS + 1))
    data = kind.to_bytes(doc)
    assert len(data) < MAX_METADATA_BYTES  # the list bound, not the size bound
    assert "inline" in refused(kind, data, tmp_path)


def test_bounds_are_the_documented_ones() -> None:
    assert MAX_ID == 2**53  # every id up to it is exact in a double (JavaScript, jq)
    assert float(MAX_ID - 1) == MAX_ID - 1
    assert MAX_SIZE == 2**50 and MAX_ITEMS == 1_000_000 and MAX_DEPTH == 64
    assert (MAX_METADATA_BYTES, MAX_SMALL_DOCUMENT_BYTES) == (64 << 20, 1 << 20)


def test_key_group_bound_is_the_backends() -> None:
    from statehold.backend.keys import MAX_MAX_PARALLELISM as backend_bound

    assert backend_bound == MAX_MAX_PARALLELISM


# -- the depth scan counts structure, never string content ------------------------------------
_TRICKY = st.text(alphabet='[]{}"\\ab\n', max_size=8)


@given(depth=st.integers(1, MAX_DEPTH + 8), noise=st.lists(_TRICKY, max_size=3), seed=st.integers())
def test_depth_scan_matches_the_real_depth(depth: int, noise: list[str], seed: int) -> None:
    value: Any = noise  # one level
    for level in range(depth - 1):
        if (seed >> (level % 60)) & 1:
            value = {"[k{" + "".join(noise): value, "s": "".join(noise) + "]}"}
        else:
            value = ["\\" + "".join(noise), value]
    data = json.dumps(value).encode()
    if depth > MAX_DEPTH:
        with pytest.raises(ValueError, match="nested"):
            signed.load_json(data, where="doc", error=ValueError)
    else:
        assert signed.load_json(data, where="doc", error=ValueError) == value


# -- the job result ---------------------------------------------------------------------------
def test_a_written_job_result_reads_back(tmp_path: Path) -> None:
    storage = _result_storage(tmp_path)
    written = write_result(
        storage,
        job_id="orders",
        epoch=3,
        outcome=JobOutcome.FINISHED,
        policy=RetentionPolicy.KEEP_LATEST,
        state="clean",
    )
    assert read_result(storage) == written


@pytest.mark.parametrize(
    "data", [b"", b"\xff\xfe", b"[]", b"null", b'"x"', b"{", b'{"format": 1}', b"1" * 5000]
)
def test_any_malformed_job_result_is_a_job_result_error(data: bytes, tmp_path: Path) -> None:
    refused(BY_NAME["job-result"], data, tmp_path)


# -- the lease --------------------------------------------------------------------------------
EPOCH = 2


def lease_of(data: bytes, tmp_path: Path) -> LeaseRecord | None:
    storage = open_storage(str(tmp_path / "job"))
    storage.write(lease_key(EPOCH), data)
    return read_lease(storage, EPOCH)


def test_a_sane_lease_is_read(tmp_path: Path) -> None:
    lease = lease_of(plain_bytes(_lease_sample()), tmp_path)
    assert lease == LeaseRecord(EPOCH, 1700000000.5, 120.0, {"backlog": 3})
    at_limit = plain_bytes(_lease_sample())
    assert lease_of(at_limit + b" " * (MAX_SMALL_DOCUMENT_BYTES - len(at_limit)), tmp_path)
    assert lease_of(plain_bytes(dict(_lease_sample(), ttl=MAX_LEASE_TTL)), tmp_path)
    assert lease_of(plain_bytes(dict(_lease_sample(), renewed_at=1700000000)), tmp_path)
    assert lease_of(plain_bytes(dict(_lease_sample(), status=[1])), tmp_path) == LeaseRecord(
        EPOCH, 1700000000.5, 120.0, {}
    )


def test_no_lease_file_is_no_lease(tmp_path: Path) -> None:
    assert read_lease(open_storage(str(tmp_path / "job")), EPOCH) is None


def _nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def _raw_lease(field: str, raw: bytes) -> bytes:
    return plain_bytes(dict(_lease_sample(), **{field: SENTINEL})).replace(
        str(SENTINEL).encode(), raw
    )


@pytest.mark.parametrize(
    "data",
    [
        DEEP,
        b"[" * 100_000,
        plain_bytes(_lease_sample()) + b" " * MAX_SMALL_DOCUMENT_BYTES,
        plain_bytes(dict(_lease_sample(), status={"deep": _nested(MAX_DEPTH)})),
        _raw_lease("ttl", b"NaN"),
        _raw_lease("ttl", b"Infinity"),
        _raw_lease("ttl", b"1e400"),
        _raw_lease("renewed_at", b"NaN"),
        _raw_lease("renewed_at", b"-Infinity"),
        _raw_lease("epoch", b"1" * 5000),
        plain_bytes(dict(_lease_sample(), ttl=MAX_LEASE_TTL + 1)),
        plain_bytes(dict(_lease_sample(), ttl=1e300)),
        plain_bytes(dict(_lease_sample(), ttl=0)),
        plain_bytes(dict(_lease_sample(), ttl=-120)),
        plain_bytes(dict(_lease_sample(), ttl=True)),
        plain_bytes(dict(_lease_sample(), ttl="120")),
        plain_bytes(dict(_lease_sample(), renewed_at=MAX_TIMESTAMP + 1)),
        plain_bytes(dict(_lease_sample(), renewed_at=-1)),
        plain_bytes(dict(_lease_sample(), renewed_at=True)),
        plain_bytes(dict(_lease_sample(), epoch=True)),
        plain_bytes(dict(_lease_sample(), epoch=2.0)),
        plain_bytes(dict(_lease_sample(), epoch="2")),
        plain_bytes(dict(_lease_sample(), epoch=EPOCH + 1)),  # another attempt's
        plain_bytes(dict(_lease_sample(), epoch=MAX_ID + 1)),
        plain_bytes({"epoch": EPOCH, "ttl": 120.0}),
        b"",
        b"\xff",
        b"[]",
        b"null",
        b"{",
    ],
    ids=lambda d: repr(d[:24]),
)
def test_a_malformed_lease_is_no_lease(data: bytes, tmp_path: Path) -> None:
    assert lease_of(data, tmp_path) is None
