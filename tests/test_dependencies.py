"""Every third-party module imported under src/, tests/ and bench/ is declared in
pyproject.toml, in the package's dependencies or one of its extras (deptry), so a package
that an earlier install left behind can never stand in for a missing line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _first_party() -> set[str]:
    """The project's own top-level names: the package, and every module and folder of the
    tests and benchmarks (they import each other as top-level modules)."""
    names = {"statehold", "tests", "bench"}
    for tree in ("tests", "bench"):
        for path in (ROOT / tree).rglob("*.py"):
            names.update(p.removesuffix(".py") for p in path.relative_to(ROOT / tree).parts)
    return names


def _deptry(root: Path, first_party: set[str], tmp_path: Path) -> list[dict[str, object]]:
    out = tmp_path / f"{root.name}-deptry.json"
    command = [sys.executable, "-m", "deptry", str(root), "--json-output", str(out)]
    for name in sorted(first_party):
        command += ["--known-first-party", name]
    done = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=300)
    assert out.exists(), done.stderr
    violations: list[dict[str, object]] = json.loads(out.read_text())
    return violations


def test_every_imported_module_is_declared(tmp_path: Path) -> None:
    violations = _deptry(ROOT, _first_party(), tmp_path)
    lines = [
        f"{v['location']['file']}: {v['error']['code']} {v['error']['message']}"  # type: ignore[index]
        for v in violations
    ]
    assert not lines, "\n".join(lines)


def test_an_undeclared_import_is_found(tmp_path: Path) -> None:
    """The check above can fail: a project importing a package it does not declare (moto)
    is reported."""
    project = tmp_path / "project"
    (project / "tests").mkdir(parents=True)
    (project / "pyproject.toml").write_text(
        '[project]\nname = "p"\nversion = "0"\ndependencies = ["pytest"]\n'
        '[tool.deptry]\nexclude = ["venv"]\n'
    )
    (project / "tests" / "test_x.py").write_text("import pytest\nimport moto\n")
    found = {str(v["module"]) for v in _deptry(project, set(), tmp_path)}
    assert "moto" in found  # missing (DEP001), or installed but undeclared (DEP003)
