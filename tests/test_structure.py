"""The package's structure, checked: imports only go down the layers and form no cycle
(import-linter's contracts in pyproject.toml), and every deliberate error is one of
statehold's (`StateholdError`), never a bare builtin."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "statehold"

#: Builtins a deliberate raise must not use bare: each has a statehold subclass that keeps
#: it as a second base where callers catch the builtin (`InvalidArgumentError` is also a
#: `ValueError`).
BARE = {"ValueError", "RuntimeError", "TypeError", "Exception", "KeyError", "OSError"}


def bare_raises(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of each ``raise Builtin(...)`` or ``raise Builtin`` in `tree`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(exc, ast.Name) and exc.id in BARE:
                found.append((node.lineno, exc.id))
    return found


def test_every_deliberate_raise_is_a_statehold_error() -> None:
    problems = [
        f"{path.relative_to(ROOT)}:{line}: raise {name}"
        for path in sorted(SRC.rglob("*.py"))
        for line, name in bare_raises(ast.parse(path.read_text(), str(path)))
    ]
    assert not problems, "raise a StateholdError subclass instead:\n" + "\n".join(problems)


def test_the_raise_check_finds_a_bare_raise() -> None:
    tree = ast.parse(
        "def f(x):\n"
        "    if x:\n"
        "        raise ValueError('bad')\n"
        "    raise InvalidArgumentError('fine')\n"
        "try:\n    pass\nexcept ValueError:\n    raise\n"
    )
    assert bare_raises(tree) == [(3, "ValueError")]


def test_imports_only_go_down_and_form_no_cycle() -> None:
    done = subprocess.run(
        [str(Path(sys.executable).with_name("lint-imports")), "--no-cache"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "BROKEN" not in done.stdout and " KEPT" in done.stdout, done.stdout


#: Where a location's kind could be guessed: the CLI and the API (`statehold.open`, the
#: tools, the Spark location's handle). Only `statehold.format.location_kind` decides it.
KIND_GUESSERS = [SRC / "__init__.py", *(SRC / "cli").glob("*.py"), *(SRC / "tools").glob("*.py"),
                 SRC / "spark_checkpoints" / "api.py"]
#: The names that tell the two kinds apart, as path strings and as the layouts' constants,
#: and the checks that used to look for them.
KIND_MARKS = re.compile(r"^(offsets|commits|_job|_ha)$|(?<![\w.])(offsets|commits|_job|_ha)/")
KIND_NAMES = {"OFFSETS_DIR", "COMMITS_DIR", "JOB_DIR", "HA_DIR", "QUERY_METADATA",
              "looks_like_spark_checkpoint", "require_job_directory"}


def kind_guesses(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) of each string naming a kind's directory and each use of a layout's
    name for one (or of a check for one) in `tree`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [(node.lineno, m.group(0)) for m in KIND_MARKS.finditer(node.value)]
        name = node.id if isinstance(node, ast.Name) else (
            node.attr if isinstance(node, ast.Attribute) else None)
        if name in KIND_NAMES:
            found.append((getattr(node, "lineno", 0), name))
    return sorted(found)


def test_one_function_decides_what_a_location_is() -> None:
    problems = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for path in sorted(KIND_GUESSERS)
        for line, what in kind_guesses(ast.parse(path.read_text(), str(path)))
    ]
    assert not problems, ("the kind of a location is decided by statehold.open "
                          "(format.location_kind) only:\n" + "\n".join(problems))


def test_the_kind_check_finds_a_guess() -> None:
    tree = ast.parse(
        "from statehold.spark_checkpoints import layout\n"
        "if storage.exists('_job/owner.json') or 'commits' in dirs or layout.OFFSETS_DIR:\n"
        "    pass\n"
        "ok = ('offsets', 'input offsets', '_jobs/')\n"
    )
    assert kind_guesses(tree) == [(2, "OFFSETS_DIR"), (2, "_job/"), (2, "commits"),
                                  (4, "offsets")]
