"""One shared local SparkSession for the whole test run.

Starting Spark costs seconds, so every Spark test shares one session: the `spark` fixture,
registered once in tests/conftest.py (a test asks for it by name).
The session is small on purpose (local[2], few shuffle partitions, no UI) to keep the suite fast.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import pytest

from tests.support.paths import ROOT, module_dirs, python_path

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def make_session(conf: Mapping[str, str] | None = None) -> SparkSession:
    """A local[2] session whose Python workers run this interpreter (so they see the
    editable statehold install and the same pyarrow/rocksdict); `conf`: more settings (the
    class path ones only take effect in a new JVM)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    # Functions defined in test modules and in tests.support are pickled by reference:
    # workers must import them (tests/support/paths.py).
    os.environ["PYTHONPATH"] = python_path([ROOT, *module_dirs()])
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master("local[2]")
        .appName("statehold-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.python.worker.reuse", "true")
    )
    for name, value in (conf or {}).items():
        builder = builder.config(name, value)
    return builder.getOrCreate()


#: The value ``use_subprocess_jvm_opts`` last gave ``SPARK_SUBMIT_OPTS`` (None: the caller's
#: own environment set it, and it is left alone).
_OURS: list[str] = []


def use_subprocess_jvm_opts() -> None:
    """The flags of tests/support/infra/class_archive.py for every Spark started from now
    on, unless the caller's environment sets ``SPARK_SUBMIT_OPTS`` itself: for the drivers
    (``SPARK_SUBMIT_OPTS`` is read by spark-submit, not by servers), and for their
    executors through the drivers' ``spark.executor.extraJavaOptions`` (a system property
    there, so a test's own setting wins). Called at start-up and again once provisioning
    has made the class archive."""
    from tests.support.infra.class_archive import jvm_opts

    current = os.environ.get("SPARK_SUBMIT_OPTS")
    if current is not None and current not in _OURS:
        return
    opts = jvm_opts()
    value = f"{opts} -Dspark.executor.extraJavaOptions='{opts}'"
    os.environ["SPARK_SUBMIT_OPTS"] = value
    _OURS.append(value)


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    from tests.support.infra import provision

    provision.require("java")  # skips, naming the install command, where it is missing
    ours = os.environ.get("SPARK_SUBMIT_OPTS")
    if ours in _OURS:  # the shared session's JVM keeps C2 (class_archive.py says why)
        del os.environ["SPARK_SUBMIT_OPTS"]
    try:
        session = make_session()
    finally:
        if ours in _OURS:
            os.environ["SPARK_SUBMIT_OPTS"] = ours
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
