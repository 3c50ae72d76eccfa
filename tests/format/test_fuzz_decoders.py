"""Every decoder of an on-disk document, fuzzed: `_metadata`, the embedded HA pointer, the
ZooKeeper znode, a history record, the owner record, the lease, the job result, and an
operator request and its answer.

Two strategies each: arbitrary bytes, and mutations of a valid encoded document (bytes
flipped, inserted, deleted, truncated; JSON values replaced by extreme ones — huge
numbers, deep nesting, long strings, wrong types — and the document re-signed, so the
mutation reaches the model instead of stopping at the checksum). A decode either
succeeds or raises its format's StateholdError with one bounded line; the lease, which
vouches for nothing when it is not sane, is None instead. Nothing else escapes. A 1 MB
input is decoded within a bounded peak of memory (tracemalloc).

tests/format/test_bad_input.py has the crafted cases (each bound, each constant); this
module looks for what nobody thought of."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statehold.errors import StateholdError
from statehold.format import layout, metadata, signed
from statehold.format import requests as operator_requests
from statehold.format.layout import Scope
from statehold.format.metadata import (
    CheckpointMetadata,
    EventTime,
    InlineFile,
    KeyGroupRange,
    KeyGroupState,
    MetadataError,
    OperatorSchemas,
    OperatorState,
    StateFile,
    VariableSchema,
)
from statehold.ha import CheckpointPointer, HAStoreError
from statehold.ha import zookeeper as zk
from statehold.ha.embedded import PointerDocument, PointerModel, decode_document, encode_document
from statehold.job import history
from statehold.job.directory import JobDirectoryError, read_owner
from statehold.job.lease import LeaseRecord, lease_key, read_lease
from statehold.job.owner import OWNER_KEY, OwnerRecord
from statehold.job.result import (
    RESULT_KEY,
    JobOutcome,
    JobResult,
    JobResultError,
    RetentionPolicy,
    read_result,
)
from statehold.storage import Storage
from statehold.storage.base import NotFoundError
from tests.support.fuzz import (
    FUZZ,
    JSONISH,
    MAX_PEAK,
    byte_mutations,
    decoded_or_refused,
    dumps,
    json_mutations,
    nested,
    peaks_over,
    sign,
)

KEY = layout.checkpoint_metadata_key(7)


class OneFile:
    """Just enough of a Storage for a reader of one file: its bytes under one key."""

    uri = "file:///fuzz/job/"

    def __init__(self, key: str, data: bytes) -> None:
        self.key, self.data = key, data

    def read(self, key: str) -> bytes:
        if key != self.key:
            raise NotFoundError(key)
        return self.data


def _storage(key: str, data: bytes) -> Storage:
    return cast(Storage, OneFile(key, data))


# -- the documents, encoded by the code that writes them -------------------------------------
def _metadata() -> bytes:
    shared = StateFile(
        path=layout.relativize(KEY, layout.shared_key(2, 5, "000011.sst")),
        scope=Scope.SHARED, size=1234, checksum="sha256:" + "ab" * 32, name="000011.sst",
    )
    meta = CheckpointMetadata(
        job_id="orders", checkpoint_id=7, epoch=2, created_at=1.7e9, completed_at=1.7e9 + 1,
        source_position={"batch_id": 7, "offsets": {"t": [1, 2]}}, max_parallelism=8,
        operators=[OperatorState(operator="agg", ranges=[
            KeyGroupState(key_groups=KeyGroupRange(start=0, end=7), files=[shared],
                          inline=[InlineFile.of("MANIFEST", b"m")], info={"rows": 3}),
        ])],
        state_schemas={"agg": OperatorSchemas(
            key='{"type":"struct","fields":[]}',
            variables={"total": VariableSchema(kind="value", value='"long"')},
        )},
        event_time=EventTime(time_mode="eventtime", watermark_ms=5, next_timer_ms=9),
    )
    return metadata.encode(meta, KEY)


def _pointer() -> bytes:
    return encode_document(PointerDocument(
        seq=3, epoch=2, nonce="a" * 32, parent="b" * 32, written_at=1.7e9,
        retained=[PointerModel(checkpoint_id=7, metadata=KEY, epoch=2,
                               checksum="sha256:" + "cd" * 32)],
    ))


def _znode() -> bytes:
    return zk.encode(2, [CheckpointPointer(7, KEY, 2, "sha256:" + "cd" * 32)])


def _history() -> bytes:
    return signed.encode(history.HistoryRecord(
        job_id="orders", checkpoint_id=7, epoch=2, outcome="aborted", started_at=1.7e9,
        ended_at=1.7e9 + 2, duration=2.0, bytes_uploaded=10, files_uploaded=1, rows=5,
        reason="a task failed",
    ))


def _owner() -> bytes:
    return signed.encode(OwnerRecord(job_id="orders", ha="embedded", created_at=1.7e9))


def _lease() -> bytes:  # as `Lease.renew` writes it
    return json.dumps({"epoch": 2, "renewed_at": 1.7e9, "ttl": 120.0,
                       "status": {"cleaner": {"pending_keys": 3}}}).encode()


def _result() -> bytes:  # as `write_result` writes it
    return JobResult(job_id="orders", epoch=2, outcome=JobOutcome.FINISHED,
                     policy=RetentionPolicy.KEEP_LATEST, state="dirty",
                     at=1.7e9).model_dump_json(indent=1).encode()


REQUEST_ID = "r20261126230000-0123456789ab"


def _request() -> bytes:
    return operator_requests.encode_request(operator_requests.OperatorRequest(
        id=REQUEST_ID, job_id="orders", epoch=2, action=operator_requests.Action.STOP,
        savepoint="final", requested_at=1.7e9, requested_by="ops@host",
    ))


def _answer() -> bytes:
    return operator_requests.encode_answer(operator_requests.RequestAnswer(
        id=REQUEST_ID, outcome=operator_requests.Outcome.DONE, epoch=2,
        message="stopped after checkpoint 7", savepoint_key="savepoints/final",
        checkpoint_id=7, at=1.7e9,
    ))


@dataclass(frozen=True)
class Decoder:
    name: str
    sample: Callable[[], bytes]
    decode: Callable[[bytes], object]
    #: What a refusal raises; None: a document that is not sane is read as None.
    error: type[StateholdError] | None

    def __str__(self) -> str:
        return self.name


DECODERS = [
    Decoder("metadata", _metadata, lambda d: metadata.decode(d, KEY), MetadataError),
    Decoder("ha-pointer", _pointer,
            lambda d: decode_document(d, "_ha/00000000000000000003.json", 3), HAStoreError),
    Decoder("zookeeper", _znode, lambda d: zk.decode(d, 4, "/statehold/orders"), HAStoreError),
    Decoder("history", _history,
            lambda d: history.decode(d, f"{history.HISTORY_DIR}/c7.json"), history.HistoryError),
    Decoder("owner", _owner, lambda d: read_owner(_storage(OWNER_KEY, d)), JobDirectoryError),
    Decoder("lease", _lease, lambda d: read_lease(_storage(lease_key(2), d), 2), None),
    Decoder("job-result", _result, lambda d: read_result(_storage(RESULT_KEY, d)),
            JobResultError),
    Decoder("request", _request,
            lambda d: operator_requests.decode_request(d, "_job/requests/r.json"),
            operator_requests.RequestError),
    Decoder("request-answer", _answer,
            lambda d: operator_requests.decode_answer(d, "_job/requests/r.answer.json"),
            operator_requests.RequestError),
]


def decodes_or_refuses(decoder: Decoder, data: bytes) -> object:
    """Decode `data`: a value, or the format's own error with one bounded line; any other
    exception fails the test with its traceback."""
    if decoder.error is None:
        value = decoder.decode(data)
        assert value is None or isinstance(value, LeaseRecord)
        return value
    return decoded_or_refused(decoder.decode, data, decoder.error)


@pytest.mark.parametrize("decoder", DECODERS, ids=str)
def test_the_sample_decodes(decoder: Decoder) -> None:
    value = decodes_or_refuses(decoder, decoder.sample())
    assert value is not None and not isinstance(value, Exception)


# -- arbitrary bytes ---------------------------------------------------------------------------


@pytest.mark.parametrize("decoder", DECODERS, ids=str)
@FUZZ
@given(data=st.one_of(st.binary(max_size=2048),
                      st.lists(JSONISH, max_size=300).map(b"".join)))
def test_arbitrary_bytes(decoder: Decoder, data: bytes) -> None:
    decodes_or_refuses(decoder, data)


# -- mutations of a valid document -------------------------------------------------------------
@pytest.mark.parametrize("decoder", DECODERS, ids=str)
@FUZZ
@given(data=st.data())
def test_mutated_documents(decoder: Decoder, data: st.DataObject) -> None:
    sample = decoder.sample()
    mutated = data.draw(st.one_of(json_mutations(sample), byte_mutations(sample)))
    decodes_or_refuses(decoder, mutated)


# -- bounded memory ----------------------------------------------------------------------------
MB = 1 << 20


def _fill(sample: bytes, where: str, value_of: Callable[[int], Any]) -> bytes:
    """`sample` with the value at top-level `where` replaced by one that makes the
    document about 1 MB, re-signed."""
    doc = json.loads(sample)
    doc[where] = value_of(0)
    unit = len(json.dumps(value_of(2))) - len(json.dumps(value_of(1)))
    count = (MB - len(dumps(doc, True)) - 4096) // unit
    doc[where] = value_of(count)
    if "checksum" in doc:
        sign(doc)
    data = dumps(doc, True)
    assert MB // 2 < len(data) <= MB, len(data)
    return data


_LARGE: dict[str, Callable[[int], Any]] = {
    "string": lambda n: "x" * n,
    "ints": lambda n: [0] * n,
    "objects": lambda n: [{}] * n,
    "pointers": lambda n: [{"checkpoint_id": 1, "metadata": "chk-1/_metadata", "epoch": 1}] * n,
    "files": lambda n: [{"path": "../shared/a", "scope": "shared", "size": 1,
                         "checksum": "sha256:" + "0" * 64}] * n,
}


def _members(n: int) -> dict[str, Any]:
    return {f"k{i:07d}": 0 for i in range(n)}


def _deep_members(n: int) -> dict[str, Any]:
    """Bad members one level down (an operator's state variables, say)."""
    return {"op": {"variables": _members(n)}}


def _large_inputs(decoder: Decoder) -> list[tuple[str, bytes]]:
    sample = decoder.sample()
    doc = json.loads(sample)
    lists = [k for k, v in doc.items() if isinstance(v, list)]
    inputs = [(f"{where}={shape}", _fill(sample, where, value_of))
              for where in lists for shape, value_of in _LARGE.items()]
    # A member no model knows: parsed, then refused as one error.
    inputs += [(f"extra={shape}", _fill(sample, "extra", _LARGE[shape]))
               for shape in ("string", "objects")]
    for where in [k for k, v in doc.items() if isinstance(v, dict)]:
        inputs.append((f"{where}=members", _fill(sample, where, _members)))
        inputs.append((f"{where}=deep-members", _fill(sample, where, _deep_members)))
    inputs.append(("open-brackets", b"[" * MB))
    inputs.append(("digits", b"1" * MB))
    inputs.append(("deep-ish", _fill(sample, "extra", lambda n: [nested(60, 0)] * n)))
    inputs.append(("garbage", bytes(range(256)) * (MB // 256)))
    return inputs


@pytest.mark.parametrize("decoder", DECODERS, ids=str)
def test_a_1mb_input_decodes_in_bounded_memory(decoder: Decoder) -> None:
    over = peaks_over(lambda data: decodes_or_refuses(decoder, data), _large_inputs(decoder),
                      MAX_PEAK)
    assert not over, f"peak MB over {MAX_PEAK >> 20}: {over}"
