"""A simulated ZooKeeper ensemble and a kazoo-like client, so the real
`ZooKeeperHAStore` (src/statehold/ha/zookeeper.py) runs unchanged inside the simulation.

What is modelled:
  * znodes with a data version; ``set(version=v)`` is a compare-and-set (BadVersionError),
    ``create`` fails with NodeExistsError, reads of a missing node NoNodeError;
  * sessions: each simulated process has one client and one session; the environment
    disconnects a client for a while (requests fail with ConnectionLoss, the store waits
    for the connection to come back); a disconnection longer than the session timeout
    expires the session (its ephemeral nodes are deleted, the client gets a new session on
    reconnecting), as does a killed process's silence; a process that ends closes its
    session;
  * ephemeral nodes (``create(ephemeral=True)``), owned by the session that made them;
  * followers that lag: each session talks to one of three servers, a server applies the
    leader's writes only some seconds after they commit, a read is answered from that
    server's view, ``sync`` brings it up to date, and a session always sees its own
    writes (ZooKeeper's guarantees: linearizable writes, sequentially consistent reads);
  * a request whose connection drops after the leader applied it (ConnectionLoss: the
    outcome is unknown to the caller).
Every request is a scheduler point with a seeded latency, like a storage operation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
    SessionExpiredError,
)
from kazoo.protocol.states import KazooState, ZnodeStat

if TYPE_CHECKING:
    from sim.scheduler import Process
    from sim.world import World

SERVERS = 3


@dataclass(frozen=True)
class ZNode:
    data: bytes
    version: int
    #: The session id that owns an ephemeral node (0: persistent).
    owner: int = 0


@dataclass
class Session:
    id: int
    server: int
    #: Set when the ensemble expired or closed it.
    ended: bool = False
    #: Truth (the leader's tree) as of this session's last `sync`, for the invariants.
    synced: dict[str, ZNode] | None = None


@dataclass
class SimZooKeeper:
    """The ensemble: the leader's tree, its history (for the followers' views) and the
    sessions."""

    world: World
    session_timeout: float = 10.0
    #: The leader's tree after each write, with the time it committed.
    history: list[tuple[float, dict[str, ZNode]]] = field(default_factory=list)
    applied: list[int] = field(default_factory=lambda: [0] * SERVERS)
    #: How far behind the leader each server runs (seconds).
    lag: list[float] = field(default_factory=lambda: [0.0] * SERVERS)
    sessions: dict[int, Session] = field(default_factory=dict)
    next_session: int = 1
    #: A planted bug's switch: the HA znode is created ephemeral.
    plant_ephemeral: bool = False

    def __post_init__(self) -> None:
        self.history.append((self.world.clock.t, {}))

    @property
    def tree(self) -> dict[str, ZNode]:
        return self.history[-1][1]

    def open_session(self) -> Session:
        s = Session(self.next_session, self.world.rng.randrange(SERVERS))
        self.next_session += 1
        self.sessions[s.id] = s
        return s

    def end_session(self, session: Session, why: str) -> None:
        """Expire or close a session: its ephemeral nodes go (a write of the ensemble)."""
        if session.ended:
            return
        session.ended = True
        self.world.count(f"zk-session-{why.split()[0]}")
        gone = [p for p, n in self.tree.items() if n.owner == session.id]
        if gone:
            tree = {p: n for p, n in self.tree.items() if n.owner != session.id}
            self._commit(tree)
            self.world.log(f"ZK session {session.id} {why}: ephemeral {gone} deleted")
        else:
            self.world.log(f"ZK session {session.id} {why}")

    def _commit(self, tree: dict[str, ZNode]) -> int:
        self.history.append((self.world.clock.t, tree))
        if len(self.history) > 4096:  # views older than the longest lag are never needed
            drop = len(self.history) - 2048
            self.history = self.history[drop:]
            self.applied = [max(0, a - drop) for a in self.applied]
        return len(self.history) - 1

    def view(self, server: int) -> dict[str, ZNode]:
        """What `server` answers from: the leader's history as of `lag` seconds ago, and
        never older than what it applied before."""
        now = self.world.clock.t
        i = self.applied[server]
        while i + 1 < len(self.history) and self.history[i + 1][0] <= now - self.lag[server]:
            i += 1
        self.applied[server] = i
        return self.history[i][1]

    def sync(self, server: int) -> None:
        self.applied[server] = len(self.history) - 1

    def write(self, session: Session, tree: dict[str, ZNode]) -> None:
        self.applied[session.server] = self._commit(tree)  # the writer's server has it


class _Result:
    """kazoo's IAsyncResult, enough of it: the request runs when `get` is called (one
    scheduler point), so its outcome is decided at that step."""

    def __init__(self, run: Callable[[], Any]) -> None:
        self._run = run

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        return self._run()


class SimEvent:
    """The store's ``_connected`` event over simulated time: set while the client is
    connected; `wait` parks the actor until it is, or until the timeout."""

    def __init__(self, client: SimKazooClient) -> None:
        self.client = client

    def is_set(self) -> bool:
        return self.client.connected

    def set(self) -> None:
        pass  # the client's state is the truth

    def clear(self) -> None:
        pass

    def wait(self, timeout: float | None = None) -> bool:
        sched = self.client.zk.world.sched
        if sched.current() is None:
            return self.is_set()
        return sched.wait_for(self.is_set, 3600.0 if timeout is None else timeout)


class SimKazooClient:
    """The calls `ZooKeeperHAStore` makes of a started KazooClient."""

    def __init__(self, zk: SimZooKeeper, proc: Process) -> None:
        self.zk, self.proc = zk, proc
        self.session = zk.open_session()
        self.disconnected_until = 0.0
        #: When the current cut-off began (None: connected, or its session expired).
        self.cut_from: float | None = None
        self.listeners: list[Callable[[str], Any]] = []

    # -- connection ---------------------------------------------------------------------
    @property
    def connected(self) -> bool:
        self._refresh()
        return self.zk.world.clock.t >= self.disconnected_until

    def _refresh(self) -> None:
        """A client whose session ended gets a new one once it can reach the ensemble
        (kazoo: LOST, then CONNECTED with a new session)."""
        self.tick()
        if self.session.ended and self.zk.world.clock.t >= self.disconnected_until:
            old = self.session.id
            self.session = self.zk.open_session()
            self.zk.world.log(f"ZK {self.proc.name}: session {old} lost, new {self.session.id}")
            self._notify(KazooState.LOST)
            self._notify(KazooState.CONNECTED)

    def disconnect(self, seconds: float) -> None:
        """The environment cuts this client off; past the session timeout the ensemble
        expires its session."""
        now = self.zk.world.clock.t
        if now >= self.disconnected_until:
            self.cut_from = now
        self.disconnected_until = max(self.disconnected_until, now + seconds)
        self._notify(KazooState.SUSPENDED)

    def tick(self) -> None:
        """Expire the session once a cut-off longer than the session timeout has lasted
        that long (called before every step, so a jump of the clock cannot skip it)."""
        cut = self.cut_from
        if (
            cut is not None
            and not self.session.ended
            and self.disconnected_until - cut > self.zk.session_timeout
            and self.zk.world.clock.t >= cut + self.zk.session_timeout
        ):
            self.cut_from = None
            self.zk.end_session(self.session, "expired")

    def _notify(self, state: str) -> None:
        for listener in list(self.listeners):
            listener(state)

    def add_listener(self, listener: Callable[[str], Any]) -> None:
        self.listeners.append(listener)

    def remove_listener(self, listener: Callable[[str], Any]) -> None:
        if listener in self.listeners:
            self.listeners.remove(listener)

    def stop(self) -> None:
        self.zk.end_session(self.session, "closed")

    def close(self) -> None:
        pass

    # -- requests -----------------------------------------------------------------------
    def _request(self, what: str, path: str, run: Callable[[Session], Any], *,
                 write: bool) -> _Result:
        def go() -> Any:
            world = self.zk.world
            world.zk_point(f"zk {what} {path}")
            self.tick()
            if not self.connected:
                raise ConnectionLoss(f"{what} {path}: connection lost (simulated)")
            if self.session.ended:
                raise SessionExpiredError(f"{what} {path}: session expired (simulated)")
            lost = world.zk_fault()
            if lost:
                world.count("zk-connection-loss")
            if lost and not write:
                raise ConnectionLoss(f"{what} {path}: connection lost (simulated)")
            if lost and world.rng.random() < 0.5:
                world.log("  -> zk connection lost before the request")
                raise ConnectionLoss(f"{what} {path}: connection lost (simulated)")
            out = run(self.session)
            if lost:
                world.log("  -> zk request applied, connection lost before the reply")
                raise ConnectionLoss(f"{what} {path}: connection lost (simulated)")
            return out

        return _Result(go)

    def sync_async(self, path: str) -> _Result:
        def run(session: Session) -> str:
            self.zk.sync(session.server)
            session.synced = self.zk.tree
            return path

        return self._request("sync", path, run, write=False)

    def get_async(self, path: str) -> _Result:
        def run(session: Session) -> tuple[bytes, ZnodeStat]:
            truth = session.synced if session.synced is not None else self.zk.tree
            session.synced = None
            self.zk.world.zk_read(self.proc, path, truth.get(path))
            node = self.zk.view(session.server).get(path)
            if node is None:
                raise NoNodeError(path)
            return node.data, _stat(node)

        return self._request("get", path, run, write=False)

    def create_async(self, path: str, value: bytes = b"", acl: Any = None,
                     ephemeral: bool = False, sequence: bool = False,
                     makepath: bool = False) -> _Result:
        ephemeral = ephemeral or self.zk.plant_ephemeral

        def run(session: Session) -> str:
            tree = self.zk.tree
            if path in tree:
                raise NodeExistsError(path)
            new = dict(tree)
            new[path] = ZNode(bytes(value), 0, session.id if ephemeral else 0)
            self.zk.write(session, new)
            return path

        return self._request("create", path, run, write=True)

    def set_async(self, path: str, value: bytes, version: int = -1) -> _Result:
        def run(session: Session) -> ZnodeStat:
            tree = self.zk.tree
            node = tree.get(path)
            if node is None:
                raise NoNodeError(path)
            if version != -1 and node.version != version:
                raise BadVersionError(path)
            new = dict(tree)
            new[path] = ZNode(bytes(value), node.version + 1, node.owner)
            self.zk.write(session, new)
            return _stat(new[path])

        return self._request("set", path, run, write=True)


def _stat(node: ZNode) -> ZnodeStat:
    return ZnodeStat(0, 0, 0, 0, node.version, 0, 0, node.owner, len(node.data), 0, 0)


__all__ = ["SimEvent", "SimKazooClient", "SimZooKeeper", "ZNode"]
