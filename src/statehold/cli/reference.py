"""The ``statehold`` command as a click command, for the docs site's CLI reference.

mkdocs-click documents click commands; typer builds one from `app` on demand
(``typer.main.get_command``). docs/reference/cli.md renders `command` from here, so the
reference says what ``--help`` says.
"""

from __future__ import annotations

import typer

from statehold.cli.app import app

#: The whole ``statehold`` command tree: every group's commands, their options and help.
command = typer.main.get_command(app)
