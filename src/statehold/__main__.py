"""``python -m statehold``: the same as the ``statehold`` command."""

from statehold.cli import main

main()
