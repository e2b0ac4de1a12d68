"""Helpers for tests that start and kill real processes.

Examples
--------
>>> wait_for(lambda: True, 1.0, "nothing")
>>> a, b = free_ports(2)                    # two distinct ports nothing listens on right now
>>> a != b and 0 < a < 65536
True
>>> import subprocess, sys
>>> child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
>>> stop_processes([child])
>>> child.returncode is not None
True
"""
from __future__ import annotations

import contextlib
import os
import pathlib
import queue
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["wait_for", "free_ports", "stop_processes", "process_cluster", "ProcessCluster", "WorkerSpec",
           "dask_processes", "subprocess_env", "run_python", "LineProcess", "line_processes", "dies_with_this_process"]

#: Run by :func:`dies_with_this_process`: ask Linux to SIGKILL this process when its parent dies
#: (``PR_SET_PDEATHSIG``, kept across ``exec``), give up if the parent is already gone, then
#: become the command.
_DIE_WITH_PARENT = """
import ctypes, os, signal, sys
parent = int(sys.argv[1])
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)   # PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass
if os.getppid() != parent:
    sys.exit(1)
os.execv(sys.argv[2], sys.argv[2:])
"""


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, poll: float = 0.05) -> None:
    """Poll ``predicate`` until it is true; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def free_ports(n: int = 1) -> list[int]:
    """``n`` distinct local TCP ports that were free a moment ago (held open together while
    chosen, so they differ); an address on one of them is also one that refuses connections."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def stop_processes(procs: list[subprocess.Popen], timeout: float = 15.0) -> None:
    """Stop ``procs`` gracefully, last started first, one after another: SIGTERM, then wait
    up to ``timeout`` seconds and kill it if it still runs. One after another, so that a worker
    closes while its scheduler still answers (signalled together, workers on a busy machine
    spent their whole ``timeout`` trying to say goodbye to a scheduler that had gone)."""
    for p in reversed(procs):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)


def dies_with_this_process(argv: Sequence[str]) -> list[str]:
    """``argv`` run so that it is killed when this process dies, however it dies.

    A test killed by its timeout (``os._exit`` from pytest-timeout's thread), by a signal or by
    CI leaves no ``finally`` to run: the ``dask scheduler`` and ``dask worker`` processes it started
    lived on, each using the 2-core machine's CPU for the rest of the suite. On Linux the child
    asks the kernel to kill it with its parent (``PR_SET_PDEATHSIG``); elsewhere the command
    runs as it would alone. ``argv[0]`` must be a path (``sys.executable``), not a name to look up.

    >>> import subprocess, sys
    >>> cmd = dies_with_this_process([sys.executable, "-c", "print('ran')"])
    >>> subprocess.run(cmd, capture_output=True, text=True).stdout
    'ran\\n'
    """
    if not sys.platform.startswith("linux"):
        return list(argv)
    return [sys.executable, "-c", _DIE_WITH_PARENT, str(os.getpid()), *argv]


@dataclass(frozen=True)
class WorkerSpec:
    """One ``dask worker`` process of :func:`process_cluster`: variables added to its
    environment, a command it runs under (``["ip", "netns", "exec", NS]``), the address it
    listens on (default: the cluster's host), the scheduler address it connects to (default:
    the scheduler's own, from its file; a proxy's, say) and more ``dask worker`` arguments."""

    env: Mapping[str, str] = field(default_factory=dict)
    prefix: Sequence[str] = ()
    host: str | None = None
    scheduler: str | None = None
    args: Sequence[str] = ()


@dataclass
class ProcessCluster:
    """What :func:`process_cluster` yields: a client and the real processes behind it."""

    client: Any
    scheduler: subprocess.Popen
    workers: list[subprocess.Popen]


@contextlib.contextmanager
def process_cluster(where: pathlib.Path, workers: int | Sequence[WorkerSpec] = 2, *, nthreads: int = 1,
                    nanny: bool = False, host: str = "127.0.0.1", scheduler_port: int = 0,
                    timeout: float = 60.0, cwd: pathlib.Path | None = None) -> Iterator[ProcessCluster]:
    """A real ``dask scheduler`` and one ``dask worker`` per entry of ``workers`` (or that many
    plain ones), each with ``nthreads`` threads, the one cluster of real processes every fault
    test starts.

    Without a nanny a killed worker stays dead (what a fault test wants). The processes run with
    this environment and the checkout first on ``PYTHONPATH`` (:func:`subprocess_env`), log to
    ``where/scheduler.log`` and ``where/worker<i>.log``, and are killed on the way out (a frozen
    one is continued first: a stopped process cannot die of SIGKILL until it runs). ``cwd``:
    the processes' working directory (default: this process's).
    """
    from distributed import Client

    specs = [WorkerSpec() for _ in range(workers)] if isinstance(workers, int) else list(workers)
    env = subprocess_env()
    sfile = where / "scheduler.json"
    sfile.unlink(missing_ok=True)
    logs = [open(where / "scheduler.log", "wb")]
    scheduler = subprocess.Popen(dies_with_this_process(
                                     [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", host,
                                      "--port", str(scheduler_port), "--no-dashboard", "--scheduler-file", str(sfile)]),
                                 env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=logs[0])
    procs: list[subprocess.Popen] = []
    client = None
    try:
        wait_for(lambda: sfile.exists() and sfile.stat().st_size > 0, timeout, "the scheduler file")
        for i, spec in enumerate(specs):
            logs.append(open(where / f"worker{i}.log", "wb"))
            procs.append(subprocess.Popen(
                [*spec.prefix, *dies_with_this_process(
                    [sys.executable, "-m", "distributed.cli.dask_worker",
                     *([spec.scheduler] if spec.scheduler else ["--scheduler-file", str(sfile)]),
                     *([] if "--listen-address" in spec.args else ["--host", spec.host or host]),
                     "--nthreads", str(nthreads), "--no-dashboard", "--name", f"w{i}", *spec.args]
                    + ([] if nanny else ["--no-nanny"]))],
                env={**env, **spec.env}, cwd=cwd, stdout=subprocess.DEVNULL, stderr=logs[-1]))
        client = Client(scheduler_file=str(sfile), set_as_default=False, timeout=timeout)
        if specs:                              # none: a scheduler whose workers a test starts itself
            client.wait_for_workers(len(specs), timeout=timeout)
        yield ProcessCluster(client, scheduler, procs)
    finally:
        if client is not None:
            with contextlib.suppress(Exception):
                client.close(timeout=5)
        for p in [*procs, scheduler]:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGCONT)
                    p.kill()
            p.wait(timeout=10)
        for log in logs:
            log.close()


@contextlib.contextmanager
def dask_processes(where: pathlib.Path, n_workers: int = 2, nanny: bool = False,
                   timeout: float = 60.0) -> Iterator[tuple[Any, list[subprocess.Popen]]]:
    """:func:`process_cluster` with ``n_workers`` one-thread workers; yields
    ``(client, worker_processes)``."""
    with process_cluster(where, n_workers, nanny=nanny, timeout=timeout) as cluster:
        yield cluster.client, cluster.workers


def subprocess_env() -> dict[str, str]:
    """This environment with the checkout that holds ``dask_research`` first on ``PYTHONPATH``,
    so a child process imports the same code as the test that starts it."""
    import dask_research

    env = dict(os.environ)
    root = str(pathlib.Path(dask_research.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in [root, env.get("PYTHONPATH", "")] if p)
    return env


def run_python(code: str, cwd: Any, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``code`` (dedented) in a fresh ``python -c`` in ``cwd``; output captured as text."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], cwd=cwd, env=subprocess_env(),
                          capture_output=True, text=True, timeout=timeout)


class LineProcess:
    """A child process spoken to line by line: :meth:`send` writes a line to its stdin, and
    :meth:`next_line` / :meth:`expect` read its stdout, each waiting at most ``bound`` seconds
    before failing the test (a child that hangs fails it, never hangs it).

    >>> import sys
    >>> p = LineProcess([sys.executable, "-c", "print('ready', flush=True); print(input().upper())"])
    >>> p.expect("ready")
    'ready'
    >>> p.send("hello"); p.next_line()
    'HELLO'
    >>> p.stop()
    """

    EOF = "<eof>"

    def __init__(self, args: list[str], bound: float = 120.0, env: dict[str, str] | None = None):
        self.bound = bound
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=env if env is not None else subprocess_env())
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(self.EOF)

    def next_line(self, bound: float | None = None) -> str:
        """The next line the child prints (an AssertionError if none comes, or it ended)."""
        limit = self.bound if bound is None else bound
        try:
            line = self.lines.get(timeout=limit)
        except queue.Empty:
            raise AssertionError(f"no line from {self.proc.args!r} within {limit} s") from None
        assert line != self.EOF, f"the process ended (exit {self.proc.wait(30)})"
        return line

    def expect(self, prefix: str, bound: float | None = None) -> str:
        """The first line starting with ``prefix`` (earlier ones are skipped)."""
        deadline = time.monotonic() + (self.bound if bound is None else bound)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no line starting {prefix!r} from {self.proc.args!r}")
            line = self.next_line(left)
            if line.startswith(prefix):
                return line

    def send(self, line: str) -> None:
        """Write ``line`` (and a newline) to the child's stdin."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        """Kill the child (continuing it first if it was stopped) and wait for it."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(30)


@contextlib.contextmanager
def line_processes(bound: float = 120.0) -> Iterator[Callable[[list[str]], LineProcess]]:
    """A factory of :class:`LineProcess` children, every one stopped on the way out (a fixture's body).

    >>> import sys
    >>> with line_processes() as start:
    ...     start([sys.executable, "-c", "print('up', flush=True)"]).next_line()
    'up'
    """
    made: list[LineProcess] = []

    def start(args: list[str]) -> LineProcess:
        p = LineProcess(args, bound)
        made.append(p)
        return p

    try:
        yield start
    finally:
        for p in made:
            p.stop()
