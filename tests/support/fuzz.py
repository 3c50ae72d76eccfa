"""Hypothesis strategies for fuzzing on-disk documents' decoders: arbitrary JSON-ish
bytes, mutations of a valid JSON document (values replaced by extreme ones, members
removed or added, re-signed where the document carries a checksum) and byte mutations
(flips, inserts, deletes, duplicates, truncation). tests/format/test_fuzz_decoders.py
fuzzes statehold's own documents with them, tests/spark_checkpoints/test_fuzz_spark_files.py
Spark's checkpoint files."""

from __future__ import annotations

import contextlib
import json
import tracemalloc
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from statehold.format import signed

JSONISH = st.sampled_from([b"{", b"}", b"[", b"]", b'"', b":", b",", b"\\", b"1", b"-",
                          b"e", b"null", b"true", b'"format"', b'"version"', b"\\ud800",
                          b"\xff", b"\xc3", b" "])


def _paths(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON value: object members and list entries, the root's too."""
    found = [path] if path else []
    if isinstance(node, dict):
        for k, v in node.items():
            found += _paths(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            found += _paths(v, (*path, i))
    return found


def nested(depth: int, leaf: Any) -> Any:
    for i in range(depth):
        leaf = [leaf] if i % 2 else {"a": leaf}
    return leaf


_HUGE_INTS = st.sampled_from([2**53, 2**53 + 1, 2**63, 2**64 + 1, -(2**63), 10**30, 10**300,
                              10**4000, -(10**4000)])
EXTREME = st.one_of(
    _HUGE_INTS,
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([1e308, -1e308, 5e-324, -0.0, 0.5, 2.0**35, 2.0**53]),
    st.booleans(),
    st.none(),
    st.text(max_size=50),
    st.sampled_from(["", "../../etc/passwd", "/abs", "s3://x/y", "\x00", "\ud800", "\u2028",
                     "sha256:" + "0" * 64, "a\nb", "chk-1/../../x"]),
    st.integers(1, 200_000).map(lambda n: "x" * n),
    st.builds(nested, st.integers(1, 120), st.sampled_from([0, "s", None, []])),
    st.lists(st.integers(-5, 5), max_size=20),
    st.integers(1, 20_000).map(lambda n: [{}] * n),
    st.dictionaries(st.text(max_size=10), st.integers(), max_size=5),
)


def sign(doc: dict[str, Any]) -> None:
    with contextlib.suppress(UnicodeEncodeError):  # a lone surrogate: the old checksum
        doc["checksum"] = signed.digest(doc)


def _replace(doc: Any, path: tuple[Any, ...], value: Any) -> None:
    node = doc
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value


def _remove(doc: Any, path: tuple[Any, ...]) -> None:
    node = doc
    for step in path[:-1]:
        node = node[step]
    del node[path[-1]]


def dumps(doc: Any, ascii_only: bool) -> bytes:
    text = json.dumps(doc, ensure_ascii=ascii_only, sort_keys=True)
    return text.encode("utf-8", "surrogatepass")


@st.composite
def json_mutations(draw: st.DrawFn, sample: bytes) -> bytes:
    doc = json.loads(sample)
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(doc)
        path = draw(st.sampled_from(paths)) if paths else ()
        action = draw(st.sampled_from(["replace", "replace", "remove", "add"]))
        if action == "replace" and path:
            _replace(doc, path, draw(EXTREME))
        elif action == "remove" and path:
            _remove(doc, path)
        else:
            doc[draw(st.text(max_size=12))] = draw(EXTREME)
    if isinstance(doc, dict) and "checksum" in doc and draw(st.booleans()):
        sign(doc)  # re-signed, as anyone who can write the file can
    return dumps(doc, draw(st.booleans()))


@st.composite
def byte_mutations(draw: st.DrawFn, sample: bytes) -> bytes:
    data = bytearray(sample)
    for _ in range(draw(st.integers(1, 8))):
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        op = draw(st.sampled_from(["flip", "insert", "delete", "duplicate", "truncate"]))
        if op == "flip":
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8) | JSONISH)
        elif op == "delete":
            del data[at : at + draw(st.integers(1, 16))]
        elif op == "duplicate":
            data[at:at] = data[at : at + draw(st.integers(1, 64))]
        else:
            del data[at:]
    return bytes(data)


#: Peak memory a decode of a 1 MB input may take.
MAX_PEAK = 64 << 20
#: How long each fuzz test searches (no deadline: a busy machine is not a failure).
FUZZ = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
#: Longest message a refusal may carry (a log line; `signed.one_line` cuts at 500, plus
#: the file's name).
MAX_MESSAGE = 2000


def decoded_or_refused(decode: Callable[[bytes], object], data: bytes,
                       error: type[Exception]) -> object:
    """`decode(data)`: its value, or the `error` it raised, whose message must be one
    line of at most `MAX_MESSAGE` characters; any other exception escapes (and fails
    the test with its traceback)."""
    try:
        return decode(data)
    except error as e:
        message = str(e)
        assert message and len(message) <= MAX_MESSAGE, message[:200]
        assert "\n" not in message and "\r" not in message, message[:200]
        return e


def peaks_over(decode: Callable[[bytes], object], inputs: list[tuple[str, bytes]],
               max_peak: int) -> dict[str, int]:
    """The inputs whose decode took a peak of traced memory above `max_peak`, and that
    peak in MiB (tracemalloc: Python's allocations, C extensions' through its allocator)."""
    peaks = {}
    for name, data in inputs:
        tracemalloc.start()
        try:
            decode(data)
            peaks[name] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    return {name: peak >> 20 for name, peak in peaks.items() if peak > max_peak}
