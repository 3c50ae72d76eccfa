"""The running-totals example with `pausing.pause_when_asked` as its phase hook.

    PYTHONPATH=. python tests/support/paused_example.py [example arguments]

Spark's Python workers import the hook by name (`tests.support.pause_hooks`): the repository's
root goes on their PYTHONPATH before Spark starts.
"""

from __future__ import annotations

import os
import sys

from statehold.examples import running_totals
from tests.support.paths import ROOT, python_path
from tests.support.pause_hooks import pause_when_asked

if __name__ == "__main__":
    os.environ["PYTHONPATH"] = python_path([ROOT])
    sys.exit(running_totals.main(sys.argv[1:], on_phase=pause_when_asked))
