"""``python -m statehold.cli``."""

from statehold.cli.app import main

main()
