"""`workers.Workers`, the worker processes of a repartition: results in the calls' order,
a call's error raised in the caller, a worker that dies reported in one line; and a
script with no ``if __name__ == "__main__"`` guard that repartitions through workers is
not run again in them (multiprocessing's spawn would run it once per worker)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from statehold.spark_checkpoints import SparkCheckpointError
from statehold.spark_checkpoints.workers import Workers
from tests.support.paths import ROOT, SRC
from tests.support.spark_locations.committed_fixtures import fixture


def test_results_in_order_and_errors_raised() -> None:
    with Workers(2) as pool:
        assert list(pool.map(divmod, range(20), [3] * 20)) == [divmod(i, 3) for i in range(20)]
        with pytest.raises(ZeroDivisionError):
            list(pool.map(divmod, [1, 2], [1, 0]))
        with pytest.raises(SparkCheckpointError, match="ended before its call did"):
            list(pool.map(os._exit, [3]))


def test_a_script_without_a_main_guard_runs_once(extracted: Callable[[str], Path],
                                                  tmp_path: Path) -> None:
    fx = fixture(extracted("4.3.0"), "4.3.0", "window", "rocksdb_changelog")
    ran = tmp_path / "ran"
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(f"""
        import statehold.spark_checkpoints.repartition as module
        from statehold.spark_checkpoints import open_spark_checkpoint
        with open({str(ran)!r}, "a") as f:
            f.write("ran\\n")
        module.PARALLEL_BYTES = 0  # workers, whatever the size
        open_spark_checkpoint({str(fx.checkpoint)!r}).repartition(
            {str(tmp_path / "dest")!r}, partitions=3)
    """))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(ROOT)])}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert ran.read_text() == "ran\n"
    assert (tmp_path / "dest" / "commits").is_dir()
