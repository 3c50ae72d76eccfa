"""The running-totals example with `pausing.pause_when_asked` as its phase hook.

    python tests/paused_example.py [example arguments]

Spark's Python workers import the hook by name: this directory goes on their PYTHONPATH
before Spark starts.
"""

from __future__ import annotations

import os
import sys

from pausing import pause_when_asked

from statehold.examples import running_totals

if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([here, *paths])
    sys.exit(running_totals.main(sys.argv[1:], on_phase=pause_when_asked))
