"""One shared local SparkSession for the whole test run.

Starting Spark costs seconds, so every Spark test shares one session: the `spark` fixture,
registered once in tests/conftest.py (a test asks for it by name).
The session is small on purpose (local[2], few shuffle partitions, no UI) to keep the suite fast.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
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


#: The JVM flags of every driver a test starts in a subprocess (the example, the crash and
#: kill drivers, the benchmark's smoke run) and of every executor JVM (``local-cluster``,
#: the standalone cluster), set by tests/conftest.py. Such a JVM runs a few batches and
#: exits, and most of its CPU is the JIT compiling Spark: with C1 alone and the serial
#: collector the example's four batches took 39-41 s of CPU instead of 63 (31 s of wall
#: time instead of 37, three runs each, 2026-11-29). The suite runs on two workers, so
#: CPU is what its time is made of. The shared session runs for the whole suite and is
#: started without them: C2's code is faster for its hundreds of queries (C1 only made
#: its tests 17% slower).
SUBPROCESS_JVM_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def use_c1_in_subprocess_jvms() -> None:
    """``SPARK_SUBMIT_OPTS`` (read by spark-submit: drivers, not servers) and a
    ``spark-defaults.conf`` with ``spark.executor.extraJavaOptions`` (``SPARK_CONF_DIR``)
    for every Spark started from now on, unless the caller's environment sets its own. A
    test's own ``spark.executor.extraJavaOptions`` still wins over the default."""
    os.environ.setdefault("SPARK_SUBMIT_OPTS", SUBPROCESS_JVM_OPTS)
    if "SPARK_CONF_DIR" not in os.environ:
        conf = Path(tempfile.mkdtemp(prefix="statehold-spark-conf-"))
        atexit.register(shutil.rmtree, conf, ignore_errors=True)
        (conf / "spark-defaults.conf").write_text(
            f"spark.executor.extraJavaOptions {SUBPROCESS_JVM_OPTS}\n"
        )
        os.environ["SPARK_CONF_DIR"] = str(conf)


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    from tests.support.infra import provision

    provision.require("java")  # skips, naming the install command, where it is missing
    ours = os.environ.get("SPARK_SUBMIT_OPTS") == SUBPROCESS_JVM_OPTS
    if ours:  # the shared session's JVM keeps C2 (above)
        del os.environ["SPARK_SUBMIT_OPTS"]
    try:
        session = make_session()
    finally:
        if ours:
            os.environ["SPARK_SUBMIT_OPTS"] = SUBPROCESS_JVM_OPTS
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
