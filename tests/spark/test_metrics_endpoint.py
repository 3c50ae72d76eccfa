"""Where the driver's Prometheus endpoint listens, without Spark: 127.0.0.1 unless told
another address (`JobMetrics`, and `StatefulJob(metrics_host=...)` handing it on).

Besides the bound socket's own address, the tests connect: on Linux all of 127.0.0.0/8 is
loopback, so an endpoint bound to every interface answers on 127.0.0.2 and one bound to
127.0.0.1 refuses it."""

from __future__ import annotations

import socket
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from statehold.spark import StatefulJob
from statehold.spark.metrics import JobMetrics

OTHER_LOOPBACK = "127.0.0.2"
ON_LINUX = sys.platform == "linux"
#: A sample every fresh endpoint serves.
SAMPLE = 'statehold_seconds_since_last_checkpoint{job="m"} -1.0'


def scrape(host: str, port: int) -> str:
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=30) as response:
        return response.read().decode()


def answers(host: str, port: int) -> bool:
    """Whether a TCP connection to host:port is accepted."""
    try:
        with socket.create_connection((host, port), timeout=30):
            return True
    except ConnectionRefusedError:
        return False


def test_the_endpoint_listens_on_127_0_0_1_by_default() -> None:
    metrics = JobMetrics("m", 0)
    try:
        assert metrics.address == ("127.0.0.1", metrics.port)
        assert SAMPLE in scrape("127.0.0.1", metrics.port)
        if ON_LINUX:
            assert not answers(OTHER_LOOPBACK, metrics.port)
    finally:
        metrics.close()


def test_the_endpoint_listens_where_it_is_told() -> None:
    metrics = JobMetrics("m", 0, host="0.0.0.0")
    try:
        assert metrics.address == ("0.0.0.0", metrics.port)
        assert SAMPLE in scrape("127.0.0.1", metrics.port)
        if ON_LINUX:
            assert SAMPLE in scrape(OTHER_LOOPBACK, metrics.port)
    finally:
        metrics.close()


@pytest.mark.parametrize("told", [None, "0.0.0.0"])
def test_stateful_job_hands_metrics_host_on(tmp_path: Path, told: str | None) -> None:
    """`StatefulJob` asks its session only for a default parallelism, so with one given
    it is built here without Spark; it starts its endpoint in the constructor."""
    no_session: Any = None
    options = {} if told is None else {"metrics_host": told}
    job = StatefulJob(no_session, str(tmp_path / "ckpt"), "m", parallelism=1, metrics_port=0,
                      **options)
    try:
        assert job.metrics is not None
        assert job.metrics.address == (told or "127.0.0.1", job.metrics.port)
    finally:
        job.close()
