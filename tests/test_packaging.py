"""statehold as a package: one version (``statehold.__version__``, which pyproject reads
and ``statehold --version`` prints), a license, and driver-only dependencies in extras that
a Spark task never imports, with one line saying which extra to install when one is
missing."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

import statehold
from statehold.cli import app
from statehold.errors import EXTRA_MODULES
from tests.support.paths import ROOT, SRC, python_path

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]

#: What a Spark task imports: the task code and what it pulls in, the state backend and
#: the processor API (pickled closures reference them on the executors).
TASK_MODULES = ["statehold.spark.task", "statehold.backend", "statehold.processor"]
DRIVER_ONLY = sorted(set().union(*EXTRA_MODULES.values()))


def _imported(modules: list[str], *, block: str = "") -> subprocess.CompletedProcess[str]:
    """Import `modules` in a new interpreter (this tree's code); it prints which top-level
    modules ended up in ``sys.modules``. `block` makes one package unimportable."""
    code = "\n".join([
        "import importlib, json, sys",
        f"if {block!r}: sys.modules[{block!r}] = None",
        f"for name in {modules!r}: importlib.import_module(name)",
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))",
    ])
    return subprocess.run(
        [sys.executable, "-c", code],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": python_path([SRC, ROOT])},
        capture_output=True, text=True, timeout=120,
    )


def _top_level(modules: list[str]) -> set[str]:
    done = _imported(modules)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout))


def test_a_spark_task_imports_no_driver_only_package() -> None:
    assert _top_level(TASK_MODULES) & set(DRIVER_ONLY) == set()


def test_the_import_check_can_fail() -> None:
    """The same check on the command line's module does see typer and rich."""
    assert {"typer", "rich"} <= _top_level(["statehold.cli.app"])


def test_the_spark_package_and_the_ha_package_import_without_the_extras() -> None:
    """`import statehold.spark` (what a driver script and pickled closures name) and the HA
    stores import with kazoo, prometheus_client, typer and rich all unimportable."""
    for blocked in DRIVER_ONLY:
        done = _imported(["statehold.spark", "statehold.ha", "statehold.job.directory"],
                         block=blocked)
        assert done.returncode == 0, (blocked, done.stderr)


def test_version_has_one_source_and_the_cli_prints_it() -> None:
    assert "version" not in PROJECT and "version" in PROJECT["dynamic"]
    attr = PYPROJECT["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "statehold.__version__"
    assert re.fullmatch(r"\d+\.\d+\.\d+", statehold.__version__)
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"statehold {statehold.__version__}\n"


def test_license_classifiers_and_urls() -> None:
    assert PROJECT["license"] == "Apache-2.0" and PROJECT["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text  # the whole text, not a stub
    assert "Typing :: Typed" in PROJECT["classifiers"]
    assert PROJECT["urls"]["Homepage"].startswith("https://")


def test_each_extra_holds_its_packages_and_test_installs_them_all() -> None:
    """EXTRA_MODULES (which ModuleNotFoundError is a missing extra) agrees with pyproject,
    none of them is a core dependency, and the README's ``.[test]`` brings every extra."""
    extras = PROJECT["optional-dependencies"]

    def names(requirements: list[str]) -> set[str]:
        return {re.split(r"[<>=\[ ;]", r, maxsplit=1)[0].lower().replace("-", "_")
                for r in requirements}

    declared = {"cli": {"typer", "rich"}, "metrics": {"prometheus_client"},
                "zookeeper": {"kazoo"}}
    for extra, packages in declared.items():
        assert names(extras[extra]) == packages
        assert packages <= EXTRA_MODULES[extra]
        assert not packages & names(PROJECT["dependencies"])
    assert extras["all"] == ["statehold[cli,metrics,zookeeper]"]
    assert "statehold[all]" in extras["test"]
    assert "statehold[docs]" in extras["test"]


@pytest.mark.parametrize(
    ("blocked", "code", "line"),
    [
        ("typer", "from statehold.cli import main; main()",
         "statehold: error: the statehold command needs typer, which is not installed: "
         "pip install 'statehold[cli]'"),
        ("kazoo", "from statehold.ha.open import open_ha_store\n"
                  "from statehold.storage.local import LocalStorage\n"
                  "open_ha_store('zookeeper://127.0.0.1:1/x', LocalStorage('.'), 'job')",
         "statehold.errors.MissingExtraError: the HA store zookeeper://127.0.0.1:1/x needs "
         "kazoo, which is not installed: pip install 'statehold[zookeeper]'"),
    ],
)
def test_a_missing_extra_says_which_to_install(
    blocked: str, code: str, line: str, tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.modules[{blocked!r}] = None\n{code}"],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": python_path([SRC, ROOT])},
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == line
    if blocked == "typer":
        assert done.stderr == line + "\n"  # the whole output: one line, no traceback
