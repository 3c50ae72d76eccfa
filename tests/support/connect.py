"""The Spark Connect server fixture (tests/support/infra/connect_server.py) and the client
runs (tests/support/connect_client.py) of the Connect tests: import the fixture into a
test module with ``from tests.support.connect import connect_server  # noqa: F401``."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.infra.connect_server import ConnectServer, connect_jar
from tests.support.paths import ROOT, SRC, python_path

CLIENT_TIMEOUT = 600


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    """A Spark Connect server from the installed PySpark's jars, for the whole session
    (a test may kill and restart it: `url` is the running one's)."""
    from tests.support.infra import provision

    provision.require("java")
    if connect_jar() is None:
        pytest.skip("this PySpark ships no Spark Connect server (PySpark 4 does)")
    server = ConnectServer(tmp_path_factory.mktemp("connect-server"))
    server.start()
    yield server
    server.stop()


def client_env() -> dict[str, str]:
    import os

    return {**os.environ, "PYTHONPATH": python_path([SRC, ROOT])}


def client_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "tests.support.connect_client", *args]


def run_client(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """One client run to its end; fails the test with its output if it fails."""
    done = subprocess.run(client_cmd(*args), cwd=cwd, env=client_env(), capture_output=True,
                          text=True, timeout=CLIENT_TIMEOUT, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        pytest.fail(f"client {args[0]} exited {done.returncode}:\n{done.stdout[-3000:]}\n"
                    f"{done.stderr[-6000:]}")
    return done


def run_api(cwd: Path, server: ConnectServer, root: Path) -> dict[str, Any]:
    result = cwd / "api.json"
    run_client(cwd, "api", server.url, str(root), str(result))
    loaded: dict[str, Any] = json.loads(result.read_text())
    return loaded
