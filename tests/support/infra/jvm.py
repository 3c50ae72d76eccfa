"""JVM artifacts for the tests, fetched with Maven into a cache, never by Spark at test time.

    python -m tests.support.infra.jvm [SET ...]   # pre-fetch (CI); all sets by default

The sets: the Kafka broker (``kafka_2.13`` and its runtime dependencies), Spark's Kafka
source (``spark-sql-kafka-0-10`` for the installed PySpark, with kafka-clients,
commons-pool2 and the token provider), ``hadoop-aws`` for Spark's bundled Hadoop client
(with its AWS SDK bundle) and ``hadoop-azure`` for it (ABFS, with azure-storage and
hadoop-shaded-guava). The Spark sets leave out every jar PySpark already ships
(same artifact name), so no class comes twice.

Maven resolves each set from a generated pom (``dependency:build-classpath``, runtime
scope) into its local repository; the jars are then hard-linked (copied across file
systems) into ``$STATEHOLD_JAR_CACHE/<set>/`` (default ``~/.cache/statehold/jars``), whose
folder name carries every version. A set is complete once its ``MANIFEST`` exists (written
last, after an atomic rename of the folder), so a cached set costs one file read and no
Maven; a lock file per set lets parallel test processes fetch it once.

Spark gets the jars on its class path, never through ``spark.jars`` (which copies each jar
into each executor's work directory: the AWS SDK bundle alone is ~650 MiB; and the class
path is where Hadoop looks for the ``s3a`` file system). The example's ``--jars`` (a user's
way, `statehold.spark.classpath_conf`) sets ``spark.driver.extraClassPath`` and
``spark.executor.extraClassPath``. The drivers the tests start get them appended instead
(`appended_classpath`: ``SPARK_DIST_CLASSPATH``, which Spark's launcher puts last):
``extraClassPath`` comes first, so the class path no longer begins with the one Spark's
classes were archived with (tests/support/infra/class_archive.py) and the JVM runs
without the archive.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

#: The Kafka broker the tests run (KRaft; served by Maven Central with its dependencies).
KAFKA_VERSION = "4.1.1"
#: The log4j 2 the broker brings (its slf4j binding must be the same version).
LOG4J_VERSION = "2.24.3"
#: spark-sql-kafka-0-10 of the installed PySpark, unless the registry lacks it: then the
#: newest served version of the same line (checked with mvn on 2026-11-23: 4.3.0, 3.5.9
#: and 3.5.8 were not served; on 2026-11-27 4.0.1-4.0.5 lacked spark-token-provider-kafka).
SPARK_KAFKA_FALLBACK = {"4.3.0": "4.2.0", "4.0.5": "4.0.0", "3.5.9": "3.5.7", "3.5.8": "3.5.7"}
CACHE_ENV = "STATEHOLD_JAR_CACHE"
MANIFEST = "MANIFEST"
MVN_TIMEOUT = 1800.0


class ArtifactError(RuntimeError):
    """Maven could not provide a set (no `mvn`, no network, or a version not served)."""


@dataclass(frozen=True)
class ArtifactSet:
    """Maven coordinates (``group:artifact:version``) resolved together, with their
    runtime dependencies; `skip_spark_jars` leaves out what PySpark ships."""

    name: str
    coordinates: tuple[str, ...]
    skip_spark_jars: bool = False


# -- what the installed PySpark is ------------------------------------------------------
def spark_jars_dir() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def _shipped_version(prefix: str) -> str:
    pattern = re.compile(rf"^{re.escape(prefix)}-(\d[\w.\-]*)\.jar$")
    for jar in sorted(spark_jars_dir().glob(f"{prefix}-*.jar")):
        match = pattern.match(jar.name)
        if match:
            return match.group(1)
    raise ArtifactError(f"no {prefix}-*.jar in {spark_jars_dir()}")


def spark_version() -> str:
    import pyspark

    return pyspark.__version__


def scala_binary_version() -> str:
    """``2.13`` (or ``2.12`` for PySpark 3.5), from the scala-library jar Spark ships."""
    major, minor, *_ = _shipped_version("scala-library").split(".")
    return f"{major}.{minor}"


def hadoop_version() -> str:
    """The version of Spark's bundled Hadoop client (hadoop-aws must match it exactly)."""
    return _shipped_version("hadoop-client-api")


def _artifact_name(jar: str) -> str:
    """``kafka-clients`` from ``kafka-clients-4.1.1.jar`` (the name without its version)."""
    match = re.match(r"^(.+?)-\d[^-]*(?:-[^-]*)*\.jar$", jar)
    return match.group(1) if match else jar


# -- the sets ---------------------------------------------------------------------------
def kafka_broker() -> ArtifactSet:
    """The broker (``kafka.Kafka``, ``kafka.tools.StorageTool``), the command-line tools
    (topics, console producer and consumer) and a log4j binding for the broker's log."""
    return ArtifactSet(
        f"kafka-broker-{KAFKA_VERSION}",
        (
            f"org.apache.kafka:kafka_2.13:{KAFKA_VERSION}",
            f"org.apache.kafka:kafka-tools:{KAFKA_VERSION}",
            f"org.apache.logging.log4j:log4j-slf4j-impl:{LOG4J_VERSION}",
        ),
    )


def spark_kafka_version() -> str:
    """The spark-sql-kafka version to use: ``$STATEHOLD_SPARK_KAFKA_VERSION``, else the
    installed PySpark's (or its fallback where the registry does not serve it)."""
    installed = spark_version()
    return os.environ.get(
        "STATEHOLD_SPARK_KAFKA_VERSION", SPARK_KAFKA_FALLBACK.get(installed, installed)
    )


def spark_kafka() -> ArtifactSet:
    scala, version = scala_binary_version(), spark_kafka_version()
    return ArtifactSet(
        f"spark-kafka-{scala}-{version}-for-spark-{spark_version()}",
        (f"org.apache.spark:spark-sql-kafka-0-10_{scala}:{version}",),
        skip_spark_jars=True,
    )


def hadoop_aws() -> ArtifactSet:
    version = hadoop_version()
    return ArtifactSet(
        f"hadoop-aws-{version}", (f"org.apache.hadoop:hadoop-aws:{version}",),
        skip_spark_jars=True,
    )


def hadoop_azure() -> ArtifactSet:
    """Hadoop's ABFS connector (``abfs://``, ``abfss://``) for Spark's bundled Hadoop
    client; from 3.4.2 on it can talk to a Blob endpoint (what Azurite serves)."""
    version = hadoop_version()
    return ArtifactSet(
        f"hadoop-azure-{version}", (f"org.apache.hadoop:hadoop-azure:{version}",),
        skip_spark_jars=True,
    )


SETS = {
    "kafka-broker": kafka_broker,
    "spark-kafka": spark_kafka,
    "hadoop-aws": hadoop_aws,
    "hadoop-azure": hadoop_azure,
}


# -- fetching -----------------------------------------------------------------------------
def cache_root() -> Path:
    root = os.environ.get(CACHE_ENV)
    return Path(root) if root else Path.home() / ".cache" / "statehold" / "jars"


def _pom(coordinates: Sequence[str]) -> str:
    deps = []
    for coordinate in coordinates:
        group, artifact, version = coordinate.split(":")
        deps.append(
            f"<dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId>"
            f"<version>{version}</version></dependency>"
        )
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        "<groupId>statehold.tests</groupId><artifactId>jars</artifactId><version>0</version>"
        f"<dependencies>{''.join(deps)}</dependencies></project>\n"
    )


#: Maven Central for every repository a dependency's POM declares: Spark 4.0's POMs name a
#: Google mirror of Central first, which this machine cannot reach, and Maven tries it.
CENTRAL_ONLY_SETTINGS = """<settings><mirrors><mirror>
  <id>central-only</id><mirrorOf>*</mirrorOf><url>https://repo.maven.apache.org/maven2</url>
</mirror></mirrors></settings>
"""


def _resolve(coordinates: Sequence[str], workdir: Path) -> list[Path]:
    """The jars of `coordinates` and their runtime dependencies, in Maven's local repo."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ArtifactError("no `mvn` on the PATH (apt-get install maven)")
    (workdir / "pom.xml").write_text(_pom(coordinates))
    (workdir / "settings.xml").write_text(CENTRAL_ONLY_SETTINGS)
    out = workdir / "classpath.txt"
    done = subprocess.run(
        [mvn, "-B", "-q", "-s", str(workdir / "settings.xml"), "dependency:build-classpath",
         "-Dmdep.includeScope=runtime", f"-Dmdep.outputFile={out}"],
        cwd=workdir, capture_output=True, text=True, timeout=MVN_TIMEOUT,
        stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0 or not out.exists():
        tail = (done.stdout + done.stderr)[-3000:]
        raise ArtifactError(f"mvn could not resolve {', '.join(coordinates)}:\n{tail}")
    return [Path(p) for p in out.read_text().strip().split(os.pathsep) if p]


def _place(source: Path, folder: Path) -> None:
    target = folder / source.name
    try:
        os.link(source, target)
    except OSError:  # another file system (or no hard links): a copy
        shutil.copy2(source, target)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _cached(folder: Path) -> list[Path] | None:
    manifest = folder / MANIFEST
    if not manifest.exists():
        return None
    jars = [folder / name for name in manifest.read_text().split()]
    return jars if all(j.exists() for j in jars) else None


def fetch(artifacts: ArtifactSet) -> list[Path]:
    """The set's jars in the cache, fetched with Maven the first time (under a lock)."""
    root = cache_root()
    folder = root / artifacts.name
    jars = _cached(folder)
    if jars is not None:
        return jars
    with _locked(root / f"{artifacts.name}.lock"):
        jars = _cached(folder)
        if jars is not None:  # another process fetched it while we waited
            return jars
        shipped = (
            {_artifact_name(j.name) for j in spark_jars_dir().glob("*.jar")}
            if artifacts.skip_spark_jars else set()
        )
        staging = Path(tempfile.mkdtemp(prefix=f".{artifacts.name}-", dir=root))
        try:
            names = []
            for jar in _resolve(artifacts.coordinates, staging):
                if jar.suffix == ".jar" and _artifact_name(jar.name) not in shipped:
                    _place(jar, staging)
                    names.append(jar.name)
            for leftover in ("pom.xml", "classpath.txt"):
                (staging / leftover).unlink()
            (staging / MANIFEST).write_text("\n".join(names) + "\n")
            if folder.exists():  # an incomplete earlier attempt (no manifest)
                shutil.rmtree(folder)
            staging.rename(folder)
        finally:
            if staging.exists():
                shutil.rmtree(staging)
    jars = _cached(folder)
    assert jars is not None
    return jars


def classpath(jars: Sequence[Path]) -> str:
    return os.pathsep.join(str(j) for j in jars)


def appended_classpath(jars: Sequence[Path | str]) -> dict[str, str]:
    """The environment putting `jars` last on a Spark JVM's class path, where the class
    archive still applies (for a driver started with it; executors get it through
    ``spark.executorEnv``: tests/support/kafka_runs.jars_appended)."""
    return {"SPARK_DIST_CLASSPATH": os.pathsep.join(str(j) for j in jars)}


def main(argv: Sequence[str]) -> int:
    names = list(argv) or list(SETS)
    unknown = [n for n in names if n not in SETS]
    if unknown:
        print(f"unknown set(s) {unknown}; known: {sorted(SETS)}", file=sys.stderr)
        return 2
    for name in names:
        artifacts = SETS[name]()
        jars = fetch(artifacts)
        print(f"{name}: {len(jars)} jars in {cache_root() / artifacts.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
