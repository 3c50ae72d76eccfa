"""``python -m statehold.cli``."""

from statehold.cli import main

main()
