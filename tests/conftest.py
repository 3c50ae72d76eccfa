"""Shared fixtures: a real S3 protocol server (moto) on 127.0.0.1, and storage roots on
both backends so every storage-touching test runs on local disk and on S3 (the storage
contract runs on Azure (Azurite) and GCS (fake-gcs-server) too). Before the tests run,
`pytest_collection_finish` provisions what the collected tests need
(tests/support/infra/provision.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest
from hypothesis import settings

from statehold.storage import Storage
from tests.support.cluster import StandaloneCluster, standalone_cluster
from tests.support.fault_injection_proxy import FaultProxy
from tests.support.infra.object_store_servers import (
    S3Server,
    azurite_server,
    azurite_tls_server,
    gcs_server,
    s3_server,
)
from tests.support.jobs import stop_leases
from tests.support.kafka import kafka_broker
from tests.support.spark_session import spark, use_subprocess_jvm_opts
from tests.support.storage_roots import StorageFactory, storage_factory_for
from tests.support.zk import ZooKeeperServer, zk_server

# Session fixtures, for every test module, defined here once: a session fixture imported
# into several test modules is a new definition in each, so each module would start its
# own server (and keep it until the session ends).
__all__ = ["azurite_server", "azurite_tls_server", "gcs_server", "kafka_broker", "s3_server",
           "spark", "zk_server"]

# Property tests check results, never speed: a machine busy with Spark and servers must not
# turn a slow example into a failure (Hypothesis' default deadline is 200 ms per example).
settings.register_profile("statehold", deadline=None)
settings.load_profile("statehold")

use_subprocess_jvm_opts()


def _byte_compile_the_tree() -> None:
    """Write the bytecode of src/ and tests/ once, before any test starts a process.

    With ``PYTHONDONTWRITEBYTECODE`` set (as on the machines CI runs on), every process the
    tests start (drivers, Spark's Python workers, the CLI) would compile statehold's
    modules again from source: about half a second of CPU each, hundreds of times. Reading
    cached bytecode is not turned off by that variable, and compileall writes it anyway;
    files already compiled are skipped, so a second call costs a listing."""
    import compileall

    from tests.support.paths import ROOT, SRC

    for folder in (SRC, ROOT / "tests"):
        compileall.compile_dir(str(folder), quiet=2)


_byte_compile_the_tree()


@pytest.fixture(scope="session")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """A standalone Spark master with two workers (tests/support/cluster.py), started when
    a test first asks for it and shared by the executor-loss tests (a start takes seconds;
    the executors they kill are relaunched by the workers for the next application)."""
    from tests.support.infra import provision

    provision.require("java")
    with standalone_cluster(tmp_path_factory.mktemp("standalone")) as cluster:
        yield cluster


@pytest.fixture
def s3_proxy(s3_server: S3Server) -> Iterator[FaultProxy]:
    """A fault-injecting proxy (http mode) in front of the moto server: `.endpoint`."""
    target = urlparse(s3_server.endpoint)
    with FaultProxy((target.hostname or "127.0.0.1", target.port or 80), "http") as proxy:
        yield proxy


@pytest.fixture
def zk_proxy(zk_server: ZooKeeperServer) -> Iterator[FaultProxy]:
    """A fault-injecting proxy (tcp mode) in front of ZooKeeper: `.hosts`."""
    with FaultProxy((zk_server.host, zk_server.port), "tcp") as proxy:
        yield proxy


@pytest.fixture(params=["local", "s3"])
def storage_factory(request: pytest.FixtureRequest, tmp_path: Path) -> StorageFactory:
    """Makes fresh, empty storage roots on the parametrized backend."""
    return storage_factory_for(request, tmp_path, request.param)


@pytest.fixture
def storage(storage_factory: StorageFactory) -> Storage:
    """A fresh, empty storage root (a job directory), on local disk and on S3."""
    return storage_factory()


# -- provisioning (tests/support/infra/provision.py) -----------------------------------------------
#: Fixture names, and what the tests that use them need installed.
FIXTURE_NEEDS = {
    "spark": ("java", "spark-classes"),
    "connect_server": ("java",),
    "zk_server": ("zookeeper",),
    "azurite_server": ("azurite",),
    "azurite_tls_server": ("azurite",),
    "kafka_broker": ("kafka-broker", "spark-kafka"),
    "standalone": ("java",),
}
#: Test modules (name prefixes), and what they need beyond their fixtures.
MODULE_NEEDS = {
    # Their storage backends take servers by name at run time (`getfixturevalue`).
    "test_storage_contract": ("azurite",),
    "test_object_stores": ("azurite",),
    "test_kafka": ("kafka-broker", "spark-kafka", "hadoop-aws"),
    "test_s3a": ("hadoop-aws",),
    # its driver process is the only Spark it starts (no `spark` fixture)
    "test_spark_s3a": ("java", "spark-classes", "hadoop-aws"),
    "test_abfs_checkpoint": ("hadoop-azure",),
    "test_webview": ("chromium",),
    "test_spark_webview": ("chromium",),
}


def needed_components(items: list[pytest.Item]) -> list[str]:
    """What the collected tests need (everything under CI or STATEHOLD_PROVISION=all)."""
    from tests.support.infra import provision

    if os.environ.get("CI") == "true" or os.environ.get("STATEHOLD_PROVISION") == "all":
        return list(provision.ALL)
    needed: dict[str, None] = {}
    for item in items:
        for name in getattr(item, "fixturenames", ()):
            for component in FIXTURE_NEEDS.get(name, ()):
                needed[component] = None
        module = item.nodeid.rsplit("/", 1)[-1]
        for prefix, components in MODULE_NEEDS.items():
            if module.startswith(prefix):
                needed.update(dict.fromkeys(components))
    return list(needed)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Install what the collected tests need, once per session (a file lock keeps
    parallel runs from racing); STATEHOLD_PROVISION=0 turns it off."""
    if os.environ.get("STATEHOLD_PROVISION") == "0" or session.config.option.collectonly:
        return
    from tests.support.infra import provision

    reporter = session.config.pluginmanager.get_plugin("terminalreporter")

    def say(line: str) -> None:
        if reporter is not None:
            reporter.write_line(line)
        else:
            print(line, flush=True)

    provision.provision(needed_components(session.items), say)
    use_subprocess_jvm_opts()  # with the class archive, if provisioning just made it


@pytest.fixture(autouse=True)
def _no_lease_renewed_after_its_test() -> Iterator[None]:
    """A job `build_job` made stops renewing its lease when its test ends."""
    yield
    stop_leases()
