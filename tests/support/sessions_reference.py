"""The sessions example's input (``python -m statehold.examples.sessions``) and its
plain-Python reference: generated event files, the sessions they close and leave open,
and the check of a finished run's output, state and job directory."""

from __future__ import annotations

import json
import random
from pathlib import Path

from statehold.backend.state import TIMERS_NAME
from statehold.cleanup.reconcile import plan
from statehold.job.directory import open_job
from statehold.spark.reader import iter_state
from statehold.storage import Storage
from tests.support.example_runs import check_retained_intact

GAP, DELAY = 300, 120
Session = tuple[str, int, int, int]


def generate(input_dir: Path, files: int, rows: int = 40, users: int = 12, seed: int = 7) -> None:
    """Event times rising ~20 s per row with disorder below the watermark delay (so no row
    is late), bursts and pauses so sessions close, merge and stay open."""
    rng = random.Random(seed)
    input_dir.mkdir(parents=True, exist_ok=True)
    clock = 1_700_000_000
    for i in range(files):
        lines = []
        for _ in range(rows):
            clock += rng.choice([5, 10, 20, 40]) if rng.random() < 0.97 else 900
            ts = clock - rng.randrange(0, DELAY - 20)
            user = f"u{rng.randrange(users):02d}"
            lines.append(json.dumps({"user": user, "ts": ts, "page": f"p{rng.randrange(5)}"}))
        (input_dir / f"part-{i:04d}.jsonl").write_text("\n".join(lines) + "\n")


def reference(input_dir: Path, files_per_batch: int = 1) -> tuple[set[Session], set[Session]]:
    """(closed, open) sessions: batches of files in name order, each judged against the
    watermark of the batches before it (late rows dropped), gap sessions per user, closed
    once the final watermark reaches end + gap."""
    names = sorted(input_dir.glob("*.jsonl"))
    watermark: int | None = None
    events: dict[str, list[int]] = {}
    for i in range(0, len(names), files_per_batch):
        newest = None
        for path in names[i : i + files_per_batch]:
            for line in path.read_text().splitlines():
                row = json.loads(line)
                newest = row["ts"] if newest is None else max(newest, row["ts"])
                if watermark is None or row["ts"] > watermark:
                    events.setdefault(row["user"], []).append(row["ts"])
        if newest is not None:
            moved = newest - DELAY
            watermark = moved if watermark is None else max(watermark, moved)
    closed, still_open = set(), set()
    for user, times in events.items():
        times.sort()
        start = end = times[0]
        n = 0
        for t in times:
            if t - end > GAP:
                (closed if end + GAP <= (watermark or 0) else still_open).add(
                    (user, start, end, n))
                start, n = t, 0
            end, n = t, n + 1
        (closed if end + GAP <= (watermark or 0) else still_open).add((user, start, end, n))
    return closed, still_open


def read_sessions(output: Path) -> list[Session]:
    out = []
    for part in sorted(output.glob("batch-*/part-*.json")):
        for line in part.read_text().splitlines():
            r = json.loads(line)
            out.append((r["user"], r["start"], r["end"], r["events"]))
    return out


def check_end(job: Storage, output: Path, inp: Path, files_per_batch: int) -> None:
    closed, still_open = reference(inp, files_per_batch)
    written = read_sessions(output)
    assert len(written) == len(set(written)), "a session was written twice"
    assert set(written) == closed
    assert closed and still_open  # the input exercises both
    state = dict(iter_state(job))
    opened = {(str(u), *s) for u, st in state.items() for s in st.get("open", [])}
    assert opened == still_open
    assert all(len(st[TIMERS_NAME]) == len(st["open"]) for st in state.values())
    check_retained_intact(job)
    leftovers = plan(open_job(job), None)
    assert leftovers.orphans == [], [f.key for f in leftovers.orphans]
