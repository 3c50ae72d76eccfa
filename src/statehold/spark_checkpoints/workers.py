"""Worker processes for work that is Python on one core a process (a repartition's routing
and building): each is ``python -m statehold.spark_checkpoints.workers``, reading calls
from its standard input and writing each one's result back.

The calls and results are pickled: only this process's own objects pass (functions of
statehold by name, a location opened anew, paths, counts), never a stored file's bytes.
A worker never imports the caller's ``__main__``, as multiprocessing's spawn does: a
script calling `repartition` without an ``if __name__ == "__main__"`` guard would run
again in each of its workers, its side effects with it.
"""

from __future__ import annotations

import os
import pickle
import selectors
import struct
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from statehold.spark_checkpoints.errors import SparkCheckpointError

_SIZE = struct.Struct(">Q")


class Workers:
    """`count` worker processes; `map` runs calls on them, its results in order."""

    def __init__(self, count: int) -> None:
        package_root = str(Path(__file__).resolve().parents[2])  # where statehold is
        paths = [package_root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
        self._procs = [
            subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, env=env)
            for _ in range(count)
        ]

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def map(self, fn: Callable[..., Any], *iterables: Iterable[Any]) -> Iterator[Any]:
        """`fn` of each tuple of `iterables`' items, a call per free worker at a time; the
        results in the calls' order, once all are done. The first call's error is raised
        here, once the calls under way have answered (no call is started after it)."""
        calls = list(enumerate(zip(*iterables, strict=True)))
        results: list[Any] = [None] * len(calls)
        waiting = iter(calls)
        busy: dict[int, int] = {}  # a worker's index -> the call it runs
        error: BaseException | None = None
        with selectors.DefaultSelector() as selector:
            for i, proc in enumerate(self._procs):
                selector.register(_out(proc), selectors.EVENT_READ, i)
                self._give(i, fn, waiting, busy)
            while busy:
                for key, _events in selector.select():
                    i = key.data
                    call = busy.pop(i)
                    ok, value = _receive(_out(self._procs[i]))
                    if not ok:
                        error = error or value
                        selector.unregister(key.fileobj)
                    else:
                        results[call] = value
                        if error is None:
                            self._give(i, fn, waiting, busy)
        if error is not None:
            raise error
        return iter(results)

    def _give(self, i: int, fn: Callable[..., Any], waiting: Iterator[tuple[int, Any]],
              busy: dict[int, int]) -> None:
        call = next(waiting, None)
        if call is not None:
            busy[i] = call[0]
            _send(_in(self._procs[i]), (fn, call[1]))

    def close(self) -> None:
        """Each worker told to end, then waited for (killed if it does not)."""
        for proc in self._procs:
            try:
                _send(_in(proc), None)
                _in(proc).close()
            except OSError:
                pass
        for proc in self._procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            _out(proc).close()


def _in(proc: subprocess.Popen[bytes]) -> IO[bytes]:
    assert proc.stdin is not None
    return proc.stdin


def _out(proc: subprocess.Popen[bytes]) -> IO[bytes]:
    assert proc.stdout is not None
    return proc.stdout


def _send(stream: IO[bytes], message: Any) -> None:
    data = pickle.dumps(message)
    stream.write(_SIZE.pack(len(data)) + data)
    stream.flush()


def _receive(stream: IO[bytes]) -> Any:
    """A message; a worker's end (its stream closed) as an error."""
    head = stream.read(_SIZE.size)
    data = stream.read(_SIZE.unpack(head)[0]) if len(head) == _SIZE.size else b""
    if not data:
        return False, SparkCheckpointError("a worker process ended before its call did")
    return pickle.loads(data)


def main() -> None:
    """A worker: calls from standard input until told to end; each call's result, or
    its error, written back. Anything else printed goes to standard error."""
    calls = sys.stdin.buffer
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    while True:
        head = calls.read(_SIZE.size)
        if len(head) < _SIZE.size:
            return
        message = pickle.loads(calls.read(_SIZE.unpack(head)[0]))
        if message is None:
            return
        fn, args = message
        try:
            answer: tuple[bool, Any] = (True, fn(*args))
        except Exception as e:
            answer = (False, e)
        try:
            _send(answers, answer)
        except (pickle.PicklingError, TypeError, AttributeError):
            _send(answers, (False, SparkCheckpointError(f"{type(answer[1]).__name__}: "
                                                        f"{answer[1]}")))


if __name__ == "__main__":
    main()
