"""A Spark standalone cluster on 127.0.0.1 for tests: one master and two single-core
workers, started with the ``sbin/spark-daemon.sh`` that the PySpark package ships.

The pip package has no ``start-master.sh``/``start-worker.sh`` (only ``spark-config.sh``,
``spark-daemon.sh`` and the history/connect servers), but those scripts only call
``spark-daemon.sh start <class> <instance> <args>``, which is what this does. SPARK_HOME is
the package directory (it has ``bin/``, ``jars/`` and ``sbin/``). Ports are free ones;
logs, pid files, work and local directories live in a temp directory; each worker has its
own ``SPARK_LOCAL_DIRS`` (its executors' scratch disk, as on separate machines). Stopped,
and any executor still running killed by its pid, at teardown. No ``SPARK_CONF_DIR`` is
set: the package's ``conf/`` (there is none) stays first on the executors' class path, as
on the drivers', so the executors map Spark's archived classes
(tests/support/infra/class_archive.py) when their driver asks for it.

Also: finding the executor JVM that runs a given Python worker, to kill it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.infra.server import free_port

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
EXECUTOR_CLASS = "CoarseGrainedExecutorBackend"
START_TIMEOUT = 180.0


def spark_home() -> Path:
    """The PySpark package directory, which is a SPARK_HOME (bin/, jars/, sbin/)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and parent_of(int(entry.name)) == pid:
            found.append(int(entry.name))
    return found


def executor_of(python_worker_pid: int) -> int:
    """The executor JVM (``CoarseGrainedExecutorBackend``) a Python worker runs under:
    the nearest such ancestor (worker -> PySpark daemon -> executor JVM)."""
    pid: int | None = python_worker_pid
    while pid and pid > 1:
        if EXECUTOR_CLASS in cmdline(pid):
            return pid
        pid = parent_of(pid)
    raise LookupError(f"process {python_worker_pid} does not run under a Spark executor")


def alive(pid: int) -> bool:
    """Running (not gone, not a zombie awaiting its parent)."""
    try:
        os.kill(pid, 0)
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (ProcessLookupError, OSError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@dataclass
class StandaloneCluster:
    base: Path
    master_port: int
    ui_port: int
    workers: int = 2
    daemons: list[tuple[str, int, dict[str, str]]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    def _env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPARK_")}
        return {
            **env,
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOG_DIR": str(self.base / "logs"),
            "SPARK_PID_DIR": str(self.base / "pids"),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_IDENT_STRING": f"statehold-{os.getpid()}-{self.master_port}",
            **(extra or {}),
        }

    def _daemon(self, action: str, cls: str, instance: int, env: dict[str, str],
                *args: str) -> None:
        script = spark_home() / "sbin" / "spark-daemon.sh"
        subprocess.run(["bash", str(script), action, cls, str(instance), *args], env=env,
                       check=action == "start", capture_output=True, timeout=120)

    def start(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        env = self._env()
        self._daemon("start", MASTER_CLASS, 1, env, "--host", "127.0.0.1", "--port",
                     str(self.master_port), "--webui-port", str(self.ui_port))
        self.daemons.append((MASTER_CLASS, 1, env))
        for i in range(1, self.workers + 1):
            local = self.base / f"worker-{i}" / "local"
            local.mkdir(parents=True)
            wenv = self._env({"SPARK_LOCAL_DIRS": str(local)})
            self._daemon("start", WORKER_CLASS, i, wenv, "--host", "127.0.0.1",
                         "--webui-port", str(free_port()), "--cores", "1", "--memory", "1g",
                         "--work-dir", str(self.base / f"worker-{i}" / "work"), self.url)
            self.daemons.append((WORKER_CLASS, i, wenv))
        self.wait_for_workers()

    def state(self) -> dict[str, object]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as r:
            doc: dict[str, object] = json.loads(r.read())
            return doc

    def wait_for_workers(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                if self.state().get("aliveworkers") == self.workers:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                logs = "\n".join(p.read_text()[-2000:] for p in (self.base / "logs").glob("*"))
                raise RuntimeError(f"standalone cluster did not come up:\n{logs}")
            time.sleep(0.5)

    def daemon_pids(self) -> list[int]:
        return [int(p.read_text().strip()) for p in (self.base / "pids").glob("*.pid")]

    def stop(self) -> None:
        """Stop the workers and the master; kill what is left of them and their executors
        (by pid: only processes this cluster started)."""
        pids = self.daemon_pids()
        executors = [c for p in pids for c in children_of(p) if EXECUTOR_CLASS in cmdline(c)]
        for cls, instance, env in reversed(self.daemons):
            self._daemon("stop", cls, instance, env)
        deadline = time.monotonic() + 30
        for pid in [*pids, *executors]:
            while alive(pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


@contextmanager
def standalone_cluster(base: Path, workers: int = 2) -> Iterator[StandaloneCluster]:
    cluster = StandaloneCluster(base, free_port(), free_port(), workers)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
