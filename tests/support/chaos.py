"""Chaos runs of the Kafka pipeline (tests/spark/test_chaos.py): a seeded scheduler of
faults on the fault proxies (tests/support/fault_injection_proxy.py) and of kill -9 of executor JVMs
and of the driver, and one driver run of the running-totals example watched until it
progresses, exits or hangs.

Everything random comes from one ``random.Random(seed)``; the seed is in every message,
so a failure can be replayed with ``STATEHOLD_CHAOS_SEED=<seed>``. (Replays are as
exact as the machine lets them be: the faults happen at the same moments after the
driver's start, but what the driver is doing then depends on its speed.)
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.cluster import EXECUTOR_CLASS, alive, cmdline
from tests.support.example_runs import example_cmd, group_alive
from tests.support.fault_injection_proxy import FaultProxy

#: ZooKeeper's session timeout for the driver's client (statehold's HA timeout, 10 s,
#: within the test server's 2..20 ticks of 500 ms).
ZK_SESSION = 10.0
#: Hang detector: a driver run that neither progresses nor exits for this long is killed
#: and fails the test (far above any retry schedule; not a timing assertion). Progress:
#: a batch's line, or a file written or removed in the job directory (its heartbeat,
#: the lease, aside), so a run that is merely slow on a loaded machine is not a hang.
HANG = 300.0
#: How often the job directory is listed to see progress.
WATCH_EVERY = 5.0

#: A batch's line in the driver's stdout: a new checkpoint, or a replay already done.
PROGRESS = re.compile(r"^batch (\d+): (checkpoint \d+,|already checkpointed)", re.M)


@dataclass
class Fault:
    """One fault: `inject` it, and `heal` both proxies after `hold` seconds."""

    name: str
    inject: Callable[[], None]
    hold: float


def fault_kinds(rng: random.Random, s3: FaultProxy, zk: FaultProxy
                ) -> list[Callable[[], Fault]]:
    """The transient faults the scheduler picks from (each call draws its parameters)."""

    def slow() -> None:
        for proxy in (s3, zk):
            proxy.set_latency(rng.choice([0.005, 0.02, 0.05]))
            proxy.set_bandwidth(rng.choice([200_000, 1_000_000]))

    def cut() -> Fault:
        action = rng.choice(["close", "reset", "stall"])
        after = rng.randrange(1, 400)  # state files of a few KiB: cut inside them
        return Fault(f"upload cut ({action} after {after} B)",
                     lambda: s3.cut_upload(after, action, min_body=after + 1),
                     rng.uniform(3, 15))

    def burst(status: int) -> Callable[[], Fault]:
        def make() -> Fault:
            n = rng.randint(2, 8)
            return Fault(f"{status} x{n}", lambda: s3.fail_requests(n, status),
                         rng.uniform(2, 10))
        return make

    def resets() -> Fault:
        n = rng.randint(1, 4)
        return Fault(f"S3 resets x{n}", lambda: s3.reset_requests(n), rng.uniform(2, 10))

    def lost() -> Fault:
        n = rng.randint(1, 3)
        return Fault(f"S3 answers lost x{n}", lambda: s3.lose_responses(n), rng.uniform(2, 10))

    return [
        burst(503), burst(500), resets, cut, lost,
        lambda: Fault("slow links", slow, rng.uniform(5, 20)),
        lambda: Fault("ZooKeeper reset", zk.reset_all, 0.0),
        lambda: Fault("ZooKeeper partition (short)", zk.partition, rng.uniform(1, 4)),
    ]


def long_partition(zk: FaultProxy) -> Fault:
    return Fault("ZooKeeper partition (past the session timeout)", zk.partition,
                 ZK_SESSION + 5)


def executors_in(pgid: int) -> list[int]:
    """The executor JVMs (``CoarseGrainedExecutorBackend``) in the driver's process group
    (``local-cluster`` starts them from the driver's JVM)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            if os.getpgid(pid) != pgid:
                continue
        except ProcessLookupError:
            continue
        if EXECUTOR_CLASS in cmdline(pid) and alive(pid):
            found.append(pid)
    return sorted(found)


@dataclass
class RunPlan:
    """What happens to one driver run, drawn from the seed."""

    kill_driver_after: float | None  # seconds after the query started
    kill_executor_after: float | None
    long_partition: bool
    victim: int = 0  # which executor (by pid order) is killed

    def describe(self) -> str:
        parts = []
        if self.kill_driver_after is not None:
            parts.append(f"kill -9 driver at +{self.kill_driver_after:.0f}s")
        if self.kill_executor_after is not None:
            parts.append(f"kill -9 an executor at +{self.kill_executor_after:.0f}s")
        if self.long_partition:
            parts.append("a ZooKeeper partition past the session timeout")
        return ", ".join(parts) or "faults only"


@dataclass
class RunResult:
    """How a driver run ended and what it did."""

    returncode: int | None  # None: killed by the test (the plan's kill -9 of the driver)
    progressed: int  # batch lines printed
    stdout: str
    stderr: str
    events: list[str] = field(default_factory=list)
    seconds: float = 0.0
    hung: bool = False


class Chaos:
    """The scheduler of one driver run: faults at random moments while it runs, the kills
    of its plan; heals everything when the run ends."""

    def __init__(self, rng: random.Random, s3: FaultProxy, zk: FaultProxy) -> None:
        self.rng = rng
        self.s3 = s3
        self.zk = zk
        self.kinds = fault_kinds(rng, s3, zk)
        self.events: list[str] = []
        self._stop = threading.Event()
        self._t0 = time.monotonic()

    def note(self, what: str) -> None:
        self.events.append(f"+{time.monotonic() - self._t0:.1f}s {what}")

    def heal(self) -> None:
        self.s3.heal()
        self.zk.heal()

    def faults(self, plan: RunPlan) -> None:
        """Until stopped: wait a random moment, inject a fault, hold it, heal. The long
        partition (if planned) comes at a random place in the sequence."""
        long_at = self.rng.randint(0, 3) if plan.long_partition else -1
        n = 0
        while not self._stop.wait(self.rng.uniform(1, 8)):
            fault = long_partition(self.zk) if n == long_at else self.rng.choice(self.kinds)()
            n += 1
            self.note(f"fault: {fault.name} for {fault.hold:.1f}s")
            fault.inject()
            self._stop.wait(fault.hold)
            self.heal()

    def run_driver(self, cwd: Path, args: list[str], env: dict[str, str], plan: RunPlan,
                   name: str, watch: Callable[[], object], faults: bool = True) -> RunResult:
        """The example until it exits, is killed by the plan, or hangs (then killed);
        faults injected meanwhile unless `faults` is False. `watch()` tells the job
        directory's state: a change is progress."""
        self._t0 = time.monotonic()
        self.events = []
        self._stop.clear()
        out, err = cwd / f"{name}.out", cwd / f"{name}.err"
        with open(out, "wb") as o, open(err, "wb") as e:
            proc = subprocess.Popen(example_cmd(*args), cwd=cwd, env=env, stdout=o, stderr=e,
                                    start_new_session=True)
        scheduler = threading.Thread(target=self.faults, args=(plan,), daemon=True)
        if faults:
            scheduler.start()
        killed = hung = False
        started: float | None = None
        executor_killed = False
        last_progress, seen = time.monotonic(), 0
        last_watch, watched = 0.0, watch()
        try:
            while proc.poll() is None:
                time.sleep(0.5)
                text = out.read_text(errors="replace")
                now = time.monotonic()
                if started is None and "checkpoints:" in text:
                    started = now
                    self.note("query started")
                progress = len(PROGRESS.findall(text))
                if progress > seen:
                    seen, last_progress = progress, now
                if now - last_watch >= WATCH_EVERY:
                    last_watch, state = now, watch()
                    if state != watched:
                        watched, last_progress = state, now
                if now - last_progress > HANG:
                    hung = True
                    self.note("no progress and no exit: hung")
                    break
                if started is None:
                    continue
                if (plan.kill_executor_after is not None and not executor_killed
                        and now - started >= plan.kill_executor_after):
                    executor_killed = True
                    executors = executors_in(proc.pid)
                    if executors:
                        victim = executors[plan.victim % len(executors)]
                        os.kill(victim, signal.SIGKILL)
                        self.note(f"kill -9 executor {victim}")
                    else:
                        self.note("no executor to kill yet")
                if plan.kill_driver_after is not None and now - started >= plan.kill_driver_after:
                    self.note("kill -9 driver")
                    killed = True
                    break
        finally:
            self._stop.set()
            if faults:
                scheduler.join()
            self.heal()
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            stop_group(proc.pid)
        stdout, stderr = out.read_text(errors="replace"), err.read_text(errors="replace")
        return RunResult(None if killed or hung else proc.returncode,
                         len(PROGRESS.findall(stdout)), stdout, stderr, list(self.events),
                         time.monotonic() - self._t0, hung)


def stop_group(pgid: int, grace: float = 30.0) -> None:
    """Wait for what is left of a driver's process group (its JVM, executors, Python
    workers) to go; kill -9 the stragglers after `grace` seconds (our own session only)."""
    deadline = time.monotonic() + grace
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if group_alive(pgid):
        os.killpg(pgid, signal.SIGKILL)
        while group_alive(pgid) and time.monotonic() < deadline + grace:
            time.sleep(0.2)

