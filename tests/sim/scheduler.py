"""A deterministic scheduler for real code running in threads.

Every actor (a driver attempt, its lease renewer, a task, a person's gc) is a Python
thread running the real statehold code, but only one runs at a time: it holds the baton
until it reaches a *point* (every storage operation is one, so is a simulated sleep or
wait), where it parks. The main thread then checks the invariants on a quiet world and
gives the baton to one runnable actor, chosen by the seeded RNG. So the interleaving of
every storage operation of every actor is picked by the seed, and the same seed replays
the same run.

Time is simulated (`SimClock`): operations advance it by their latency, sleeping and
waiting actors wake when it reaches their deadline, and when nothing can run the clock
jumps to the next deadline. A process (the actors of one driver, one gc ...) can be
paused (none of its actors runs until a time) or killed (each of its actors raises
`Killed` at its next point and unwinds without touching storage again).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class Killed(BaseException):
    """Raised in an actor of a killed process at its next point (not an Exception, so
    the real code's ``except Exception`` does not swallow it)."""


class SimClock:
    """statehold.clock.Clock over simulated time."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.t = start
        self.scheduler: Scheduler | None = None

    def time(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        sched = self.scheduler
        if sched is not None and sched.current() is not None:
            sched.sleep(seconds)
        else:
            self.t += max(0.0, seconds)

    def advance(self, seconds: float) -> None:
        self.t += max(0.0, seconds)


@dataclass(eq=False)
class Process:
    """A group of actors that crash and pause together (one driver with its tasks)."""

    name: str
    kind: str
    killed: bool = False
    paused_until: float = 0.0
    done: bool = False
    #: Free-form state of the world's actors (the coordinator, flags ...).
    data: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"<{self.name}>"


@dataclass(eq=False)
class Actor:
    name: str
    process: Process
    state: str = "starting"  # starting | parked | running | done
    what: str = ""
    wake_at: float | None = None
    predicate: Callable[[], bool] | None = None
    error: BaseException | None = None
    error_trace: str = ""


class Scheduler:
    def __init__(self, clock: SimClock) -> None:
        self.clock = clock
        clock.scheduler = self
        self.cond = threading.Condition()
        self.actors: list[Actor] = []
        self.running: Actor | None = None
        self._local = threading.local()  # (thread idents are reused; a local is not)
        self.threads: list[threading.Thread] = []

    # -- actor side ------------------------------------------------------------------------
    def current(self) -> Actor | None:
        actor: Actor | None = getattr(self._local, "actor", None)
        return actor

    def spawn(
        self,
        process: Process,
        name: str,
        fn: Callable[[], None],
        on_error: Callable[[Actor, BaseException], None],
    ) -> Actor:
        actor = Actor(name, process)
        self.actors.append(actor)

        def body() -> None:
            self._local.actor = actor
            try:
                self._park(actor, "start", None, None)
                fn()
            except Killed:
                pass
            except BaseException as e:  # noqa: BLE001 - reported to the world
                import traceback

                actor.error = e
                actor.error_trace = traceback.format_exc()
                on_error(actor, e)
            finally:
                with self.cond:
                    actor.state = "done"
                    if self.running is actor:
                        self.running = None
                    self.cond.notify_all()

        t = threading.Thread(target=body, name=f"sim-{name}", daemon=True)
        self.threads.append(t)
        t.start()
        return actor

    def _park(
        self,
        actor: Actor,
        what: str,
        wake_at: float | None,
        predicate: Callable[[], bool] | None,
    ) -> None:
        with self.cond:
            actor.state, actor.what = "parked", what
            actor.wake_at, actor.predicate = wake_at, predicate
            if self.running is actor:
                self.running = None
            self.cond.notify_all()
            while self.running is not actor:
                self.cond.wait()
            actor.state = "running"
            actor.wake_at = actor.predicate = None
        if actor.process.killed:
            raise Killed

    def point(self, what: str) -> None:
        """A place where another actor may run first (before every storage operation)."""
        actor = self.current()
        if actor is None:
            return  # a helper thread of an actor (e.g. a thread pool): runs under its baton
        if actor.process.killed:
            raise Killed
        self._park(actor, what, None, None)

    def sleep(self, seconds: float) -> None:
        actor = self.current()
        assert actor is not None
        self._park(actor, f"sleep {seconds:.3f}", self.clock.t + max(0.0, seconds), None)

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        actor = self.current()
        assert actor is not None
        if not predicate():
            self._park(actor, "wait", self.clock.t + timeout, predicate)
        return predicate()

    # -- main-thread side ------------------------------------------------------------------
    def settle(self) -> None:
        """Wait until no actor is running or starting."""
        with self.cond:
            while any(a.state in ("starting", "running") for a in self.actors):
                self.cond.wait()
            self.actors = [a for a in self.actors if a.state != "done"]

    def runnable(self) -> list[Actor]:
        now = self.clock.t
        out = []
        for a in self.actors:
            if a.state != "parked":
                continue
            if a.process.killed:
                out.append(a)  # to unwind
                continue
            if a.process.paused_until > now:
                continue
            woken = a.predicate is not None and a.predicate()
            if woken or a.wake_at is None or a.wake_at <= now:
                out.append(a)
        return out

    def next_wake(self) -> float | None:
        times = []
        for a in self.actors:
            if a.state != "parked":
                continue
            t = a.wake_at if a.wake_at is not None else self.clock.t
            times.append(max(t, a.process.paused_until))
        future = [t for t in times if t > self.clock.t]
        return min(future) if future else None

    def grant(self, actor: Actor) -> None:
        with self.cond:
            self.running = actor
            actor.state = "running"  # before settle() looks, or it would not wait for it
            self.cond.notify_all()
        self.settle()

    def kill(self, process: Process) -> None:
        process.killed = True

    def unwind_killed(self) -> None:
        """Let every actor of a killed process run to its end."""
        while True:
            self.settle()
            dead = [a for a in self.actors if a.state == "parked" and a.process.killed]
            if not dead:
                return
            for a in dead:
                self.grant(a)
