"""Self-verifying JSON documents: the one format of statehold's `_metadata` files and
embedded HA pointer documents, and the bounds every statehold document is read within.

A document is a JSON object with a ``format`` name, an integer ``version`` and a
``checksum``: the SHA-256 of the canonical JSON (sorted keys, no spaces) of every other
field. A reader refuses — with a one-line error naming the file and the problem — anything
it cannot verify: not JSON (truncated), another format, a newer version, a wrong checksum,
or a body its model rejects. JSON, never pickle: reading one can never execute code.

A checksum proves a document is intact, not that it is sane: anyone who can write the file
can sign it. So every reader also refuses, before it allocates or loops on them, documents
that are too large or nested too deeply and numbers, lists and strings beyond the limits
below — a crafted epoch of 10**9 must not send a tool claiming epochs for weeks.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from typing import Annotated, Any, Final, NoReturn, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    FailFast,
    Field,
    Strict,
    TypeAdapter,
    ValidationError,
)

from statehold.errors import InvalidArgumentError, StateholdError

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")

# -- limits -----------------------------------------------------------------------------------
# Inclusive maxima, all in one place. Each is far above anything a real job produces and
# far below what would make a reader hang, allocate wildly or recurse out of its stack.

#: Checkpoint ids, epochs, sequence numbers, versions: every integer up to 2**53 is exact
#: in a double, so readers that hold JSON numbers as doubles (JavaScript, jq) agree.
MAX_ID: Final = 2**53
#: File sizes in bytes (1 PiB).
MAX_SIZE: Final = 2**50
#: Key groups are 0..max_parallelism-1 and stored as 2 bytes; like Flink we stop at 2**15.
#: Equal to `statehold.backend.keys.MAX_MAX_PARALLELISM` (which imports the metadata
#: models, so it cannot be imported here; a test keeps the two equal).
MAX_MAX_PARALLELISM: Final = 1 << 15
#: Unix timestamps in seconds: 0 (1970) up to 2**35 (the year 3058), finite.
MAX_TIMESTAMP: Final = float(2**35)
#: A lease vouches for at most a week (the default ttl is two minutes).
MAX_LEASE_TTL: Final = 7 * 24 * 3600.0
#: Entries of one list: files of a range, ranges of an operator, operators, pointers.
MAX_ITEMS: Final = 1_000_000
#: Characters of a name, an id, a path or a URI.
MAX_NAME: Final = 4096
#: Base64 characters of one inline file (the RocksDB backend inlines files <= 16 KiB).
MAX_INLINE_DATA: Final = 1 << 20
#: Nesting of arrays and objects (a real document nests about 8 levels).
MAX_DEPTH: Final = 64
#: Bytes of a `_metadata` document (a realistic large one is about 1 MB).
MAX_METADATA_BYTES: Final = 64 << 20
#: Bytes of a small document: HA pointer, ZooKeeper znode (its own default limit is about
#: 1 MB too), job result, lease.
MAX_SMALL_DOCUMENT_BYTES: Final = 1 << 20

#: A checkpoint id, epoch or sequence number; never a bool or a float.
Id = Annotated[int, Strict(), Field(ge=0, le=MAX_ID)]
#: A format version.
Version = Annotated[int, Strict(), Field(ge=1, le=MAX_ID)]
#: A size in bytes.
Size = Annotated[int, Strict(), Field(ge=0, le=MAX_SIZE)]
#: A key group: 0..MAX_MAX_PARALLELISM-1.
KeyGroup = Annotated[int, Strict(), Field(ge=0, lt=MAX_MAX_PARALLELISM)]
#: A job's max parallelism (the number of key groups).
MaxParallelism = Annotated[int, Strict(), Field(ge=1, le=MAX_MAX_PARALLELISM)]
#: A Unix timestamp in seconds (an int is fine, a bool, NaN or infinity is not).
Timestamp = Annotated[float, Strict(), Field(ge=0, le=MAX_TIMESTAMP, allow_inf_nan=False)]
#: A name, id, path or URI.
Name = Annotated[str, Field(max_length=MAX_NAME)]


class InvalidDocumentError(StateholdError, ValueError):
    """A value in a document that cannot be used; `decode` reports it with the document's
    name."""


def _at_most_items(items: object) -> object:
    if isinstance(items, list | tuple) and len(items) > MAX_ITEMS:
        raise InvalidArgumentError(f"more than {MAX_ITEMS} entries ({len(items)})")
    return items


#: A list of at most MAX_ITEMS entries, counted before any entry is validated (pydantic's
#: own max_length counts after validating them all: seconds for a crafted million), and
#: validated up to its first bad entry only: an error per entry of half a million bad
#: ones took over 300 MB for a 1 MB document (found by tests/format/test_fuzz_decoders.py).
Items = Annotated[list[T], FailFast(), BeforeValidator(_at_most_items)]


def each_member(value_type: Any) -> BeforeValidator:
    """For a dict field: at most MAX_ITEMS members, their values checked one by one and the
    first bad one refused, before pydantic validates them all (it keeps an error per bad
    member: about 85 MB for a 1 MB document of bad ones; pydantic's FailFast is for lists
    only)."""
    adapter: TypeAdapter[Any] = TypeAdapter(value_type)

    def check(members: object) -> object:
        if isinstance(members, dict):
            if len(members) > MAX_ITEMS:
                raise InvalidArgumentError(f"more than {MAX_ITEMS} entries ({len(members)})")
            for key, value in members.items():
                try:
                    adapter.validate_python(value)
                except ValidationError as e:
                    raise InvalidArgumentError(f"{one_line(str(key), 80)}: {explain(e, 1)}") from e
        return members

    return BeforeValidator(check)


# -- reading ------------------------------------------------------------------------------------
_STRUCTURE = b'[]{}"'
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in _STRUCTURE)
_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")  # as signed bytes: +1, -1
_CHUNK = 1 << 16


def _too_deep(data: bytes, limit: int) -> bool:
    """Does `data` nest arrays/objects more than `limit` deep (outside strings)? A scan at
    C speed (translate, replace, split) in bounded chunks, so a realistic document pays
    under a millisecond per MB, a crafted one allocates little, and json never gets to
    recurse on it."""
    if b"\\" in data:  # escapes first, so an escaped quote cannot end a string
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    marks = data.translate(None, _NOT_STRUCTURE)
    if len(marks) <= limit:
        return False
    # Dropping two adjacent quotes keeps the parity of the quotes before every bracket: it
    # drops every string without brackets and changes nothing else.
    marks = marks.replace(b'""', b"")
    depth, in_string = 0, False
    for start in range(0, len(marks), _CHUNK):
        parts = marks[start : start + _CHUNK].split(b'"')  # strings are every other part
        outside = b"".join(parts[1 if in_string else 0 :: 2])
        in_string ^= len(parts) % 2 == 0
        steps = memoryview(outside.translate(_STEPS)).cast("b")
        if max(itertools.accumulate(steps, initial=depth)) > limit:
            return True
        depth += sum(steps)
    return False


def _refuse_constant(name: str) -> NoReturn:
    raise InvalidDocumentError(f"{name} is not a number JSON allows")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 parses to infinity
        raise InvalidDocumentError(f"number {text[:40]} is out of range")
    return value


def one_line(text: str, limit: int = 500) -> str:
    """`text` on one line and at most `limit` characters: error messages are log lines."""
    text = " ".join(text.splitlines())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def explain(error: ValidationError, shown: int = 3) -> str:
    """A model's complaints on one line: where in the document, and what."""
    parts = [
        f"{'.'.join(str(p) for p in e['loc']) or 'document'}: {e['msg']}"
        for e in error.errors(include_url=False, include_input=False)[:shown]
    ]
    more = error.error_count() - shown
    return one_line("; ".join(parts) + (f" (and {more} more)" if more > 0 else ""))


def load_json(
    data: bytes,
    *,
    where: str,
    error: type[Exception],
    max_bytes: int = MAX_METADATA_BYTES,
    invalid: str = "not valid JSON (corrupt or truncated?)",
) -> Any:
    """Parse untrusted JSON, or raise `error` with one line naming `where`: too large,
    nested too deeply, or `invalid` — not UTF-8 JSON, or a number JSON does not allow
    (NaN, Infinity, one too large for a double, one with thousands of digits)."""
    if len(data) > max_bytes:
        raise error(f"{where}: {len(data)} bytes, more than the {max_bytes} allowed")
    if _too_deep(data, MAX_DEPTH):
        raise error(f"{where}: nested more than {MAX_DEPTH} levels deep")
    try:
        text = data.decode("utf-8")
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite)
    except RecursionError as e:  # cannot happen below MAX_DEPTH; never let it through
        raise error(f"{where}: nested too deeply") from e
    except ValueError as e:  # also JSONDecodeError, UnicodeDecodeError, int digit limit
        detail = one_line(str(e).split("; use sys.set_int_max_str_digits")[0])
        raise error(f"{where}: {invalid}: {detail}") from e


# -- the signed format ----------------------------------------------------------------------------
def digest(doc: dict[str, Any]) -> str:
    body = {k: v for k, v in doc.items() if k != "checksum"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def encode(model: BaseModel) -> bytes:
    """The model as a JSON document carrying its checksum."""
    return _signed_doc(model)[0]


def sealed(model: M) -> tuple[bytes, M]:
    """The model as a JSON document carrying its checksum, and the model a reader of
    that document gets (checksum set), without parsing the document back."""
    data, doc = _signed_doc(model)
    return data, type(model).model_validate(doc)


def _signed_doc(model: BaseModel) -> tuple[bytes, dict[str, Any]]:
    # Compact, one line: an indented document needs json's pure-Python encoder, about
    # 4x the C one's time (0.33 against 0.07 ms for a 17 KB `_metadata`), on the path of
    # every checkpoint. People read a checkpoint with `statehold inspect --json`, formatted.
    doc = model.model_dump(mode="json")
    doc["checksum"] = digest(doc)
    return json.dumps(doc, sort_keys=True, ensure_ascii=False).encode() + b"\n", doc


def newer_version(
    data: bytes, *, format_name: str, version: int, max_bytes: int = MAX_METADATA_BYTES
) -> int | None:
    """The version a `format_name` document declares if it is newer than `version` (what
    this statehold reads), whether or not it verifies; None for anything else. What such a
    document holds cannot be known here, so nothing may be deleted on its account."""
    try:
        doc = load_json(data, where="document", error=ValueError, max_bytes=max_bytes)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("format") != format_name:
        return None
    found = doc.get("version")
    if isinstance(found, int) and not isinstance(found, bool) and found > version:
        return found
    return None


def decode(
    data: bytes,
    model: type[M],
    *,
    where: str,
    format_name: str,
    version: int,
    what: str,
    error: type[Exception],
    max_bytes: int = MAX_METADATA_BYTES,
) -> M:
    """Parse and verify a document of `format_name` up to `version`; raise `error`
    naming `where` and the problem. `what` names the kind of document for people."""
    doc = load_json(data, where=where, error=error, max_bytes=max_bytes)
    if not isinstance(doc, dict) or doc.get("format") != format_name:
        raise error(f"{where}: not a statehold {what} document")
    found = doc.get("version")
    if not isinstance(found, int) or isinstance(found, bool) or not 1 <= found <= MAX_ID:
        raise error(f"{where}: format version missing or invalid")
    if found > version:
        raise error(
            f"{where}: format version {found} is newer than this statehold reads "
            f"({version}); upgrade statehold"
        )
    try:
        intact = doc.get("checksum") == digest(doc)
    except UnicodeEncodeError as e:  # a lone surrogate escape ("\ud800") in a string
        raise error(f"{where}: not valid JSON: a string holds a lone surrogate") from e
    if not intact:
        raise error(f"{where}: checksum mismatch (the document was altered or damaged)")
    try:
        return model.model_validate(doc)
    except ValidationError as e:
        raise error(f"{where}: invalid document: {explain(e)}") from e
    except RecursionError as e:  # cannot happen below MAX_DEPTH; never let it through
        raise error(f"{where}: nested too deeply") from e
