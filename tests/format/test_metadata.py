"""Checkpoint metadata: exact round trip, and refusal (a MetadataError that names the file)
of every document that cannot be trusted: damaged, truncated, too new, foreign, or pointing
outside the job directory."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statehold.format import layout, metadata, signed
from statehold.format.layout import Scope
from statehold.format.metadata import (
    FORMAT_VERSION,
    CheckpointMetadata,
    KeyGroupRange,
    KeyGroupState,
    Lineage,
    MetadataError,
    OperatorState,
    RestoreMode,
    StateFile,
)
from statehold.storage import Storage, UnsafePathError
from tests.support.job_dir_contents import write_metadata

# -- strategies -----------------------------------------------------------------------------
ids = st.integers(min_value=0, max_value=2**53)
times = st.floats(min_value=0, max_value=4e9, allow_nan=False)
checksums = st.binary(min_size=32, max_size=32).map(lambda b: "sha256:" + b.hex())
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
json_objects = st.dictionaries(st.text(max_size=8), json_values, max_size=4)
savepoint_names = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,15}\Z")


@st.composite
def metadata_keys(draw: st.DrawFn) -> str:
    if draw(st.booleans()):
        return layout.savepoint_metadata_key(draw(savepoint_names))
    return layout.checkpoint_metadata_key(draw(ids))


@st.composite
def state_files(draw: st.DrawFn, metadata_key: str) -> StateFile:
    scope = draw(st.sampled_from(list(Scope)))
    epoch, ckpt = draw(ids), draw(ids)
    if draw(st.integers(0, 9)) == 0:  # now and then an external file of a no-claim restore
        path = f"s3://other-bucket/job-0/shared/{layout.data_file_name(epoch, ckpt)}"
        external = True
    else:
        if scope is Scope.TASKOWNED:
            key = f"{layout.TASKOWNED_DIR}/op-{epoch}/{layout.data_file_name(epoch, ckpt)}"
        elif scope is Scope.SHARED:
            key = layout.shared_key(epoch, ckpt, draw(st.text(max_size=10)))
        else:
            key = layout.exclusive_key(epoch, ckpt)
        path, external = layout.relativize(metadata_key, key), False
    return StateFile(
        path=path,
        scope=scope,
        size=draw(st.integers(min_value=0, max_value=2**40)),
        checksum=draw(checksums),
        external=external,
        name=draw(st.none() | st.text(min_size=1, max_size=12)),
    )


@st.composite
def documents(draw: st.DrawFn) -> tuple[str, CheckpointMetadata]:
    """A metadata key and a valid document to be written there."""
    key = draw(metadata_keys())
    operators = []
    for op in draw(st.lists(st.text(min_size=1, max_size=8), max_size=3, unique=True)):
        ranges = []
        for _ in range(draw(st.integers(0, 3))):
            start = draw(st.integers(0, 1000))
            ranges.append(
                KeyGroupState(
                    key_groups=KeyGroupRange(start=start, end=start + draw(st.integers(0, 100))),
                    files=draw(st.lists(state_files(key), max_size=4)),
                    info=draw(json_objects),
                )
            )
        operators.append(OperatorState(operator=op, ranges=ranges))
    lineage = None
    if draw(st.booleans()):
        lineage = Lineage(
            mode=draw(st.sampled_from(list(RestoreMode))),
            source="s3://other-bucket/job-0/chk-3/_metadata",
            source_job_id=draw(st.text(min_size=1, max_size=10)),
            source_checkpoint_id=draw(ids),
            source_needed=draw(st.booleans()),
        )
    savepoint = layout.parse(key).savepoint
    meta = CheckpointMetadata(
        job_id=draw(st.text(min_size=1, max_size=20)),
        checkpoint_id=layout.parse(key).checkpoint_id or draw(ids),
        epoch=draw(ids),
        kind="savepoint" if savepoint else "checkpoint",
        savepoint_name=savepoint,
        created_at=draw(times),
        completed_at=draw(times),
        source_position=draw(json_objects),
        max_parallelism=draw(st.integers(1, 32768)),
        operators=operators,
        lineage=lineage,
    )
    return key, meta


def sample() -> CheckpointMetadata:
    """A fixed, realistic document for the refusal tests."""
    key = layout.checkpoint_metadata_key(7)
    files = [
        StateFile(
            path=layout.relativize(key, layout.shared_key(2, 5, "000011.sst")),
            scope=Scope.SHARED,
            size=1234,
            checksum="sha256:" + "ab" * 32,
            name="000011.sst",
        ),
        StateFile(
            path=layout.relativize(key, layout.exclusive_key(2, 7, "MANIFEST")),
            scope=Scope.EXCLUSIVE,
            size=99,
            checksum="sha256:" + "cd" * 32,
        ),
    ]
    return CheckpointMetadata(
        job_id="orders-dedup",
        checkpoint_id=7,
        epoch=2,
        created_at=1700000000.25,
        completed_at=1700000001.5,
        source_position={"batch_id": 7, "offsets": {"topic": {"0": 4711, "1": 815}}},
        max_parallelism=128,
        operators=[
            OperatorState(
                operator="dedup",
                ranges=[
                    KeyGroupState(key_groups=KeyGroupRange(start=0, end=63), files=files),
                    KeyGroupState(
                        key_groups=KeyGroupRange(start=64, end=127),
                        files=[],
                        info={"rocksdb": {"sequence": 42}},
                    ),
                ],
            )
        ],
    )


KEY = layout.checkpoint_metadata_key(7)
SAMPLE = sample()  # data file names are unique: build it once
EXCLUSIVE_NAME = SAMPLE.operators[0].ranges[0].files[1].path.rsplit("/", 1)[1]
ENCODED = metadata.encode(SAMPLE, KEY)


def reencode(doc: dict[str, Any]) -> bytes:
    """A document with a correct checksum, so only its content can be the problem."""
    doc = dict(doc)
    doc["checksum"] = signed.digest(doc)
    return json.dumps(doc).encode()


def edited(edit: Any) -> bytes:
    doc = json.loads(ENCODED)
    edit(doc)
    return reencode(doc)


def set_path(path: str, external: bool = False) -> bytes:
    def edit(doc: dict[str, Any]) -> None:
        f = doc["operators"][0]["ranges"][0]["files"][0]
        f["path"], f["external"] = path, external

    return edited(edit)


def same(decoded: CheckpointMetadata, original: CheckpointMetadata) -> bool:
    """Equal content; the decoded document also carries the checksum it was verified with."""
    assert decoded.checksum == signed.digest(original.model_dump(mode="json"))
    return decoded.model_dump(exclude={"checksum"}) == original.model_dump(exclude={"checksum"})


def with_first_file(meta: CheckpointMetadata, **update: Any) -> CheckpointMetadata:
    """`meta` with its first state file changed (the models are frozen)."""
    op = meta.operators[0]
    kg = op.ranges[0]
    files = [kg.files[0].model_copy(update=update), *kg.files[1:]]
    ranges = [kg.model_copy(update={"files": files}), *op.ranges[1:]]
    return meta.model_copy(update={"operators": [op.model_copy(update={"ranges": ranges})]})


def refused(data: bytes, key: str = KEY, where: str = "s3://b/job/chk-7/_metadata") -> str:
    with pytest.raises(MetadataError) as err:
        metadata.decode(data, key, where)
    assert where in str(err.value)  # the message names the file
    return str(err.value)


# -- round trip -----------------------------------------------------------------------------
@given(doc=documents())
def test_round_trip(doc: tuple[str, CheckpointMetadata]) -> None:
    key, meta = doc
    data = metadata.encode(meta, key)
    assert same(metadata.decode(data, key), meta)
    assert metadata.encode(metadata.decode(data, key), key) == data  # stable bytes


@given(doc=documents())
def test_sealed_is_what_a_reader_decodes(doc: tuple[str, CheckpointMetadata]) -> None:
    """The coordinator keeps `sealed`'s model instead of parsing its document back."""
    key, meta = doc
    # A value JSON has no type for (a tuple) comes back as a reader sees it (a list).
    meta = meta.model_copy(update={"source_position": {"offsets": (1, 2)}})
    data, kept = metadata.sealed(meta, key)
    assert data == metadata.encode(meta, key)
    assert kept == metadata.decode(data, key)
    assert kept.source_position == {"offsets": [1, 2]}


@settings(max_examples=15, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=documents())
def test_round_trip_through_storage(storage: Storage, doc: tuple[str, CheckpointMetadata]) -> None:
    key, meta = doc
    write_metadata(storage, key, meta)
    assert same(metadata.read_metadata(storage, key), meta)
    refs = metadata.referenced_keys(meta, key)
    assert len(refs) == sum(1 for _, _, f in meta.state_files() if not f.external)
    for ref, f in refs.items():
        assert layout.parse(ref).scope is f.scope  # resolved back to where it was made


def test_referenced_keys_resolve_into_the_job_directory() -> None:
    refs = metadata.referenced_keys(SAMPLE, KEY)
    kinds = {layout.parse(k).kind for k in refs}
    assert kinds == {layout.Kind.SHARED, layout.Kind.EXCLUSIVE}
    assert all(k.startswith(("shared/e2-c5-", "exclusive/e2-c7-")) for k in refs)


# -- damage ---------------------------------------------------------------------------------
@given(
    flips=st.lists(
        st.tuples(st.integers(0, len(ENCODED) - 1), st.integers(1, 255)), min_size=1, max_size=4
    )
)
def test_corrupt_bytes_never_decode_to_different_content(flips: list[tuple[int, int]]) -> None:
    data = bytearray(ENCODED)
    for pos, mask in flips:
        data[pos] ^= mask
    try:
        meta = metadata.decode(bytes(data), KEY, "chk-7/_metadata")
    except MetadataError as e:
        assert "chk-7/_metadata" in str(e)
    else:  # only harmless flips (whitespace, 'e'/'E' in a number...) may pass
        assert same(meta, SAMPLE)


def test_truncated_at_every_position() -> None:
    body = len(ENCODED.rstrip())
    for n in range(body):
        refused(ENCODED[:n])
    assert same(metadata.decode(ENCODED[:body], KEY), SAMPLE)  # only the newline was cut


def test_checksum_mismatch_is_refused() -> None:
    doc = json.loads(ENCODED)
    doc["epoch"] = 3  # a plausible edit that keeps the old checksum
    assert "checksum" in refused(json.dumps(doc).encode())


def test_future_version_says_upgrade() -> None:
    message = refused(edited(lambda d: d.__setitem__("version", FORMAT_VERSION + 1)))
    assert "newer" in message and "upgrade" in message
    assert str(FORMAT_VERSION + 1) in message


@pytest.mark.parametrize("version", [0, -1, "1", True, None, 1.0])
def test_bad_version_refused(version: object) -> None:
    refused(edited(lambda d: d.__setitem__("version", version)))


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x80\x04\x95 pickled bytes",
        b"[]",
        b'"statehold.checkpoint"',
        b'{"hello": "world"}',
        b'{"format": "flink.savepoint", "version": 1}',
        b"null",
    ],
)
def test_not_our_format_refused(data: bytes) -> None:
    refused(data)


def test_other_format_name_with_valid_checksum_refused() -> None:
    message = refused(edited(lambda d: d.__setitem__("format", "other.checkpoint")))
    assert "not a statehold" in message


def test_invalid_field_refused() -> None:
    assert "invalid" in refused(edited(lambda d: d.__setitem__("checkpoint_id", -1)))
    assert "invalid" in refused(edited(lambda d: d.__setitem__("surprise", 1)))


# -- paths ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "path",
    [
        "/data/ckpt/job/shared/e2-c5-x",
        "../../other-job/shared/e2-c5-x",
        "../../../etc/passwd",
        "..",
        "C:\\ckpt\\shared\\x",
        "s3://bucket/job/shared/x",  # a URI is only allowed for an external file
    ],
)
def test_unsafe_state_file_paths_refused(path: str) -> None:
    assert "unsafe" in refused(set_path(path))


def test_path_escaping_from_a_savepoint_refused() -> None:
    sp_key = layout.savepoint_metadata_key("nightly")
    inside = "../../shared/e2-c5-x"  # savepoints/nightly/ -> job dir: fine
    assert layout.check_data_key(sp_key, layout.resolve(sp_key, inside)) == "shared/e2-c5-x"
    refused(set_path("../../../shared/e2-c5-x"), sp_key)
    refused(set_path(inside), KEY)  # the same path from chk-7/ leaves the job directory


@pytest.mark.parametrize(
    "path",
    [
        "../_ha/00000000000000000001.json",
        "../savepoints/keep/_metadata",
        "../_spark/offsets/0",
        "../_job/result.json",
        "../chk-3/_metadata",
        "_metadata",
        "../shared/not-a-statehold-name",
    ],
)
def test_metadata_may_name_only_data_files(path: str) -> None:
    """Bookkeeping and other checkpoints' documents can never be named by a document, so
    nothing can delete them through one."""
    assert "may only name" in refused(set_path(path))


def test_external_file_must_be_a_uri() -> None:
    assert "URI" in refused(set_path("shared/e2-c5-x", external=True))
    assert "URI" in refused(set_path("/abs/shared/e2-c5-x", external=True))
    ok = metadata.decode(set_path("s3://src/job/shared/e2-c5-x", external=True), KEY)
    assert metadata.referenced_keys(ok, KEY).keys() == {"exclusive/" + EXCLUSIVE_NAME}


@pytest.mark.parametrize(
    "path", ["/abs/shared/x", "../../escape/x", "../../../x", "s3://b/x", "sub\\x"]
)
def test_encode_refuses_unsafe_paths(path: str) -> None:
    bad = with_first_file(SAMPLE, path=path)
    with pytest.raises(UnsafePathError):
        metadata.encode(bad, KEY)


def test_encode_refuses_external_non_uri() -> None:
    bad = with_first_file(SAMPLE, external=True)
    with pytest.raises(UnsafePathError):
        metadata.encode(bad, KEY)


# -- on storage -----------------------------------------------------------------------------
def test_read_missing_says_missing(storage: Storage) -> None:
    with pytest.raises(MetadataError) as err:
        metadata.read_metadata(storage, KEY)
    assert "missing" in str(err.value)
    assert f"{storage.uri.rstrip('/')}/{KEY}" in str(err.value)


@pytest.mark.parametrize(
    "damage",
    [
        lambda d: d[: len(d) // 2],
        lambda d: d.replace(b'"epoch": 2', b'"epoch": 3'),
        lambda d: b"not json at all",
    ],
)
def test_read_damaged_names_the_file(storage: Storage, damage: Any) -> None:
    write_metadata(storage, KEY, SAMPLE)
    assert same(metadata.read_metadata(storage, KEY), SAMPLE)
    storage.write(KEY, damage(storage.read(KEY)))
    with pytest.raises(MetadataError) as err:
        metadata.read_metadata(storage, KEY)
    assert f"{storage.uri.rstrip('/')}/{KEY}" in str(err.value)


def test_write_metadata_refuses_unsafe_before_writing(storage: Storage) -> None:
    bad = with_first_file(SAMPLE, path="../../../x")
    with pytest.raises(UnsafePathError):
        write_metadata(storage, KEY, bad)
    assert not storage.exists(KEY)
