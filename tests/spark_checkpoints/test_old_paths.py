"""The old import paths of the Spark layout and deletion rule (`statehold.format.spark_layout`,
`statehold.cleanup.spark_policy`, before issue 42) still work for one release: importing
one warns (DeprecationWarning), and its names are the new modules' own objects."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

MOVED = [
    ("statehold.format.spark_layout", "statehold.spark_checkpoints.layout", "Kind"),
    ("statehold.cleanup.spark_policy", "statehold.spark_checkpoints.policy", "judge"),
]


@pytest.mark.parametrize(("old", "new", "name"), MOVED)
def test_an_old_path_warns_and_gives_the_new_modules_names(
    old: str, new: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}"):
        alias = importlib.import_module(old)
    moved = importlib.import_module(new)
    assert getattr(alias, name) is getattr(moved, name)
    assert all(getattr(alias, n) is getattr(moved, n) for n in alias.__all__)


@pytest.mark.parametrize(("old", "new", "name"), MOVED)
def test_an_old_path_imports_nothing_above_it_until_a_name_is_used(
    old: str, new: str, name: str
) -> None:
    code = (
        f"import sys, {old} as m\n"
        "print('statehold.spark_checkpoints' in sys.modules)\n"
        f"m.{name}\n"
        f"print('{new}' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]
    assert f"DeprecationWarning: {old} moved to {new}" in done.stderr
