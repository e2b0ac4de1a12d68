"""One writer per run: the lease ``runs/<id>/lease.json``, its heartbeat and its take-over.

A second client of the same job on the same store waits for the first (saying once who holds
the run), then resumes from what it stored; a holder presumed dead is taken over, and a writer
that was taken over stops before its next write instead of writing next to the new holder.

Examples
--------
>>> import tempfile
>>> from dask_research.montecarlo.store import RunStore
>>> store = RunStore(tempfile.mkdtemp())
>>> with store.lease("ab" * 32, timeout=60) as lease:
...     lease.holder()["token"] == lease.token
True
>>> store.lease("ab" * 32).holder() is None
True
"""
from __future__ import annotations

import contextlib
import getpass
import json
import os
import posixpath
import socket
import stat
import sys
import threading
import time
import uuid
from typing import Any

from ...exceptions import StoreError
from ..address import canonical_json
from .files import Exists, StoreFiles, oserror
from .layout import LEASE_FORMAT, finite_json, redact

__all__ = ["Lease"]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


class Lease:
    """The one-writer lease of a run: ``runs/<id>/lease.json`` with owner, host, pid, heartbeat.

    Created exclusively (local stores: written whole, then hard-linked into place, which fails if
    a lease exists; other protocols: write then read back, the best an object store offers),
    refreshed by a heartbeat thread every quarter of ``research.montecarlo.lease-timeout``
    while the run lives, removed at the end.

    Staleness is judged by *this process's own monotonic clock*, never by the heartbeat's
    timestamp (another host's clock, or a forged file): a lease whose content has not changed
    for ``lease-timeout`` seconds of our own observation is stale, and so is one whose holder
    is a dead process on this host. A future, NaN or missing heartbeat is just content that
    does not change. Taking over happens under ``runs/<id>/lease.lock`` (``flock``) and
    renames the lease aside first, proceeding only if the renamed file is the one judged
    stale (else it is put back), so two takers never both win. The heartbeat's read-check-write
    holds the same lock. While the lease is held, every write of the store into the run first
    checks that the lease file still carries this lease's token (:meth:`check_held`): a writer
    presumed dead and taken over stops instead of writing next to the new holder.

    While another live writer holds it, :meth:`acquire` waits (saying once who holds it), at
    most ``research.montecarlo.lease-wait`` seconds (``None``: as long as the holder lives).

    ``registry`` (a :class:`~.runstore.RunStore`'s ``leases``) holds the lease, by run id, while
    it is held: the store checks it before each write into the run.
    """

    POLL = 0.25

    def __init__(self, files: StoreFiles, run_id: str, *, registry: dict[str, Lease] | None = None,
                 timeout: float | None = None, wait: float | None = None, announce=None):
        from ... import config

        self.files, self.run_id = files, run_id
        self.registry: dict[str, Lease] = {} if registry is None else registry
        self.path = files.path(run_id, "lease.json")
        self.lock_path = files.path(run_id, "lease.lock")
        self.timeout = float(config.get("montecarlo.lease-timeout", timeout))
        if not (self.timeout > 0 and self.timeout != float("inf")):
            raise StoreError(files.display(self.path), f"lease-timeout {self.timeout!r} must be a positive, finite "
                             "number of seconds")
        w = config.get("montecarlo.lease-wait", wait)
        self.wait = None if w is None else float(w)
        self.announce = announce if announce is not None else (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.token = uuid.uuid4().hex
        self.waited: dict | None = None  # the holder this lease waited for, if any
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._held = False
        self._lost: dict | None = None   # who took it over, once this lease was lost
        self._seen: tuple[bytes | None, float] | None = None   # (lease content, monotonic time first seen)

    # -- what is in the file ----------------------------------------------------------------
    def _doc(self, started: float) -> dict:
        try:
            user = getpass.getuser()
        except Exception:  # pragma: no cover - no user name in this environment
            user = "?"
        return {"format": LEASE_FORMAT, "run_id": self.run_id, "token": self.token, "owner": user,
                "host": socket.gethostname(), "pid": os.getpid(), "started": started, "heartbeat": time.time()}

    def _raw(self) -> bytes | None:
        """The lease file's bytes (``None``: no lease); a FIFO or device is a StoreError, at once."""
        try:
            if self.files.local:
                return self.files.read_bytes(self.path)
            return self.files.fs.cat_file(self.path)
        except FileNotFoundError:
            return None
        except StoreError:
            raise
        except OSError as e:
            raise StoreError(self.files.display(self.path), f"cannot be read ({oserror(e)})") from None

    @staticmethod
    def _parse(raw: bytes) -> dict:
        try:
            doc = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            doc = None
        if not isinstance(doc, dict):
            # A lease torn by a crash mid-write: stale once it has not changed for the timeout.
            return {"owner": "?", "host": "?", "pid": None, "started": None, "heartbeat": None, "torn": True}
        return doc

    def holder(self) -> dict | None:
        """The lease file's content, or None if nobody holds the run."""
        raw = self._raw()
        return None if raw is None else self._parse(raw)

    def _stale(self, h: dict, raw: bytes | None = None) -> bool:
        """Whether the lease ``h`` (file content ``raw``) is stale, by our own monotonic clock."""
        now = time.monotonic()
        key = raw if raw is not None else canonical_json(finite_json(h)).encode()
        if self._seen is None or self._seen[0] != key:
            self._seen = (key, now)        # new content: the holder is alive as of now
        if now - self._seen[1] >= self.timeout:
            return True
        pid = h.get("pid")
        return (h.get("host") == socket.gethostname() and isinstance(pid, int) and not isinstance(pid, bool)
                and pid != os.getpid() and pid > 0 and not _pid_alive(pid))

    @staticmethod
    def describe(h: dict) -> str:
        started = h.get("started")
        ok = isinstance(started, (int, float)) and not isinstance(started, bool) and 0 <= started < 1e11
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)) if ok else "?"
        try:
            beat: Any = h.get("heartbeat")   # anything: what is not a number is caught below
            ago = time.time() - float(beat)
            # Another host's clock, or a forged value: a future or non-finite heartbeat is not a time.
            age = f", heartbeat {ago:.0f} s ago by its clock" if 0 <= ago < 1e9 else ", heartbeat unknown"
        except (TypeError, ValueError, OverflowError):
            age = ", heartbeat unknown"
        return f"{h.get('owner', '?')} on host {h.get('host', '?')}, pid {h.get('pid', '?')} (since {when}{age})"

    @contextlib.contextmanager
    def _locked(self):
        """``flock`` on ``runs/<id>/lease.lock`` (local stores; elsewhere a no-op)."""
        st = self.files
        if not st.local:
            yield
            return
        import fcntl

        pfd, name = st.open_parent(self.lock_path)
        try:
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644, dir_fd=pfd)
        except OSError as e:
            os.close(pfd)
            raise StoreError(st.display(self.lock_path), f"cannot be opened ({oserror(e)})") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise StoreError(st.display(self.lock_path), "is not a regular file (remove it)")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError:      # no locks on this file system: the rename-and-check below still holds
                pass
            yield
        finally:
            os.close(fd)         # closing drops the lock
            os.close(pfd)

    # -- taking it --------------------------------------------------------------------------
    def _try_create(self, doc: dict) -> bool:
        st, data = self.files, json.dumps(doc).encode()
        if st.local:
            try:
                st.write_local(self.path, data, overwrite=False)   # tmp + hard link: whole or absent
            except Exists:
                return False
            return True
        if st.fs.exists(self.path):
            return False
        st.fs.makedirs(posixpath.dirname(self.path), exist_ok=True)
        st.fs.pipe_file(self.path, data)
        h = self.holder()                     # the last writer of a race wins; the others see its token
        return h is not None and bool(h) and h.get("token") == self.token

    def _take_over(self, seen: bytes | None = None) -> bool:
        """Remove the stale lease whose content was ``seen``; False if it changed meanwhile."""
        st = self.files
        if not st.local:
            try:
                if seen is None or st.fs.cat_file(self.path) == seen:
                    st.fs.rm(self.path)
                    return True
            except FileNotFoundError:
                return True
            return False
        with self._locked():
            parent, name = posixpath.split(self.path)
            aside = f"{name}.stale-{uuid.uuid4().hex[:8]}"
            pfd = st.open_dir(parent, create=False)
            try:
                try:
                    os.rename(name, aside, src_dir_fd=pfd, dst_dir_fd=pfd)   # one taker wins the rename
                except FileNotFoundError:
                    return True
                try:
                    again = st.read_bytes(posixpath.join(parent, aside))
                except (StoreError, OSError):
                    again = None
                if seen is not None and again != seen:
                    # Not the lease judged stale (its holder beat, or another taker already
                    # replaced it): put it back unless yet another lease took its place.
                    try:
                        os.link(aside, name, src_dir_fd=pfd, dst_dir_fd=pfd, follow_symlinks=False)
                    except OSError:
                        pass
                    return False
                return True
            finally:
                try:
                    os.unlink(aside, dir_fd=pfd)
                except OSError:
                    pass
                os.close(pfd)

    def acquire(self) -> Lease:
        started, t0, said = time.time(), time.monotonic(), False
        while True:
            if self._try_create(self._doc(started)):
                break
            raw = self._raw()
            if raw is None:
                continue
            h = self._parse(raw)
            if self._stale(h, raw):
                since = self._seen[1] if self._seen is not None else time.monotonic()   # _stale set it
                self.announce(f"{self.files.display(self.path)}: taking over a stale lease of {self.describe(h)} "
                              f"(unchanged for {time.monotonic() - since:.0f} s here, or its process is dead)")
                self._take_over(raw)
                self._seen = None
                continue
            if not said:
                self.waited = h
                self.announce(f"run {self.run_id[:12]} in {redact(self.files.url)} is being written by another run: "
                              f"{self.describe(h)}; waiting for it, then resuming from what it stored "
                              f"(taken over if its lease does not change for {self.timeout:g} s)")
                said = True
            if self.wait is not None and time.monotonic() - t0 > self.wait:
                raise StoreError(self.files.display(self.path), f"run {self.run_id[:12]} is held by another run: "
                                 f"{self.describe(h)}; gave up after waiting {self.wait:g} s "
                                 "(research.montecarlo.lease-wait)")
            time.sleep(self.POLL)
        self._held, self._lost = True, None
        self.registry[self.run_id] = self
        self._thread = threading.Thread(target=self._beat, args=(started,), daemon=True,
                                        name=f"dask-research-lease-{self.run_id[:8]}")
        self._thread.start()
        return self

    def check_held(self, path: str | None = None) -> None:
        """Raise :class:`StoreError` unless the lease file still carries this lease's token.

        Called by the store before each write into the run (``path``: what was to be written).
        """
        if not self._held:
            return
        if self._lost is None:
            h = self.holder()
            if not h or h.get("token") != self.token:
                self._lost = h or {"owner": "nobody", "host": "?", "pid": "?"}
        if self._lost is not None:
            what = self.files.display(path) if path else self.files.display(self.path)
            raise StoreError(what, f"not written: this writer lost the lease of run {self.run_id[:12]} "
                             f"(presumed dead and taken over; now {self.describe(self._lost)}); it stops here. "
                             "What it stored is kept and the holder, or the same command later, resumes from it")

    def _beat(self, started: float) -> None:
        while not self._stop.wait(self.timeout / 4):
            try:
                with self._locked():      # read-check-write under the lock a taker holds too
                    h = self.holder()
                    if not h or h.get("token") != self.token:
                        self._lost = h or {"owner": "nobody", "host": "?", "pid": "?"}
                        return        # taken over (we were presumed dead): stop claiming it
                    self.files.write_json(self.path, self._doc(started), overwrite=True)
            except Exception:     # a transient store error: try again next beat
                continue

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.registry.get(self.run_id) is self:
            del self.registry[self.run_id]
        if self._held:
            self._held = False
            try:
                with self._locked():
                    h = self.holder()
                    if h and h.get("token") == self.token:
                        self.files.fs.rm(self.path)
            except (OSError, StoreError):
                pass

    def __enter__(self) -> Lease:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
