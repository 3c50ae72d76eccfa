"""The code blocks of the docs that claim to run, and a driver that runs one page's.

A block claims to run when its fence is ```` ```{.python .runs} ```` or
```` ```{.bash .runs} ```` (the site labels it "runs as written"). A page's marked blocks
are steps of one session, run in order in one folder: the Python blocks in one
interpreter (so a page starts Spark at most once), each shell block with ``bash -euo
pipefail`` in between, with this interpreter's scripts (``statehold``) first on PATH.

    python -m tests.support.docs_blocks PAGE.md    # in the folder to run in
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

#: A marked block: the fence's classes, then its body up to the closing fence.
MARKED = re.compile(r"^```\{\.(?P<lang>python|bash) \.runs\}\n(?P<code>.*?)^```$", re.M | re.S)
#: Any fence whose info string mentions "runs" (to catch a misspelt marker; an info string
#: never holds a backtick, so inline code quoting a fence is not one).
MENTIONS_RUNS = re.compile(r"^\s*```[^`\n]*\bruns\b[^`\n]*$", re.M)


@dataclass(frozen=True)
class Block:
    lang: str
    code: str
    line: int  # of the opening fence, 1-based


def marked_blocks(text: str) -> list[Block]:
    """The page's blocks that claim to run, in order."""
    return [
        Block(m["lang"], m["code"], text.count("\n", 0, m.start()) + 1)
        for m in MARKED.finditer(text)
    ]


def run_page(page: Path) -> None:
    """Run `page`'s marked blocks in order in the current folder; the first failure raises."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    namespace: dict[str, object] = {"__name__": "__main__"}
    for block in marked_blocks(page.read_text()):
        print(f"--- {page.name}:{block.line} ({block.lang})", flush=True)
        if block.lang == "python":
            exec(compile(block.code, f"{page}:{block.line}", "exec"), namespace)
        else:
            subprocess.run(["bash", "-euo", "pipefail", "-c", block.code], env=env, check=True)
        sys.stdout.flush()


if __name__ == "__main__":
    run_page(Path(sys.argv[1]))
