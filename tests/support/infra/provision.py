"""Install or find what the tests need, so that ``python3 -m pytest -q`` works on a fresh
Debian machine: a Java runtime (Spark, ZooKeeper, Kafka), Maven (to fetch ZooKeeper's and
Kafka's jars from Maven Central, see tests/support/infra/jvm.py), Node.js with npm and Azurite
(npm, into a cache folder), Chromium (the web view's test), and an archive of Spark's classes
that the Spark JVMs the tests start map instead of loading them (class_archive.py).

    python -m tests.support.infra.provision [COMPONENT ...]     # everything by default (CI)

tests/conftest.py calls `provision` once per test session with the components the
collected tests need. Each component is checked first (a file or a command on the PATH)
and installed only if missing, one printed line per install. Debian packages need root
(``apt-get``); when not root nothing is installed, the line names the command to run, and
the tests that need the component skip with the same words. Caches live under
``$STATEHOLD_CACHE`` (default ``~/.cache/statehold``); one file lock serializes every
install, so parallel test processes install each thing once.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.infra import class_archive

CACHE_ENV = "STATEHOLD_CACHE"
#: Pinned so the cache folder's name says what is in it.
AZURITE_VERSION = "3.35.0"
ZOOKEEPER_VERSION = "3.9.5"
APT_TIMEOUT = 1800.0
NPM_TIMEOUT = 900.0

Say = Callable[[str], None]


def cache_root() -> Path:
    root = os.environ.get(CACHE_ENV)
    return Path(root) if root else Path.home() / ".cache" / "statehold"


@contextmanager
def _locked(name: str) -> Iterator[None]:
    path = cache_root() / f".{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# -- Debian packages ------------------------------------------------------------------------
@dataclass(frozen=True)
class AptThing:
    """A command the tests run, and the Debian package that provides it."""

    command: str
    package: str


APT = {
    "java": AptThing("java", "default-jre-headless"),
    "maven": AptThing("mvn", "maven"),
    "node": AptThing("npm", "npm"),  # npm depends on nodejs
    "chromium": AptThing("chromium", "chromium"),
}


def _has_command(command: str) -> bool:
    java_home = os.environ.get("JAVA_HOME")
    if command == "java" and java_home and (Path(java_home) / "bin" / "java").exists():
        return True
    return shutil.which(command) is not None


def apt_install(names: Sequence[str], say: Say) -> dict[str, str]:
    """Install the missing Debian packages among `names` in one apt-get run; returns
    {name: why it is still missing}."""
    missing = [n for n in names if not _has_command(APT[n].command)]
    if not missing:
        return {}
    packages = [APT[n].package for n in missing]
    command = f"apt-get install {' '.join(packages)}"
    if os.geteuid() != 0:
        why = f"not installed (not root): run `sudo {command}`"
        for name in missing:
            say(f"provision: {name}: {why}")
        return {name: why for name in missing}
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for name in missing:
        say(f"provision: installing {name} (Debian package {APT[name].package})")
    steps = [["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", *packages]]
    for step in steps:
        done = subprocess.run(
            step, env=env, capture_output=True, text=True, timeout=APT_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
        if done.returncode != 0:
            why = f"`{' '.join(step)}` failed: {(done.stdout + done.stderr)[-1500:]}"
            return {name: why for name in missing}
    return {n: f"`{command}` did not provide `{APT[n].command}`"
            for n in missing if not _has_command(APT[n].command)}


# -- Azurite (npm, into the cache) ----------------------------------------------------------
def azurite_dir() -> Path:
    return cache_root() / f"azurite-{AZURITE_VERSION}"


def azurite_blob_command() -> Path:
    """The ``azurite-blob`` script of the cached install (may not exist yet)."""
    return azurite_dir() / "node_modules" / ".bin" / "azurite-blob"


def install_azurite(say: Say) -> str | None:
    """npm-install Azurite into the cache unless it is there; None when done, else why not."""
    if azurite_blob_command().exists():
        return None
    npm = shutil.which("npm")
    if npm is None:
        return "needs npm (`apt-get install npm`)"
    with _locked("azurite"):
        if azurite_blob_command().exists():
            return None
        say(f"provision: installing azurite {AZURITE_VERSION} (npm) into {azurite_dir()}")
        staging = Path(tempfile.mkdtemp(prefix=".azurite-", dir=cache_root()))
        try:
            done = subprocess.run(
                [npm, "install", "--prefix", str(staging), "--no-audit", "--no-fund",
                 "--no-update-notifier", f"azurite@{AZURITE_VERSION}"],
                capture_output=True, text=True, timeout=NPM_TIMEOUT, stdin=subprocess.DEVNULL,
            )
            if done.returncode != 0:
                return f"`npm install azurite@{AZURITE_VERSION}` failed: " + (
                    done.stdout + done.stderr
                )[-1500:]
            if azurite_dir().exists():  # an incomplete earlier attempt
                shutil.rmtree(azurite_dir())
            staging.rename(azurite_dir())
        finally:
            if staging.exists():
                shutil.rmtree(staging)
    return None


# -- jars from Maven Central (tests/support/infra/jvm.py) ------------------------------------------
def zookeeper_set() -> object:
    from tests.support.infra import jvm

    # The server needs Dropwizard metrics and snappy at run time ("provided" dependencies
    # in ZooKeeper's pom, so Maven does not bring them), and slf4j-simple writes its log.
    return jvm.ArtifactSet(
        f"zookeeper-{ZOOKEEPER_VERSION}",
        (
            f"org.apache.zookeeper:zookeeper:{ZOOKEEPER_VERSION}",
            "io.dropwizard.metrics:metrics-core:4.1.12.1",
            "org.xerial.snappy:snappy-java:1.1.10.5",
            "org.slf4j:slf4j-simple:2.0.13",
        ),
    )


def _jar_sets() -> dict[str, Callable[[], object]]:
    from tests.support.infra import jvm

    return {"zookeeper": zookeeper_set, **jvm.SETS}


def fetch_jars(name: str, say: Say) -> str | None:
    """Fetch one set of jars (Maven) into jvm.py's cache; None when done, else why not."""
    try:
        from tests.support.infra import jvm
    except ImportError:
        return "tests/support/infra/jvm.py is missing"
    artifacts = _jar_sets()[name]()
    folder = jvm.cache_root() / artifacts.name  # type: ignore[attr-defined]
    if not (folder / jvm.MANIFEST).exists():
        say(f"provision: fetching {name} jars (Maven) into {folder}")
    try:
        jvm.fetch(artifacts)  # type: ignore[arg-type]
    except jvm.ArtifactError as e:
        return str(e)
    return None


#: Debian's ZooKeeper, used only where tests/support/infra/jvm.py (Maven) is not there.
DEBIAN_ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")


def _have_jvm_module() -> bool:
    try:
        from tests.support.infra import jvm  # noqa: F401
    except ImportError:
        return False
    return True


def zookeeper_classpath() -> str:
    """ZooKeeper's class path: its jars from Maven Central (fetched if missing), else
    Debian's ``zookeeper`` package."""
    if not _have_jvm_module():
        return str(DEBIAN_ZOOKEEPER_JAR)
    from tests.support.infra import jvm

    return jvm.classpath(jvm.fetch(zookeeper_set()))  # type: ignore[arg-type]


def install_zookeeper(say: Say) -> str | None:
    if _have_jvm_module():
        return fetch_jars("zookeeper", say)
    if DEBIAN_ZOOKEEPER_JAR.exists():
        return None
    return f"{DEBIAN_ZOOKEEPER_JAR} is missing: run `apt-get install zookeeper`"


# -- what needs what --------------------------------------------------------------------------
#: Each component, and the ones it needs first.
NEEDS: dict[str, tuple[str, ...]] = {
    "java": (),
    "maven": ("java",),
    "node": (),
    "chromium": (),
    "azurite": ("node",),
    "zookeeper": ("java", "maven"),
    "kafka-broker": ("java", "maven"),
    "spark-kafka": ("java", "maven"),
    "hadoop-aws": ("java", "maven"),
    "hadoop-azure": ("java", "maven"),
    "spark-classes": ("java",),  # class_archive.py: made last, by running the example
}
ALL = tuple(NEEDS)

#: Why each component is still missing after `provision` (read by `require`).
MISSING: dict[str, str] = {}


def _closure(names: Iterable[str]) -> list[str]:
    ordered: list[str] = []

    def visit(name: str) -> None:
        for dep in NEEDS[name]:
            visit(dep)
        if name not in ordered:
            ordered.append(name)

    for name in names:
        visit(name)
    return ordered


def present(name: str) -> bool:
    """A cheap check (no lock, no subprocess) that `name` is already there."""
    if name in APT:
        return _has_command(APT[name].command)
    if name == "azurite":
        return azurite_blob_command().exists()
    if name == "spark-classes":
        return class_archive.present()
    if not _have_jvm_module():
        return name == "zookeeper" and DEBIAN_ZOOKEEPER_JAR.exists()
    from tests.support.infra import jvm

    try:
        artifacts = _jar_sets()[name]()
    except jvm.ArtifactError:
        return False
    return (jvm.cache_root() / artifacts.name / jvm.MANIFEST).exists()  # type: ignore[attr-defined]


def provision(names: Iterable[str], say: Say = print) -> dict[str, str]:
    """Make the named components (and what they need) present; returns {name: why not}
    for those still missing, also kept in MISSING for `require`."""
    wanted = _closure(names)
    if all(present(name) for name in wanted):  # the usual case: no lock to wait for
        for name in wanted:
            MISSING.pop(name, None)
        return {}
    with _locked("provision"):
        missing = apt_install([n for n in wanted if n in APT], say)
        for name in wanted:
            if name in APT or name in missing:
                continue
            blocked = [dep for dep in NEEDS[name] if dep in missing]
            if blocked:
                missing[name] = f"needs {', '.join(blocked)}: {missing[blocked[0]]}"
                continue
            if name == "azurite":
                why = install_azurite(say)
            elif name == "zookeeper":
                why = install_zookeeper(say)
            elif name == "spark-classes":
                # Only ever saves time: without it the tests run as before.
                why = class_archive.make(say)
                if why is not None:
                    say(f"provision: spark-classes: {why} (the tests run without it)")
                continue
            else:
                why = fetch_jars(name, say)
            if why is not None:
                say(f"provision: {name}: {why}")
                missing[name] = why
    MISSING.update(missing)
    for name in wanted:
        if name not in missing:
            MISSING.pop(name, None)
    return missing


def require(name: str) -> None:
    """Skip the calling test if `name` could not be provisioned (the reason names the
    command that installs it)."""
    if name in MISSING:
        import pytest

        pytest.skip(f"{name} is not available: {MISSING[name]}")


def main(argv: Sequence[str]) -> int:
    names = list(argv) or list(ALL)
    unknown = [n for n in names if n not in NEEDS]
    if unknown:
        print(f"unknown component(s) {unknown}; known: {', '.join(ALL)}", file=sys.stderr)
        return 2
    missing = provision(names)
    print(f"provision: {len(_closure(names)) - len(missing)} present, {len(missing)} missing")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
