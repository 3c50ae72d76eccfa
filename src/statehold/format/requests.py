"""Operator requests: how a person outside the driver asks a running attempt for a
savepoint or a stop (``statehold savepoint JOB NAME``, ``statehold stop JOB``).

    _job/requests/<id>.json          the request: what, and for which epoch
    _job/requests/<id>.answer.json   its answer, created exactly once, then updated

Both are signed documents (`signed`), versioned like every statehold format. The answer
is created with create-if-absent by whoever decides first: the attempt the request is
for (``accepted``, then ``done`` or ``failed``), a later attempt (``refused``: the
request was for an attempt that is gone) or the requester giving up (``withdrawn``). So
a request is acted on at most once, and never after its requester withdrew it.
"""

from __future__ import annotations

import re
import time
import uuid
from enum import StrEnum
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from statehold.errors import StateholdError
from statehold.format import layout, signed

REQUESTS_DIR: Final = f"{layout.JOB_DIR}/requests"
REQUEST_FORMAT: Final = "statehold.request"
ANSWER_FORMAT: Final = "statehold.request-answer"
#: Bump on any change a reader of the previous version would misread.
FORMAT_VERSION: Final = 1

_ID = r"r[0-9]{14}-[0-9a-f]{12}"
_REQUEST_KEY = re.compile(rf"^{re.escape(REQUESTS_DIR)}/(?P<id>{_ID})\.json$")
_ANSWER_KEY = re.compile(rf"^{re.escape(REQUESTS_DIR)}/(?P<id>{_ID})\.answer\.json$")


class RequestError(StateholdError):
    """A request or answer document cannot be read."""


class Action(StrEnum):
    SAVEPOINT = "savepoint"
    STOP = "stop"


class Outcome(StrEnum):
    #: The attempt took the request; it is at it (a final answer follows).
    ACCEPTED = "accepted"
    DONE = "done"
    FAILED = "failed"
    #: A later attempt found a request for an attempt that is gone; not acted on.
    REFUSED = "refused"
    #: The requester gave up (timeout) before any attempt took it.
    WITHDRAWN = "withdrawn"

    @property
    def final(self) -> bool:
        return self is not Outcome.ACCEPTED


class OperatorRequest(BaseModel):
    """A savepoint or stop asked of attempt `epoch` of job `job_id`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["statehold.request"] = REQUEST_FORMAT
    version: signed.Version = FORMAT_VERSION
    id: str = Field(pattern=rf"^{_ID}$")
    job_id: signed.Name
    #: The attempt asked: only the attempt holding this epoch acts on it.
    epoch: signed.Id
    action: Action
    #: The savepoint to take (with stop: before ending; None: end without one).
    savepoint: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
    requested_at: signed.Timestamp
    #: Who asked (user@host), for people reading the job directory.
    requested_by: signed.Name = ""
    #: `signed.digest` of the other fields (set by `encode_request`).
    checksum: signed.Name = ""


class RequestAnswer(BaseModel):
    """What became of request `id`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["statehold.request-answer"] = ANSWER_FORMAT
    version: signed.Version = FORMAT_VERSION
    id: str = Field(pattern=rf"^{_ID}$")
    outcome: Outcome
    #: The epoch of the attempt (or requester: the request's) that wrote this answer.
    epoch: signed.Id
    #: One line for people: what was done, or why not.
    message: signed.Name = ""
    #: The savepoint's key in the job directory once taken.
    savepoint_key: signed.Name | None = None
    #: The checkpoint the savepoint (or the stop) was taken at.
    checkpoint_id: signed.Id | None = None
    at: signed.Timestamp
    #: `signed.digest` of the other fields (set by `encode_answer`).
    checksum: signed.Name = ""


def new_request_id(now: float) -> str:
    """Sortable by time, unique: ``r<YYYYmmddHHMMSS>-<12 hex>``."""
    return f"r{time.strftime('%Y%m%d%H%M%S', time.gmtime(now))}-{uuid.uuid4().hex[:12]}"


def request_key(request_id: str) -> str:
    return f"{REQUESTS_DIR}/{request_id}.json"


def answer_key(request_id: str) -> str:
    return f"{REQUESTS_DIR}/{request_id}.answer.json"


def request_id_of(key: str) -> str | None:
    """The request id a request or answer key names, None for any other key."""
    m = _REQUEST_KEY.match(key) or _ANSWER_KEY.match(key)
    return None if m is None else m["id"]


def is_request(key: str) -> bool:
    return _REQUEST_KEY.match(key) is not None


def is_answer(key: str) -> bool:
    return _ANSWER_KEY.match(key) is not None


def encode_request(request: OperatorRequest) -> bytes:
    return signed.encode(request.model_copy(update={"checksum": ""}))


def encode_answer(answer: RequestAnswer) -> bytes:
    return signed.encode(answer.model_copy(update={"checksum": ""}))


def decode_request(data: bytes, where: str) -> OperatorRequest:
    return signed.decode(
        data, OperatorRequest, where=where, format_name=REQUEST_FORMAT,
        version=FORMAT_VERSION, what="request", error=RequestError,
        max_bytes=signed.MAX_SMALL_DOCUMENT_BYTES,
    )


def decode_answer(data: bytes, where: str) -> RequestAnswer:
    return signed.decode(
        data, RequestAnswer, where=where, format_name=ANSWER_FORMAT,
        version=FORMAT_VERSION, what="request answer", error=RequestError,
        max_bytes=signed.MAX_SMALL_DOCUMENT_BYTES,
    )


__all__ = [
    "ANSWER_FORMAT",
    "Action",
    "FORMAT_VERSION",
    "OperatorRequest",
    "Outcome",
    "REQUESTS_DIR",
    "REQUEST_FORMAT",
    "RequestAnswer",
    "RequestError",
    "answer_key",
    "decode_answer",
    "decode_request",
    "encode_answer",
    "encode_request",
    "is_answer",
    "is_request",
    "new_request_id",
    "request_id_of",
    "request_key",
]
