"""The owner record ``_job/owner.json``: which job a directory is and which HA store owns
it, with HA store URIs in the normal form in which two of them are compared.

Reading it, and refusing a directory whose record names another store, is the job
directory's (`directory.open_job`)."""

from __future__ import annotations

import time
from typing import Final, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field

from statehold.errors import InvalidArgumentError
from statehold.format import layout, signed
from statehold.ha.open import EMBEDDED
from statehold.ha.uri import URI_SCHEME, parse_uri
from statehold.storage.base import Storage

OWNER_KEY: Final = f"{layout.JOB_DIR}/owner.json"
OWNER_FORMAT: Final = "statehold.job-owner"
OWNER_VERSION: Final = 1


class OwnerRecord(BaseModel):
    """``_job/owner.json``: which job this directory is and which HA store owns it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["statehold.job-owner"] = OWNER_FORMAT
    version: int = OWNER_VERSION
    job_id: str = Field(min_length=1, max_length=256)
    #: ``embedded`` or ``zookeeper://host:port[,host:port]/root``.
    ha: str = Field(min_length=1, max_length=4096)
    created_at: float = Field(default_factory=time.time)
    checksum: str = ""


def canonical_ha(uri: str | None) -> str:
    """The normal form of an HA store URI (InvalidArgumentError if it names no store)."""
    text = (uri or EMBEDDED).strip()
    if text == EMBEDDED:
        return EMBEDDED
    if text.startswith(f"{URI_SCHEME}://"):
        try:
            hosts, root = parse_uri(text)
        except ValueError as e:
            raise InvalidArgumentError(str(e)) from e
        return f"{URI_SCHEME}://{','.join(sorted(hosts.split(',')))}{root}"
    raise InvalidArgumentError(
        f"unknown HA store {uri!r}: use {EMBEDDED!r} or {URI_SCHEME}://host:port[,host:port]/path"
    )


def same_ha(a: str, b: str) -> bool:
    """Do two canonical URIs name one store? ZooKeeper: the same root on an ensemble the
    two host lists share a member of (a client may list a subset of the ensemble)."""
    if a == b:
        return True
    if not (a.startswith(f"{URI_SCHEME}://") and b.startswith(f"{URI_SCHEME}://")):
        return False
    pa, pb = urlsplit(a), urlsplit(b)
    return pa.path == pb.path and bool(set(pa.netloc.split(",")) & set(pb.netloc.split(",")))


def write_owner(storage: Storage, job_id: str, ha: str, *, replace: bool = False) -> OwnerRecord:
    record = OwnerRecord(job_id=job_id, ha=canonical_ha(ha))
    data = signed.encode(record)
    if replace:
        storage.write(OWNER_KEY, data)
    else:
        storage.create_if_absent(OWNER_KEY, data)
    return record


__all__ = ["OWNER_KEY", "OwnerRecord", "canonical_ha", "same_ha", "write_owner"]
