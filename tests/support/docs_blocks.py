"""The code blocks of the docs that claim to run, and a driver that runs pages' blocks.

A block claims to run when its fence is ```` ```{.python .runs} ```` or
```` ```{.bash .runs} ```` (the site labels it "runs as written"). A page's marked blocks
are steps of one session, run in order in one folder: the Python blocks in one namespace,
each shell block with ``bash -euo pipefail`` in between, with this interpreter's scripts
(``statehold``) first on PATH.

    python -m tests.support.docs_blocks PAGE.md [PAGE.md ...]   # in the folder to run in

Several pages run one after the other in one interpreter, each in its own subfolder
(``page-<i>``) and namespace, so that they share one Spark JVM (a page's session is
stopped after it, the next page's is a new one in the same JVM, whose relative paths
resolve in that page's folder): each JVM start costs half a minute of CPU. Each page's
output starts with ``=== PAGE begins`` and ends with ``=== PAGE passed`` or ``=== PAGE
failed`` (its traceback on stderr); a failed page does not stop the next one, and the
exit status is 1 if any failed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import traceback
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


BEGINS, PASSED, FAILED = "begins", "passed", "failed"


def stop_spark() -> None:
    """Stop the active Spark session a page left running, so the next page's is new."""
    if "pyspark.sql" not in sys.modules:
        return
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()


def point_spark_at(folder: Path) -> None:
    """Make a Spark JVM started by an earlier page resolve relative paths in `folder`:
    Hadoop's local file system takes its working folder from ``user.dir`` when it is
    created, so set that and drop the cached file systems (the JVM's own working folder,
    where it started, cannot change)."""
    if "pyspark" not in sys.modules:
        return
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return
    gateway.jvm.java.lang.System.setProperty("user.dir", str(folder))
    gateway.jvm.org.apache.hadoop.fs.FileSystem.closeAll()


def run_pages(pages: list[Path]) -> int:
    """Run each page's marked blocks in its own subfolder of the current folder; 1 if any
    page failed."""
    home = Path.cwd()
    failed = 0
    for i, page in enumerate(pages):
        folder = home / f"page-{i}"
        folder.mkdir()
        os.chdir(folder)
        point_spark_at(folder)
        print(f"=== {page} {BEGINS}", flush=True)
        try:
            run_page(page)
        except BaseException:  # SystemExit too: a page's exit must not skip the next
            traceback.print_exc()
            sys.stderr.flush()
            print(f"=== {page} {FAILED}", flush=True)
            failed += 1
        else:
            print(f"=== {page} {PASSED}", flush=True)
        finally:
            stop_spark()
            os.chdir(home)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(run_pages([Path(a) for a in sys.argv[1:]]))
