"""One driver per journal: a lock file with owner, host, pid and a heartbeat.

:class:`JournalLock` guards a local checkpoint journal ``loop.jsonl`` with ``loop.jsonl.lock``,
a small JSON file naming the driver that holds it (a random owner token, host, pid, start time
and a heartbeat, refreshed by a daemon thread every quarter of the timeout). A second driver,
in another process or in this one, is refused at once with a
:class:`~dask_research.exceptions.CheckpointError` that names the holder. A lock is *stale*,
and is taken over with a :class:`JournalLockWarning`, when its heartbeat is older than
``research.experiments.lock-timeout`` seconds, or when its pid is dead on this host.

Every read-and-write of the lock file happens under ``fcntl.flock`` of that file, so two
drivers that race for a free or stale lock cannot both win. A free lock is an empty file (the
file is never deleted: deleting a file that another process has open and is about to lock lets
two processes hold "the" lock). A driver whose lock was taken over while it was paused (a
frozen or suspended process) notices before its next journal write and stops with a
:class:`CheckpointError` rather than write into the other driver's journal.

Journals at fsspec URLs other than local files are not locked (object stores offer no atomic
create-or-fail through fsspec here): one driver per remote journal is the caller's duty.

Examples
--------
>>> import os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "loop.jsonl")
>>> first = JournalLock(path)
>>> first.acquire()
>>> try:
...     JournalLock(path).acquire()
... except Exception as exc:
...     print(type(exc).__name__, "in use by another driver" in str(exc))
CheckpointError True
>>> first.release()
>>> JournalLock(path).acquire()         # free again
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import threading
import time
import uuid
import warnings
from typing import Any

from .. import config
from ..exceptions import CheckpointError

__all__ = ["JournalLock", "JournalLockWarning"]


class JournalLockWarning(UserWarning):
    """A stale journal lock (dead pid, or heartbeat older than the timeout) was taken over."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:          # alive, owned by someone else
        return True
    return True


def describe(holder: dict[str, Any], now: float | None = None) -> str:
    """``pid 123 on host node1 (owner 3f2a..., heartbeat 0.4 s ago)``."""
    now = time.time() if now is None else now
    beat = holder.get("heartbeat")
    age = f"{now - beat:.1f} s ago" if isinstance(beat, (int, float)) else "never"
    return (f"pid {holder.get('pid')} on host {holder.get('host')!s} "
            f"(owner {str(holder.get('owner'))[:8]}, started {holder.get('started')}, "
            f"heartbeat {age})")


class JournalLock:
    """Exclusive, heartbeated lock of one local journal (``<journal>.lock``).

    Parameters
    ----------
    journal : str
        Path of the journal (a local file).
    timeout : float, optional
        Seconds after which a lock whose heartbeat stopped is stale
        (``research.experiments.lock-timeout``).
    """

    def __init__(self, journal: str, timeout: float | None = None):
        self.journal = journal
        self.path = journal + ".lock"
        self.timeout = float(config.get("experiments.lock-timeout", timeout))
        if not self.timeout > 0:
            raise CheckpointError(journal, f"research.experiments.lock-timeout={self.timeout!r} "
                                           "is invalid; expected a number of seconds > 0")
        self.interval = self.timeout / 4
        self.owner = uuid.uuid4().hex
        self.host = socket.gethostname()
        self.held = False
        self.lost: dict[str, Any] | None = None
        self._verified = 0.0
        self._started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._mutex = threading.Lock()

    def __repr__(self) -> str:
        return f"JournalLock({self.path!r}, held={self.held})"

    # -- the lock file, under flock --------------------------------------------------------
    def _locked(self, fn: Any) -> Any:
        folder = os.path.dirname(self.path)
        if folder:
            os.makedirs(folder, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            with os.fdopen(os.dup(fd), "r+b") as f:
                data = f.read()
                try:
                    holder = json.loads(data) if data.strip() else None
                except ValueError:
                    holder = None               # a torn lock file holds nothing
                if not isinstance(holder, dict):
                    holder = None
                return fn(f, holder)
        finally:
            os.close(fd)                        # closing releases the flock

    def _mine(self) -> dict[str, Any]:
        return {"owner": self.owner, "host": self.host, "pid": os.getpid(),
                "started": self._started, "heartbeat": time.time(), "journal": self.journal,
                "timeout": self.timeout}

    @staticmethod
    def _put(f: Any, record: dict[str, Any] | None) -> None:
        f.seek(0)
        f.truncate()
        if record is not None:
            f.write(json.dumps(record).encode("utf-8"))
        f.flush()
        os.fsync(f.fileno())

    def stale_reason(self, holder: dict[str, Any], now: float | None = None) -> str | None:
        """Why ``holder``'s lock is stale, or ``None`` while it is alive."""
        now = time.time() if now is None else now
        beat = holder.get("heartbeat")
        if not isinstance(beat, (int, float)) or now - beat > self.timeout:
            return f"its heartbeat is older than {self.timeout:g} s"
        pid = holder.get("pid")
        if holder.get("host") == self.host and isinstance(pid, int) and not _pid_alive(pid):
            return f"pid {pid} is no longer running on this host"
        return None

    # -- public ----------------------------------------------------------------------------
    def acquire(self) -> None:
        """Take the lock, or raise :class:`CheckpointError` naming the driver holding it."""
        if self.held:
            return

        def take(f: Any, holder: dict[str, Any] | None) -> tuple[str, Any] | None:
            if holder is not None and holder.get("owner") != self.owner:
                reason = self.stale_reason(holder)
                if reason is None:
                    return ("busy", holder)
                self._put(f, self._mine())
                return ("stale", (holder, reason))
            self._put(f, self._mine())
            return None

        try:
            outcome = self._locked(take)
        except OSError as exc:
            raise CheckpointError(self.journal, f"cannot lock it: {self.path}: "
                                                f"{exc.strerror or exc}; the journal's folder "
                                                "must be writable") from None
        if outcome is not None and outcome[0] == "busy":
            raise CheckpointError(
                self.journal, f"is in use by another driver: {describe(outcome[1])}; one "
                "IterationScheduler per journal. Wait for it to finish or stop it; a lock "
                f"whose heartbeat is older than {self.timeout:g} s "
                "(research.experiments.lock-timeout), or whose pid is dead on its host, is "
                f"taken over ({self.path})")
        if outcome is not None:
            holder, reason = outcome[1]
            warnings.warn(f"checkpoint {self.journal}: took over the lock of {describe(holder)}"
                          f", because {reason}", JournalLockWarning, stacklevel=3)
        self.held, self.lost = True, None
        self._verified = time.monotonic()
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name=f"journal-lock-{self.owner[:6]}",
                                        daemon=True)
        self._thread.start()

    def _refresh(self) -> bool:
        """Heartbeat: True while the lock is still ours (else ``lost`` names the new holder)."""
        def beat(f: Any, holder: dict[str, Any] | None) -> dict[str, Any] | None:
            if holder is None or holder.get("owner") != self.owner:
                return holder or {"owner": None, "host": None, "pid": None}
            self._put(f, self._mine())
            return None

        with self._mutex:
            if not self.held:
                return False
            other = self._locked(beat)
            if other is not None:
                self.held, self.lost = False, other
                return False
            self._verified = time.monotonic()
            return True

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                if not self._refresh():
                    return
            except OSError:            # a full disk or a vanished folder: try again next beat
                continue

    def ensure(self) -> None:
        """Before a journal write: raise :class:`CheckpointError` if the lock was taken over.

        The lock file is read again when the last check is older than half a heartbeat
        interval (after a pause of this process, always), else this costs nothing.
        """
        if self.held and time.monotonic() - self._verified > self.interval / 2:
            self._refresh()
        if not self.held:
            if self.lost is not None:
                raise CheckpointError(
                    self.journal, "this driver's lock was taken over by "
                    f"{describe(self.lost)} (no heartbeat for {self.timeout:g} s: was this "
                    "process paused?); stopping without writing another record")
            self.acquire()

    def release(self) -> None:
        """Give the lock up (the lock file is emptied, never deleted)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.interval + 1.0)
        with self._mutex:
            if not self.held:
                return
            self.held = False

            def free(f: Any, holder: dict[str, Any] | None) -> None:
                if holder is not None and holder.get("owner") == self.owner:
                    self._put(f, None)

            try:
                self._locked(free)
            except OSError:
                pass                   # the folder is gone: nothing left to free
