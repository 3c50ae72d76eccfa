"""The ``statehold`` command as a click command, for the docs site's CLI reference.

mkdocs-click documents click commands; typer builds one from `app` on demand
(``typer.main.get_command``). docs/reference/cli.md renders `command` from here, so the
reference says what ``--help`` says.

mkdocs-click passes each command's help to Markdown as it is, where help written for a
terminal means something else: ``[--wait] [--timeout S]`` is a reference link, ``<id>`` an
HTML tag, ``*.jsonl`` starts emphasis. `command` is a copy made for the docs (typer builds
a new one per call; the console script never sees it) with those characters escaped. The
options' help is rendered as preformatted text and is left as it is.
"""

from __future__ import annotations

from typing import Any

import typer

from statehold.cli.app import app

_MARKDOWN = str.maketrans({"[": r"\[", "]": r"\]", "*": r"\*", "<": "&lt;", ">": "&gt;"})


def _escaped(cmd: Any) -> Any:
    """`cmd` and its subcommands with their help made literal for Markdown."""
    for attr in ("help", "short_help"):
        text = getattr(cmd, attr, None)
        if text:
            setattr(cmd, attr, text.translate(_MARKDOWN))
    for sub in getattr(cmd, "commands", {}).values():
        _escaped(sub)
    return cmd


#: The whole ``statehold`` command tree: every group's commands, their options and help.
command = _escaped(typer.main.get_command(app))
