"""statehold's S3 storage (obstore) against the moto server through a fault-injecting
proxy: bursts of 5xx, connection resets, uploads cut or stalled part-way, latency and a
bandwidth limit. Each operation either succeeds with the exact bytes (the client retries
what failed) or fails with one StorageError line within a bound; it never hangs and never
leaves a partial object behind (a PUT lands whole or not at all)."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pytest

from statehold.storage import AlreadyExistsError, Storage, StorageError, open_storage
from statehold.storage.base import ConflictError
from tests.support.fault_injection_proxy import CutAction, FaultProxy
from tests.support.hang_detector import bounded
from tests.support.infra.object_store_servers import S3Server

#: The client's per-request timeout in these tests: a stalled request fails after this
#: and is retried (statehold's default is 15 minutes, for large state files).
REQUEST_TIMEOUT = timedelta(seconds=3)
#: Hang detector: no operation under a fault may take longer (it is not a timing check:
#: the client's retries end well inside it).
BOUND = 120.0



@pytest.fixture
def storage(s3_server: S3Server, s3_proxy: FaultProxy, request: pytest.FixtureRequest) -> Storage:
    prefix = f"faults/{request.node.name}-{os.urandom(4).hex()}"
    options = {**s3_server.options, "endpoint": s3_proxy.endpoint, "timeout": REQUEST_TIMEOUT}
    return open_storage(f"s3://{s3_server.bucket}/{prefix}", **options)


def keys(storage: Storage) -> list[str]:
    return sorted(info.key for info in storage.list())


@pytest.mark.parametrize("status", [503, 500])
def test_a_burst_of_5xx_is_retried_and_every_call_succeeds(
    storage: Storage, s3_proxy: FaultProxy, status: int
) -> None:
    storage.write("a", b"one")
    for call in (
        lambda: storage.write("b", b"two"),
        lambda: storage.create_if_absent("c", b"three"),
        lambda: storage.read("a"),
        lambda: keys(storage),
    ):
        s3_proxy.fail_requests(3, status)
        bounded(call, BOUND, "a call under a 5xx burst")
    data, version = storage.read_versioned("a")
    s3_proxy.fail_requests(3, status)
    bounded(lambda: storage.replace_if_version("a", version, b"ONE"), BOUND, "conditional put")
    assert s3_proxy.counts[f"status_{status}"] == 15  # every injected answer was seen
    assert (storage.read("a"), storage.read("b"), storage.read("c")) == (b"ONE", b"two", b"three")
    assert keys(storage) == ["a", "b", "c"]


def test_a_5xx_that_does_not_end_fails_in_one_line_then_the_store_works(
    storage: Storage, s3_proxy: FaultProxy
) -> None:
    s3_proxy.fail_requests(10_000)
    with pytest.raises(StorageError) as caught:
        bounded(lambda: storage.write("x", b"data"), BOUND, "a write under endless 503s")
    message = str(caught.value)
    assert "\n" not in message and "503" in message and "x" in message, message
    s3_proxy.heal()
    assert keys(storage) == []  # nothing half-written
    storage.write("x", b"data")
    assert storage.read("x") == b"data"


def test_connection_resets_are_retried(storage: Storage, s3_proxy: FaultProxy) -> None:
    s3_proxy.reset_requests(3)
    bounded(lambda: storage.write("a", b"payload"), BOUND, "a write through resets")
    s3_proxy.reset_requests(2)
    assert bounded(lambda: storage.read("a"), BOUND, "a read through resets") == b"payload"
    assert s3_proxy.counts["reset"] == 5


@pytest.mark.parametrize("action", ["close", "reset", "stall"])
def test_an_upload_cut_part_way_is_retried_whole_and_nothing_partial_is_left(
    storage: Storage, s3_proxy: FaultProxy, tmp_path: Path, action: CutAction
) -> None:
    data = os.urandom(400_000)
    local = tmp_path / "state.sst"
    local.write_bytes(data)
    s3_proxy.cut_upload(after_bytes=100_000, action=action, min_body=200_000)
    bounded(lambda: storage.upload(local, "shared/state.sst"), BOUND, f"an upload cut ({action})")
    assert s3_proxy.counts[f"cut_{action}"] == 1
    assert storage.read("shared/state.sst") == data
    assert keys(storage) == ["shared/state.sst"]


def test_latency_and_a_bandwidth_limit_slow_calls_but_change_nothing(
    storage: Storage, s3_proxy: FaultProxy
) -> None:
    data = os.urandom(300_000)
    s3_proxy.set_latency(0.05)
    s3_proxy.set_bandwidth(1_000_000)
    bounded(lambda: storage.write("big", data), BOUND, "a slow write")
    assert bounded(lambda: storage.read("big"), BOUND, "a slow read") == data
    assert keys(storage) == ["big"]
    assert s3_proxy.counts["requests"] >= 3


def chunked_put(s3_proxy: FaultProxy, path: str, pieces: list[bytes]) -> int:
    """PUT `pieces` through the proxy as a ``Transfer-Encoding: chunked`` body (as Hadoop's
    s3a sends some uploads); the response's status."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", s3_proxy.port, timeout=30)
    try:
        conn.request("PUT", path, body=iter(pieces), encode_chunked=True,
                     headers={"Transfer-Encoding": "chunked"})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def test_a_chunked_request_body_is_relayed_whole_or_cut(
    storage: Storage, s3_proxy: FaultProxy
) -> None:
    base = "/" + storage.uri.removeprefix("s3://")  # path-style: /bucket/prefix
    pieces = [os.urandom(n) for n in (70_000, 1, 50_000, 3)]
    assert bounded(lambda: chunked_put(s3_proxy, f"{base}/whole", pieces), BOUND,
                   "a chunked PUT") == 200
    assert storage.read("whole") == b"".join(pieces)
    # a cut counts the framed bytes: the body stops inside its second chunk, the PUT fails
    s3_proxy.cut_upload(after_bytes=70_100, action="close", min_body=1)
    with pytest.raises(OSError):  # the connection closed under the request
        bounded(lambda: chunked_put(s3_proxy, f"{base}/cut", pieces), BOUND, "a cut chunked PUT")
    assert s3_proxy.counts["cut_close"] == 1
    assert keys(storage) == ["whole"]  # nothing partial landed


@pytest.mark.parametrize("fault", ["reset", "lost response"])
def test_a_create_if_absent_whose_connection_broke_is_tried_again(
    storage: Storage, s3_proxy: FaultProxy, fault: str
) -> None:
    """A conditional create is not idempotent, so the client does not send it again on
    its own once it may have been sent; statehold does, and if the earlier try landed
    (its answer lost), the object with exactly these bytes is the create's success."""
    seen = 0
    for key, times in (("a", 1), ("b", 5)):  # five in a row (a chaos run met four)
        if fault == "reset":
            s3_proxy.reset_requests(times)
        else:
            s3_proxy.lose_responses(1)
            times = 1
        bounded(lambda key=key: storage.create_if_absent(key, b"doc"), BOUND,
                f"a create under a {fault}")
        seen += times
        assert s3_proxy.counts["reset" if fault == "reset" else "lost_response"] == seen
    assert keys(storage) == ["a", "b"]
    assert storage.read("a") == storage.read("b") == b"doc"
    # ... and another writer's object is still refused, after a lost answer too
    s3_proxy.lose_responses(1)
    with pytest.raises(AlreadyExistsError):
        bounded(lambda: storage.create_if_absent("a", b"other"), BOUND, "a create of a taken key")
    assert storage.read("a") == b"doc"


@pytest.mark.parametrize("fault", ["reset", "lost response"])
def test_a_replace_if_version_whose_connection_broke_is_tried_again(
    storage: Storage, s3_proxy: FaultProxy, fault: str
) -> None:
    """The same for a conditional replace (the embedded HA store's head, a `_metadata`
    rewritten by a restore): sent again after a break in transit; if the earlier try
    landed, the server's refusal of the resend (the version moved) is the write's own
    success when the object holds exactly its bytes."""
    storage.create_if_absent("head", b"v0")
    _, stale = storage.read_versioned("head")
    seen = 0
    for n, times in ((1, 1), (2, 5)):
        _, version = storage.read_versioned("head")
        if fault == "reset":
            s3_proxy.reset_requests(times)
        else:
            s3_proxy.lose_responses(1)
            times = 1
        bounded(lambda n=n, version=version: storage.replace_if_version(
            "head", version, f"v{n}".encode()), BOUND, f"a replace under a {fault}")
        seen += times
        assert s3_proxy.counts["reset" if fault == "reset" else "lost_response"] == seen
    assert storage.read("head") == b"v2"
    # ... and a write on a version that moved is still refused, after a lost answer too
    s3_proxy.lose_responses(1)
    with pytest.raises(ConflictError):
        bounded(lambda: storage.replace_if_version("head", stale, b"other"), BOUND,
                "a replace on a stale version")
    assert storage.read("head") == b"v2"
