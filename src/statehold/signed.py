"""Self-verifying JSON documents: the one format of statehold's `_metadata` files and
embedded HA pointer documents.

A document is a JSON object with a ``format`` name, an integer ``version`` and a
``checksum``: the SHA-256 of the canonical JSON (sorted keys, no spaces) of every other
field. A reader refuses — with an error naming the file and the problem — anything it
cannot verify: not JSON (truncated), another format, a newer version, a wrong checksum,
or a body its model rejects. JSON, never pickle: reading one can never execute code.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


def digest(doc: dict[str, Any]) -> str:
    body = {k: v for k, v in doc.items() if k != "checksum"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def encode(model: BaseModel) -> bytes:
    """The model as an indented JSON document carrying its checksum."""
    doc = model.model_dump(mode="json")
    doc["checksum"] = digest(doc)
    return json.dumps(doc, indent=1, sort_keys=True, ensure_ascii=False).encode() + b"\n"


def decode(
    data: bytes,
    model: type[M],
    *,
    where: str,
    format_name: str,
    version: int,
    what: str,
    error: type[Exception],
) -> M:
    """Parse and verify a document of `format_name` up to `version`; raise `error`
    naming `where` and the problem. `what` names the kind of document for people."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise error(f"{where}: not valid JSON (corrupt or truncated?): {e}") from e
    if not isinstance(doc, dict) or doc.get("format") != format_name:
        raise error(f"{where}: not a statehold {what} document")
    found = doc.get("version")
    if not isinstance(found, int) or isinstance(found, bool) or found < 1:
        raise error(f"{where}: format version missing or invalid")
    if found > version:
        raise error(
            f"{where}: format version {found} is newer than this statehold reads "
            f"({version}); upgrade statehold"
        )
    if doc.get("checksum") != digest(doc):
        raise error(f"{where}: checksum mismatch (the document was altered or damaged)")
    try:
        return model.model_validate(doc)
    except ValidationError as e:
        raise error(f"{where}: invalid document: {e}") from e
