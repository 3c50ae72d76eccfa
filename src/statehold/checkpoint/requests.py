"""Operating a running job from outside: a savepoint or a stop asked through a request
document in the job directory (`statehold.format.requests`).

The requester (`submit`) reads the job's epoch from the HA store, refuses at once when
no attempt of that epoch holds a live lease, and writes ``_job/requests/<id>.json``
(create-if-absent) naming that epoch. The driver lists ``_job/requests/`` once per batch
boundary (`Inbox.poll`): a request for its own epoch it takes by creating the answer
(``accepted``, create-if-absent, after checking its epoch is still current), acts, then
replaces the answer with the outcome and removes the request. A request for an older
epoch was for an attempt that is gone (killed, or ended): it is refused, never acted on,
so a savepoint or stop asked of one run never lands in the next. A requester that gives up
(`withdraw`) creates the answer ``withdrawn`` first: whoever creates the answer decides,
so a withdrawn request is never acted on and an accepted one is always answered.
Every removal goes through the deletion policy (`cleanup.policy.requests_to_remove`).
"""

from __future__ import annotations

import getpass
import logging
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from statehold import clock
from statehold.cleanup.discard import Discard
from statehold.cleanup.policy import requests_to_remove
from statehold.errors import StateholdError
from statehold.format import layout
from statehold.format import requests as fmt
from statehold.format.requests import Action, OperatorRequest, Outcome, RequestAnswer
from statehold.ha.base import HAStore
from statehold.job.lease import read_lease
from statehold.storage.base import AlreadyExistsError, FileInfo, NotFoundError, Storage

log = logging.getLogger("statehold.checkpoint.requests")


class NoRunningAttemptError(StateholdError):
    """No attempt of the job is running to act on a request."""


class RequestTimeoutError(StateholdError):
    """No answer came within the requester's timeout."""


# -- the requester's side ----------------------------------------------------------------------
def submit(
    storage: Storage,
    ha: HAStore,
    job_id: str,
    action: Action,
    savepoint: str | None = None,
) -> OperatorRequest:
    """Write a request for the running attempt of the job in `storage`; raises
    NoRunningAttemptError (one line) when there is none, and CheckpointError-like
    StateholdErrors for a savepoint name that is bad or already taken."""
    if savepoint is not None:
        key = layout.savepoint_metadata_key(savepoint)  # refuses a bad name
        if storage.exists(key):
            raise StateholdError(f"savepoint {savepoint!r} already exists in {storage.uri}")
    epoch = ha.read().epoch
    lease = read_lease(storage, epoch)
    now = clock.now()
    if lease is None or not lease.alive(now):
        seen = (
            "it has no lease" if lease is None
            else f"its lease expired {now - lease.renewed_at - lease.ttl:.0f}s ago"
        )
        raise NoRunningAttemptError(
            f"no running driver for {storage.uri}: attempt {epoch} is not running ({seen})"
        )
    request = OperatorRequest(
        id=fmt.new_request_id(now), job_id=job_id, epoch=epoch, action=action,
        savepoint=savepoint, requested_at=now, requested_by=_who(),
    )
    key, data = fmt.request_key(request.id), fmt.encode_request(request)
    storage.create_if_absent(key, data)
    return fmt.decode_request(data, key)  # as the driver reads it (with its checksum)


def read_answer(storage: Storage, request_id: str) -> RequestAnswer | None:
    key = fmt.answer_key(request_id)
    try:
        data = storage.read(key)
    except NotFoundError:
        return None
    return fmt.decode_answer(data, f"{storage.uri.rstrip('/')}/{key}")


def wait(
    storage: Storage, request: OperatorRequest, timeout: float, poll: float = 0.2
) -> RequestAnswer | None:
    """The request's final answer, or its last (``accepted``, or None) after `timeout`."""
    deadline = clock.monotonic() + timeout
    while True:
        answer = read_answer(storage, request.id)
        if (answer is not None and answer.outcome.final) or clock.monotonic() >= deadline:
            return answer
        clock.sleep(min(poll, max(0.0, deadline - clock.monotonic())))


def withdraw(storage: Storage, request: OperatorRequest) -> RequestAnswer:
    """Give up on `request`: answer it ``withdrawn`` unless an attempt answered first
    (then that answer is returned and the request left to the attempt); a withdrawn
    request and its answer are removed at once."""
    answer = RequestAnswer(
        id=request.id, outcome=Outcome.WITHDRAWN, epoch=request.epoch,
        message="the requester gave up waiting", at=clock.now(),
    )
    try:
        storage.create_if_absent(fmt.answer_key(request.id), fmt.encode_answer(answer))
    except AlreadyExistsError:
        earlier = read_answer(storage, request.id)
        if earlier is not None:
            if earlier.outcome.final:
                collect(storage, request.id)
            return earlier
    collect(storage, request.id)
    return answer


def collect(storage: Storage, request_id: str) -> None:
    """Remove a request and its final answer once the requester has read it."""
    listing = storage.list(fmt.REQUESTS_DIR + "/")
    storage.delete_many(requests_to_remove(listing, collected=[request_id]))


def _who() -> str:
    try:
        return f"{getpass.getuser()}@{socket.gethostname()}"[:200]
    except (KeyError, OSError):  # no user name in a container: not worth failing over
        return socket.gethostname()[:200]


# -- the driver's side ----------------------------------------------------------------------------
@dataclass
class Inbox:
    """The running attempt's requests: `poll` once per batch boundary, `accept`, then
    `answer`. Writes are fenced: `guard` (the attempt's epoch check) passes before each,
    and the answer is created only once. Removals go to `discard` (the coordinator's
    cleaner, which asks the deletion policy again)."""

    storage: Storage
    epoch: int
    guard: Callable[[], None]
    discard: Callable[[Discard], None]
    #: Requests this attempt accepted (answered by it, or being acted on).
    _taken: set[str] = field(default_factory=set)

    def poll(self) -> list[OperatorRequest]:
        """This attempt's unanswered requests, oldest first: one listing per call (and a
        read per new request). A request for an older epoch is refused (its attempt is
        gone); answers nobody collected go after `cleanup.policy.ANSWER_KEEP_SECONDS`."""
        listing = list(self.storage.list(fmt.REQUESTS_DIR + "/"))
        if not listing:
            return []
        answered = {fmt.request_id_of(i.key) for i in listing if fmt.is_answer(i.key)}
        mine: list[OperatorRequest] = []
        for info in listing:
            request_id = fmt.request_id_of(info.key)
            if not fmt.is_request(info.key) or request_id in self._taken:
                continue
            request = self._read(info.key)
            if request is None or request.epoch > self.epoch:
                continue  # a newer attempt's: this one is fenced and will learn so
            if request.id in answered:
                self._settle(request)
            elif request.epoch == self.epoch:
                mine.append(request)
            else:
                self._refuse(request)
        old = requests_to_remove(listing)
        if old:
            self.discard(Discard(keys=tuple(old), reason="request answers kept long enough"))
        return sorted(mine, key=lambda r: r.id)

    def accept(self, request: OperatorRequest) -> bool:
        """Take `request`: False if its requester withdrew it (or it was answered)."""
        self.guard()
        answer = RequestAnswer(
            id=request.id, outcome=Outcome.ACCEPTED, epoch=self.epoch,
            message=f"attempt {self.epoch} is at it", at=clock.now(),
        )
        try:
            self.storage.create_if_absent(
                fmt.answer_key(request.id), fmt.encode_answer(answer)
            )
        except AlreadyExistsError:
            return False
        self._taken.add(request.id)
        log.info("request %s: %s accepted by attempt %d", request.id, request.action,
                 self.epoch)
        return True

    def answer(
        self,
        request: OperatorRequest,
        outcome: Outcome,
        message: str,
        *,
        savepoint_key: str | None = None,
        checkpoint_id: int | None = None,
    ) -> None:
        """Replace this attempt's ``accepted`` answer with the outcome (fenced), then
        remove the request document (the answer says it all)."""
        self.guard()
        answer = RequestAnswer(
            id=request.id, outcome=outcome, epoch=self.epoch, message=message[:1000],
            savepoint_key=savepoint_key, checkpoint_id=checkpoint_id, at=clock.now(),
        )
        self.storage.write(fmt.answer_key(request.id), fmt.encode_answer(answer))
        log.info("request %s: %s %s: %s", request.id, request.action, outcome, message)
        self._remove_request(request.id)

    # -- internals ---------------------------------------------------------------------------
    def _read(self, key: str) -> OperatorRequest | None:
        try:
            return fmt.decode_request(self.storage.read(key), key)
        except NotFoundError:
            return None  # withdrawn meanwhile
        except fmt.RequestError as e:
            log.warning("ignoring an unreadable request: %s", e)
            return None

    def _settle(self, request: OperatorRequest) -> None:
        """An answered request whose document is still there: removed once its answer is
        final; taken by an older attempt that died before answering: failed."""
        earlier = read_answer(self.storage, request.id)
        if earlier is None:
            return
        if earlier.outcome.final:
            self._remove_request(request.id)
        elif request.epoch < self.epoch:
            self._refuse(request, taken=True)
        else:
            self._taken.add(request.id)  # this attempt's own, being acted on

    def _refuse(self, request: OperatorRequest, *, taken: bool = False) -> None:
        """A request for attempt `request.epoch`, which is gone: refuse it (or, when that
        attempt took it and died before answering, fail it); never act on it."""
        self.guard()
        message = (
            f"attempt {request.epoch} took it and ended before answering; attempt "
            f"{self.epoch} does not act on it" if taken else
            f"it was for attempt {request.epoch}, which is gone; attempt {self.epoch} "
            "does not act on it"
        )
        answer = RequestAnswer(
            id=request.id, outcome=Outcome.FAILED if taken else Outcome.REFUSED,
            epoch=self.epoch, message=message, at=clock.now(),
        )
        data = fmt.encode_answer(answer)
        try:
            if taken:
                self.storage.write(fmt.answer_key(request.id), data)
            else:
                self.storage.create_if_absent(fmt.answer_key(request.id), data)
        except AlreadyExistsError:
            return  # its requester withdrew it meanwhile
        log.warning("request %s (%s for attempt %d) %s: %s", request.id, request.action,
                    request.epoch, answer.outcome, message)
        self._remove_request(request.id)

    def _remove_request(self, request_id: str) -> None:
        keys = requests_to_remove(
            [FileInfo(fmt.request_key(request_id), 0, clock.now())], answered=[request_id]
        )
        if keys:
            self.discard(Discard(keys=tuple(keys), reason=f"request {request_id} answered"))


def pending(storage: Storage) -> Iterable[OperatorRequest]:
    """The requests in the job directory not yet answered (for `statehold status`)."""
    listing = list(storage.list(fmt.REQUESTS_DIR + "/"))
    answered = {fmt.request_id_of(i.key) for i in listing if fmt.is_answer(i.key)}
    for info in listing:
        if fmt.is_request(info.key) and fmt.request_id_of(info.key) not in answered:
            try:
                yield fmt.decode_request(storage.read(info.key), info.key)
            except (NotFoundError, fmt.RequestError):
                continue
