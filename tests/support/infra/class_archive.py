"""Spark's classes archived once (the JDK's class data sharing), for the Spark JVMs the
tests start in subprocesses: the drivers (the example, the kill -9 drivers, the benchmark's
smoke run) and the executors of ``local-cluster`` and of the standalone cluster.

Such a JVM runs a few batches and exits, and loading and verifying Spark's classes from its
jars is a large part of its CPU. An archive made by one run with
``-XX:ArchiveClassesAtExit`` holds those classes loaded and verified; every later JVM with
the same class path maps it instead. The example's run took 30 s of CPU instead of 38, and
24 s of wall time instead of 31 (three runs each, quiet machine, 2026-11-29).

The archive is made by running the example once (about 45 s), into the provision cache,
one per PySpark, Java and JVM flags (its file name says which). A JVM whose class path
does not match the archive's (a ``SPARK_CONF_DIR`` holding files, for one: the JDK refuses
a class path directory that is not empty) runs without it, quietly: the archive only ever
saves time.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

#: The JVM flags of every driver a test starts in a subprocess and of every executor JVM.
#: Such a JVM runs a few batches and exits, and most of its CPU is the JIT compiling Spark:
#: with C1 alone and the serial collector the example's four batches took 39-41 s of CPU
#: instead of 63 (31 s of wall time instead of 37, three runs each, 2026-11-29). The shared
#: session runs for the whole suite and is started without them: C2's code is faster for
#: its hundreds of queries (C1 only made its tests 17% slower).
SUBPROCESS_JVM_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
#: A JVM that cannot use the archive says so on standard output, where a driver's output
#: is read: those lines are turned off (the JVM then just runs without it).
QUIET = "-Xlog:cds=off,cds+dynamic=off"
TRAINING_TIMEOUT = 600.0

Say = Callable[[str], None]


def _pyspark_home() -> Path | None:
    try:
        import pyspark
    except ImportError:
        return None
    return Path(pyspark.__file__).resolve().parent


def archive_path() -> Path | None:
    """Where this PySpark's and this Java's archive lives (None without either)."""
    from tests.support.infra.provision import cache_root

    home, java = _pyspark_home(), shutil.which("java")
    if home is None or java is None:
        return None
    import pyspark

    key = "\n".join((str(home), str(Path(java).resolve()), SUBPROCESS_JVM_OPTS))
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return cache_root() / "jvm-classes" / f"pyspark-{pyspark.__version__}-{digest}.jsa"


def jvm_opts() -> str:
    """The flags of the JVMs the tests start: the archive's too once it is made."""
    path = archive_path()
    if path is None or not path.exists():
        return SUBPROCESS_JVM_OPTS
    return f"{SUBPROCESS_JVM_OPTS} -XX:SharedArchiveFile={path} {QUIET}"


def _failed(path: Path) -> Path:
    """Written when a training run made no archive: the next test processes on this
    cache do not try again (each try costs a run of the example)."""
    return path.with_name(f"{path.name}.failed")


def present() -> bool:
    """Made, or tried once and failed (the tests run without it)."""
    path = archive_path()
    return path is not None and (path.exists() or _failed(path).exists())


def make(say: Say) -> str | None:
    """Run the example once with ``-XX:ArchiveClassesAtExit`` unless the archive is
    there; None when done, else why not (the tests then run without it)."""
    path = archive_path()
    if path is None:
        return "needs pyspark and java"
    if path.exists() or _failed(path).exists():
        return None
    say(f"provision: archiving Spark's classes (one run of the example) into {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{os.getpid()}")
    src = Path(__file__).resolve().parents[3] / "src"
    with tempfile.TemporaryDirectory(prefix="statehold-class-archive-") as run:
        env = {k: v for k, v in os.environ.items() if k != "SPARK_CONF_DIR"}
        env.update(
            PYSPARK_PYTHON=sys.executable,
            PYSPARK_DRIVER_PYTHON=sys.executable,
            PYTHONPATH=os.pathsep.join([str(src), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            STATEHOLD_LOCAL_DIR=str(Path(run) / "task-state"),
            SPARK_SUBMIT_OPTS=f"{SUBPROCESS_JVM_OPTS} -XX:ArchiveClassesAtExit={staging}",
        )
        try:
            done = subprocess.run(
                [sys.executable, "-m", "statehold.examples.running_totals"], cwd=run, env=env,
                capture_output=True, text=True, timeout=TRAINING_TIMEOUT,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            staging.unlink(missing_ok=True)
            why = f"the example did not end within {TRAINING_TIMEOUT:.0f} s"
            _failed(path).write_text(why)
            return why
    # The classes it loaded are archived when its JVM exits, even if the example failed.
    if not staging.exists() or staging.stat().st_size == 0:
        staging.unlink(missing_ok=True)
        why = f"no archive written (exit {done.returncode}): {(done.stdout + done.stderr)[-800:]}"
        _failed(path).write_text(why)
        return why
    staging.rename(path)
    return None
