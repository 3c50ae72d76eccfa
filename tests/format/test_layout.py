"""The job directory layout: names that carry epoch and checkpoint id, classification of
every kind of key, and metadata-relative paths that can never leave the job directory."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statehold.format import layout
from statehold.format.layout import Kind, Scope
from statehold.storage import UnsafePathError

ids = st.integers(min_value=0, max_value=2**63)
segment = st.text(alphabet="abcXYZ019._-", min_size=1, max_size=10).filter(
    lambda s: s not in (".", "..")
)
job_keys = st.lists(segment, min_size=1, max_size=5).map("/".join)
savepoint_names = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,20}\Z")


@st.composite
def metadata_keys(draw: st.DrawFn) -> str:
    if draw(st.booleans()):
        return layout.checkpoint_metadata_key(draw(ids))
    return layout.savepoint_metadata_key(draw(savepoint_names))


# -- naming -------------------------------------------------------------------------------
@given(epoch=ids, checkpoint=ids, hint=st.text(max_size=120), shared=st.booleans())
def test_data_names_carry_epoch_and_checkpoint(
    epoch: int, checkpoint: int, hint: str, shared: bool
) -> None:
    make = layout.shared_key if shared else layout.exclusive_key
    key = make(epoch, checkpoint, hint)
    info = layout.parse(key)
    assert info.kind is (Kind.SHARED if shared else Kind.EXCLUSIVE)
    assert info.scope is (Scope.SHARED if shared else Scope.EXCLUSIVE)
    assert (info.epoch, info.checkpoint_id) == (epoch, checkpoint)
    assert info.key == key


@given(
    hint=st.lists(st.sampled_from(["a", ".", "tmp-", ".tmp-", "/", " "]), max_size=12).map(
        "".join
    )
)
def test_a_hint_never_makes_a_data_file_look_temporary(hint: str) -> None:
    key = layout.shared_key(3, 4, hint)
    assert layout.TEMP_MARKER not in key
    assert layout.parse(key).kind is Kind.SHARED


def test_data_names_are_unique_and_readable() -> None:
    names = {layout.data_file_name(1, 2, "kg-0-127/000042.sst") for _ in range(200)}
    assert len(names) == 200
    assert all(n.startswith("e1-c2-") and n.endswith("kg-0-127_000042.sst") for n in names)


def test_negative_ids_refused() -> None:
    with pytest.raises(ValueError):
        layout.data_file_name(-1, 0)
    with pytest.raises(ValueError):
        layout.data_file_name(0, -1)


# -- parse --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("key", "kind", "epoch", "checkpoint", "savepoint"),
    [
        ("shared/e3-c17-abcdef", Kind.SHARED, 3, 17, None),
        ("exclusive/e0-c0-x.y_z-1", Kind.EXCLUSIVE, 0, 0, None),
        ("taskowned/e2-c5-u", Kind.TASKOWNED, 2, 5, None),
        ("taskowned/op/anything/at/all", Kind.TASKOWNED, None, None, None),
        ("shared/not-a-data-name", Kind.UNKNOWN, None, None, None),
        ("shared/sub/e1-c1-u", Kind.UNKNOWN, None, None, None),
        ("exclusive/e1-cX-u", Kind.UNKNOWN, None, None, None),
        ("chk-12/_metadata", Kind.CHECKPOINT_METADATA, None, 12, None),
        ("chk-12/other", Kind.CHECKPOINT_OTHER, None, 12, None),
        ("chk-12/sub/_metadata", Kind.CHECKPOINT_OTHER, None, 12, None),
        ("chk-x/_metadata", Kind.UNKNOWN, None, None, None),
        ("savepoints/nightly-1/_metadata", Kind.SAVEPOINT_METADATA, None, None, "nightly-1"),
        ("savepoints/nightly-1/shared/f", Kind.SAVEPOINT_OTHER, None, None, "nightly-1"),
        ("savepoints/nightly-1", Kind.UNKNOWN, None, None, None),
        ("_ha/leader", Kind.HA, None, None, None),
        ("_job/result", Kind.JOB, None, None, None),
        ("_spark/offsets/0", Kind.SPARK, None, None, None),
        ("_ha", Kind.UNKNOWN, None, None, None),
        # an interrupted atomic write still tells what it was writing
        ("shared/.e1-c2-u.tmp-0123abcd", Kind.TEMP, 1, 2, None),
        ("chk-3/._metadata.tmp-ff", Kind.TEMP, None, 3, None),
        ("exclusive/.junk.tmp-ff", Kind.TEMP, None, None, None),
        ("_ha/.00000000000000000001.json.tmp-ff", Kind.HA, None, None, None),
        ("random-file", Kind.UNKNOWN, None, None, None),
    ],
)
def test_parse_every_kind(
    key: str, kind: Kind, epoch: int | None, checkpoint: int | None, savepoint: str | None
) -> None:
    info = layout.parse(key)
    assert (info.kind, info.epoch, info.checkpoint_id, info.savepoint) == (
        kind,
        epoch,
        checkpoint,
        savepoint,
    )


@pytest.mark.parametrize(
    "key",
    [
        "",
        "/shared/e1-c1-u",
        "../other-job/shared/e1-c1-u",
        "shared/../../x",
        "a\\b",
        "s3://bucket/job/chk-1/_metadata",
        "shared//e1-c1-u",
    ],
)
def test_parse_refuses_unsafe_keys(key: str) -> None:
    with pytest.raises(UnsafePathError):
        layout.parse(key)


@given(checkpoint=ids)
def test_checkpoint_metadata_key_round_trip(checkpoint: int) -> None:
    info = layout.parse(layout.checkpoint_metadata_key(checkpoint))
    assert info.kind is Kind.CHECKPOINT_METADATA and info.checkpoint_id == checkpoint
    assert layout.parse(f"{layout.checkpoint_dir(checkpoint)}/x").kind is Kind.CHECKPOINT_OTHER


@given(name=savepoint_names)
def test_savepoint_metadata_key_round_trip(name: str) -> None:
    info = layout.parse(layout.savepoint_metadata_key(name))
    assert info.kind is Kind.SAVEPOINT_METADATA and info.savepoint == name


@pytest.mark.parametrize(
    "name", ["", ".", "..", "a/b", "../x", "-leading-dash", ".hidden", "a b", "x" * 129, "ü"]
)
def test_bad_savepoint_names_refused(name: str) -> None:
    with pytest.raises(ValueError):
        layout.check_savepoint_name(name)
    with pytest.raises(ValueError):
        layout.savepoint_metadata_key(name)


# -- resolve / relativize -----------------------------------------------------------------
@given(meta=metadata_keys(), key=job_keys)
def test_relativize_resolve_round_trip(meta: str, key: str) -> None:
    relative = layout.relativize(meta, key)
    assert not relative.startswith("/")
    assert layout.resolve(meta, relative) == key


def test_relative_paths_are_relative_to_the_metadata_file() -> None:
    assert layout.relativize("chk-7/_metadata", "shared/f") == "../shared/f"
    assert layout.relativize("savepoints/sp/_metadata", "shared/f") == "../../shared/f"
    assert layout.relativize("chk-7/_metadata", "chk-7/own") == "own"
    assert layout.resolve("chk-7/_metadata", "../exclusive/e1-c7-u") == "exclusive/e1-c7-u"
    assert layout.resolve("savepoints/sp/_metadata", "data/f") == "savepoints/sp/data/f"


@pytest.mark.parametrize(
    ("meta", "path"),
    [
        ("chk-1/_metadata", "../../other-job/shared/f"),
        ("chk-1/_metadata", ".."),
        ("chk-1/_metadata", "../.."),
        ("chk-1/_metadata", "shared/../../../x"),
        ("savepoints/sp/_metadata", "../../../x"),
        ("savepoints/sp/_metadata", "../../.."),
        ("chk-1/_metadata", "/etc/passwd"),
        ("chk-1/_metadata", "/data/ckpt/job/shared/f"),
        ("chk-1/_metadata", "s3://bucket/job/shared/f"),
        ("chk-1/_metadata", "file:///data/f"),
        ("chk-1/_metadata", "..\\..\\x"),
        ("chk-1/_metadata", ""),
        ("chk-1/_metadata", "a\x00b"),
    ],
)
def test_resolve_refuses_escapes_and_absolute_paths(meta: str, path: str) -> None:
    with pytest.raises(UnsafePathError):
        layout.resolve(meta, path)


@given(meta=metadata_keys(), ups=st.integers(min_value=0, max_value=6), tail=job_keys)
def test_resolve_never_leaves_the_job_directory(meta: str, ups: int, tail: str) -> None:
    """Either the result is a safe key inside the job directory, or it is refused."""
    path = "../" * ups + tail
    depth = meta.count("/")  # directories between the job directory and the metadata
    if ups > depth:
        with pytest.raises(UnsafePathError):
            layout.resolve(meta, path)
    else:
        parents = meta.split("/")[:-1]
        expected = "/".join(parents[: len(parents) - ups] + tail.split("/"))
        assert layout.resolve(meta, path) == expected


def test_resolve_refuses_unsafe_metadata_key() -> None:
    with pytest.raises(UnsafePathError):
        layout.resolve("../chk-1/_metadata", "x")
    with pytest.raises(UnsafePathError):
        layout.relativize("chk-1/_metadata", "../x")
