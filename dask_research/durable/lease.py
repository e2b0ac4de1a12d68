"""One writer at a time: a lease file with owner, host, pid and heartbeat, judged by the waiter's clock.

:class:`Lease` is the one single-writer protocol of the project (a Monte-Carlo run in its store,
an experiments journal, a replay checkpoint directory). The lease is a small JSON file:

``{"format", "token", "owner", "host", "pid", "started", "heartbeat", "beats", ...}``

- **Taking it** creates the file exclusively (written whole to a temporary name, then
  hard-linked into place, or renamed with ``RENAME_NOREPLACE`` where there are no hard links:
  it is whole or absent, and of two creators exactly one wins).
- **Holding it**: a daemon thread rewrites it every quarter of ``timeout`` or every
  :data:`MAX_BEAT` seconds, whichever is sooner (atomically; ``beats`` counts up, so its
  content changes at every beat whatever any clock says), and writes that interval into the
  lease as ``beat``.
  Before each write into what it guards, the holder calls :meth:`Lease.check_held`, which
  re-reads the file when its last look is older than half a beat (so always after this process
  was paused, or its machine suspended: :func:`clock`) and stops the writer with the
  capability's error if the lease now carries another token.
- **Judging a holder** happens only by the *waiting* process's own monotonic clock, never by the
  heartbeat the file claims (another host's clock, or a forged or skewed value: a heartbeat in
  the future, ``NaN`` or an hour ahead holds nothing): a lease whose bytes have not changed for
  ``timeout`` seconds of the waiter's observation is stale; so is one whose process is dead on
  this host, one that is torn or empty (an empty file is how earlier versions released a
  lock). A lease is alive once the waiter has seen it change. A waiter set to a shorter
  ``timeout`` than four of the holder's beats waits that long instead (the lease's ``beat``, at
  most :data:`MAX_BEAT`): a live holder is never taken for dead because the two processes were
  configured differently, and a forged ``beat`` delays a waiter by at most ``4 * MAX_BEAT``.
  (A lease without ``beat``, written by an earlier version, is judged by the waiter's
  ``timeout`` alone: give both sides the same setting while versions are mixed.)
- **Taking over** a stale lease renames it aside under a brief ``flock`` of a separate lock
  file (which the heartbeat's read-check-write holds too), only if it still is the one judged
  stale when read under that lock, and goes on only if the file renamed is that one (else it is
  put back): two takers never both win, and a holder that beat meanwhile keeps its lease.
  The taker then leaves a note, ``<lease>.taken`` (the token it took over and who took it),
  so that a writer woken after its taker has finished can still say who took its lease.
- **Waiting**: while a live holder has it, :meth:`Lease.acquire` waits at most ``wait`` seconds
  (``None``: as long as the holder lives; ``0``: refuse as soon as the holder is shown alive),
  saying once who holds it; with ``wait=0`` a second lease object of this process on the same
  file is refused at once.

On object stores (no ``flock``, no atomic create) the lease is best effort: write, then read
back; the last writer of a race wins and the others see its token.

Examples
--------
>>> import tempfile
>>> from dask_research.durable import Files, Lease
>>> from dask_research.exceptions import StoreError
>>> files = Files(tempfile.mkdtemp(), error=StoreError)
>>> with Lease(files, files.join("lease.json"), label="run ab12", timeout=30) as lease:
...     lease.holder()["token"] == lease.token
True
>>> Lease(files, files.join("lease.json"), label="run ab12", timeout=30).holder() is None
True
"""
from __future__ import annotations

import contextlib
import getpass
import math
import os
import posixpath
import socket
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from typing import Any

from . import jsondoc
from .files import Files, printable

__all__ = ["Lease", "pid_alive", "describe_holder", "LEASE_CAP", "MAX_BEAT", "POLL"]

#: Most bytes a lease file may have (its writer refuses more, its readers read no more).
LEASE_CAP = 64 * 1024
#: Seconds between two looks of a waiting process.
POLL = 0.25


def clock() -> float:
    """Seconds on a clock that goes on while the machine is suspended (``CLOCK_BOOTTIME`` on
    Linux; ``time.monotonic`` elsewhere). A holder asks it whether its last look at its lease is
    recent: after a suspend, ``time.monotonic`` says it is, while another host may have taken
    the lease over meanwhile.

    >>> a = clock(); clock() >= a
    True
    """
    return time.clock_gettime(_BOOTTIME) if _BOOTTIME is not None else time.monotonic()


_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", None)

#: Longest interval between a holder's heartbeats (seconds), whatever its ``timeout``: a waiter
#: set to a shorter timeout than the holder's must still see a live holder's lease change.
MAX_BEAT = 5.0

# Leases held by this process, by file: a second lease on the same file is refused at once.
_HELD: dict[str, weakref.ref] = {}
# Reentrant: a collected writer's finalizer (``weakref.finalize(..., release)``) can run in this
# thread at any allocation, also while the guard is held by a registration.
_HELD_GUARD = threading.RLock()


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (one owned by another user counts).

    >>> pid_alive(os.getpid())
    True
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:          # EPERM: alive, another user's
        return True
    return True


def _text(value: Any, limit: int = 64) -> str:
    """A holder's field as printable text (a hostile lease cannot put escapes on a terminal)."""
    return printable(value if isinstance(value, str) else "?" if value is None else repr(value), limit)


def _valid_pid(pid: Any) -> int | None:
    return pid if isinstance(pid, int) and not isinstance(pid, bool) and 0 < pid < 2**31 else None


def describe_holder(h: dict[str, Any] | None) -> str:
    """Who holds a lease, as a person reads it: ``user on host H, pid P (since ..., heartbeat ...)``.

    Fields that are missing or not what a lease writes are shown as ``?``; the heartbeat's age
    is the holder's own clock's claim, said so, and only when it is a plausible time.

    >>> describe_holder({"owner": "ada", "host": "n1", "pid": 42, "started": 0, "heartbeat": float("nan")})
    'ada on host n1, pid 42 (since 1970-01-01T00:00:00Z, heartbeat unknown)'
    >>> describe_holder(None)
    'nobody (the lease file is gone)'
    """
    if h is None:
        return "nobody (the lease file is gone)"
    if h.get("torn"):
        return "an unreadable lease (torn or not a lease: written by a crash or by someone else)"
    if h.get("empty"):
        return "an empty lease file (released by an earlier version)"
    started = h.get("started")
    ok = isinstance(started, (int, float)) and not isinstance(started, bool) and 0 <= started < 1e11
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)) if ok else "?"
    beat = h.get("heartbeat")
    age = "heartbeat unknown"
    if isinstance(beat, (int, float)) and not isinstance(beat, bool) and 0 <= beat < 1e11:
        ago = time.time() - float(beat)      # compared first: 10**400 has no float
        if 0 <= ago < 1e9:
            age = f"heartbeat {ago:.0f} s ago by its clock"
    pid = _valid_pid(h.get("pid"))
    return (f"{_text(h.get('owner'))} on host {_text(h.get('host'))}, pid {pid if pid is not None else '?'} "
            f"(since {when}, {age})")


def _say(kind: str, message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Lease:
    """The single-writer lease at ``path`` (see the module docstring).

    Parameters
    ----------
    files : Files
        The files the lease lives among (its errors are their capability's error type).
    path : str
        The lease file.
    lock_path : str, optional
        The lock file its take-over and heartbeat ``flock`` (default ``path + ".lock"``).
    label : str
        What the lease guards, for messages (``"run 3f2a91c0e4b7"``, ``"journal runs/loop.jsonl"``).
    timeout : float
        Seconds of the waiter's own clock after which an unchanged lease is stale.
    wait : float or None
        How long :meth:`acquire` waits for a live holder (``None``: while it lives; ``0``: refuse
        once it is shown alive).
    fmt : str
        The lease file's ``format``.
    extra : dict, optional
        More fields for the lease file (a run id, a journal path).
    announce : callable, optional
        ``announce(kind, message)`` with kind ``"wait"`` (once, when a live-looking holder
        makes this lease wait) or ``"takeover"``; default: print to stderr.
    hint : str
        What a refused writer should do, appended to the refusal.
    """

    def __init__(self, files: Files, path: str, *, label: str, timeout: float, wait: float | None = None,
                 lock_path: str | None = None, fmt: str = "dask-research-lease/1",
                 extra: dict[str, Any] | None = None, announce: Callable[[str, str], None] | None = None,
                 hint: str = ""):
        try:
            self.timeout = float(timeout)
        except (TypeError, ValueError):
            self.timeout = math.nan
        if not (self.timeout > 0 and math.isfinite(self.timeout)):
            raise files.fail(path, f"lease timeout {timeout!r} must be a positive, finite number of seconds")
        if wait is not None:
            try:
                wait = float(wait)
            except (TypeError, ValueError):
                wait = math.nan
            if not wait >= 0:
                raise files.fail(path, f"lease wait {wait!r} must be a number of seconds >= 0, or None")
        self.files, self.path, self.label = files, path, label
        self.lock_path = lock_path if lock_path is not None else path + ".lock"
        self.wait, self.fmt, self.extra, self.hint = wait, fmt, dict(extra or {}), hint
        self.announce = announce or _say
        self.interval = min(self.timeout / 4, MAX_BEAT)
        self.token = uuid.uuid4().hex
        self.held = False
        self.lost: dict[str, Any] | None = None     # the lease file found instead of ours, once lost
        self.waited: dict[str, Any] | None = None   # the holder this lease waited for, if any
        self._lost_flag = False
        self._started = time.time()
        self._beats = 0
        self._verified: float | None = None          # clock() of the last look that found ours
        self._seen: tuple[bytes, float] | None = None
        self.note_path = path + ".taken"
        self._victim: str | None = None              # the token of the lease being taken over
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._mutex = threading.Lock()

    def __repr__(self) -> str:
        return f"Lease({self.files.display(self.path)!r}, held={self.held})"

    @property
    def _key(self) -> str:
        return os.path.realpath(self.path) if self.files.local else self.files.url + "|" + self.path

    # -- the file ---------------------------------------------------------------------------
    def _doc(self) -> dict[str, Any]:
        try:
            user = getpass.getuser()
        except Exception:  # pragma: no cover - no user name in this environment
            user = "?"
        self._beats += 1
        return {"format": self.fmt, **self.extra, "token": self.token, "owner": user,
                "host": socket.gethostname(), "pid": os.getpid(), "started": self._started,
                "heartbeat": time.time(), "beats": self._beats, "beat": self.interval}

    def _raw(self) -> bytes | None:
        """The lease file's bytes (``None``: no lease)."""
        try:
            return self.files.read_bytes(self.path, LEASE_CAP)
        except FileNotFoundError:
            return None

    @staticmethod
    def _parse(raw: bytes) -> dict[str, Any]:
        if not raw.strip():
            return {"empty": True}
        try:
            doc = jsondoc.loads(raw, max_depth=8, constants=True)   # only shown and compared
        except jsondoc.Malformed:
            doc = None
        if not isinstance(doc, dict):
            return {"torn": True}
        return doc

    def holder(self) -> dict[str, Any] | None:
        """The lease file's content (``None``: nobody holds it)."""
        raw = self._raw()
        return None if raw is None else self._parse(raw)

    describe = staticmethod(describe_holder)

    def limit(self, h: dict[str, Any] | None) -> float:
        """Seconds the lease ``h`` must stay unchanged to be stale: this lease's ``timeout``, or four
        of the holder's beats if that is longer (its ``beat``, at most :data:`MAX_BEAT`).

        >>> import tempfile
        >>> from dask_research.exceptions import StoreError
        >>> files = Files(tempfile.mkdtemp(), error=StoreError)
        >>> lease = Lease(files, files.join("lease.json"), label="x", timeout=2)
        >>> lease.limit({"beat": 5.0}), lease.limit({"beat": 0.1}), lease.limit({"beat": 1e300})
        (20.0, 2.0, 20.0)
        >>> lease.limit({}), lease.limit({"beat": "5"})          # no beat: an earlier version's lease
        (2.0, 2.0)
        """
        beat = (h or {}).get("beat")
        if isinstance(beat, bool) or not isinstance(beat, (int, float)) or not beat > 0:
            return self.timeout
        return max(self.timeout, 4 * float(min(beat, MAX_BEAT)))   # min first: 10**400 has no float

    def _stale(self, h: dict[str, Any], raw: bytes) -> str | None:
        """Why the lease ``h`` (bytes ``raw``) is stale, by this process's clock; ``None``: not (yet)."""
        if h.get("empty"):
            return "it is empty (released by an earlier version)"
        now = time.monotonic()
        if self._seen is None or self._seen[0] != raw:
            self._seen = (raw, now)        # new content: its holder was alive as of now
        unchanged = now - self._seen[1]
        if unchanged >= self.limit(h):
            return f"it has not changed for {unchanged:.0f} s by this process's clock"
        pid = _valid_pid(h.get("pid"))
        if h.get("host") == socket.gethostname() and pid is not None and pid != os.getpid() and not pid_alive(pid):
            return f"its process, pid {pid} on this host, is gone"
        return None

    # -- taking it --------------------------------------------------------------------------
    def _try_create(self) -> bool:
        data = jsondoc.dumps(self._doc())
        if self.files.local:
            return self.files.write_bytes(self.path, data, cap=LEASE_CAP)
        if self.files.exists(self.path):
            return False
        self.files.write_bytes(self.path, data, cap=LEASE_CAP, replace=True)
        h = self.holder()               # the last writer of a race wins; the others see its token
        return h is not None and h.get("token") == self.token

    def _take_over(self, seen: bytes) -> bool:
        """Remove the stale lease whose bytes were ``seen``; False if it changed meanwhile."""
        files = self.files
        if not files.local:
            if self._raw() in (seen, None):
                files.remove(self.path)
                return True
            return False
        with files.flock(self.lock_path):
            # Under the lock a lease changes only by its holder's beat or release, or by another
            # taker: if it is not the one judged stale (a taker paused since it judged, and the
            # lease taken over and held anew meanwhile), leave it in place. Renaming it aside to
            # look would leave the name free for a moment, and a waiter could create a second lease.
            if self._raw() != seen:
                return False
            folder, name = posixpath.split(self.path)
            aside = posixpath.join(folder, f"{name}.stale-{uuid.uuid4().hex[:8]}")
            try:
                files.rename(self.path, aside)      # one taker wins the rename
            except Exception:
                if not files.exists(self.path):
                    return True                       # gone already: free
                raise
            try:
                try:
                    again: bytes | None = files.read_bytes(aside, LEASE_CAP)
                except Exception:
                    again = None
                if again != seen:
                    # Not the lease judged stale (its holder beat, or another taker replaced
                    # it): put it back unless yet another lease took its place.
                    if again is not None:
                        files.write_bytes(self.path, again, cap=LEASE_CAP)
                    return False
                return True
            finally:
                files.remove(aside)

    def _register(self) -> None:
        key = self._key                    # outside the guard: realpath allocates
        with _HELD_GUARD:
            ref = _HELD.get(key)
            other = ref() if ref is not None else None
            if other is not None and other is not self and other.held and self.wait == 0:
                raise self.files.fail(self.path, f"{self.label} is already held by another writer in this process "
                                      f"({describe_holder(other.holder())}); {self.hint or 'one writer at a time'}")
            _HELD[key] = weakref.ref(self)

    def acquire(self) -> Lease:
        """Take the lease (waiting, taking over a stale one); raise the capability's error if refused."""
        if self.held:
            return self
        self._register()
        if self.files.local:
            # Its lock file, once: a link or a special file there is refused now, not at the first
            # heartbeat (whose errors are retried silently, so the lease would just go stale).
            with self.files.flock(self.lock_path):
                pass
        t0, said, first = time.monotonic(), False, None
        while True:
            if self._try_create():
                break
            self._victim = None                  # another process created it first: not our takeover
            raw = self._raw()
            if raw is None:
                continue                         # released between our two looks: try again
            h = self._parse(raw)
            why = self._stale(h, raw)
            if why is not None:
                token = h.get("token")
                self.announce("takeover", f"{self.files.display(self.path)}: taking over the lease of "
                              f"{self.label} held by {describe_holder(h)}, because {why}")
                if self._take_over(raw):         # noted only if this taker removed it, and then creates
                    self._victim = token if isinstance(token, str) else None
                self._seen = None
                continue
            first = raw if first is None else first
            alive = raw != first
            if not said:
                self.waited = h
                self.announce("wait", f"{self.label} is held by {describe_holder(h)}; "
                              + ("waiting for it" if self.wait != 0 else "checking that it is alive")
                              + f" (its lease is taken over if it does not change for {self.limit(h):g} s)")
                said = True
            waited = time.monotonic() - t0
            if self.wait is not None and (alive or self.wait > 0) and waited >= self.wait:
                raise self.files.fail(self.path, f"{self.label} is held by {describe_holder(h)}"
                                      + (", whose lease is alive" if alive else "")
                                      + (f"; gave up after waiting {waited:.0f} s" if self.wait else "")
                                      + (f"; {self.hint}" if self.hint else ""))
            time.sleep(POLL)
        self.held, self.lost, self._lost_flag = True, None, False
        self._verified = clock()
        victim, self._victim = self._victim, None
        if victim is not None:
            self._leave_note(victim)
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat_loop, daemon=True,
                                        name=f"dask-research-lease-{self.token[:8]}")
        self._thread.start()
        return self

    def _leave_note(self, victim: str) -> None:
        """Say, for the writer taken over, who took its lease (only a message: never a reason to stop)."""
        try:
            self.files.write_json(self.note_path, {"token": victim, "by": self.holder()}, cap=LEASE_CAP, replace=True)
        except Exception:
            pass

    def _taker(self) -> dict[str, Any] | None:
        """Who took this lease over, from the taker's note; ``None`` if unknown."""
        try:
            note = self.files.read_json(self.note_path, cap=LEASE_CAP)
        except Exception:             # none, or not one a taker wrote: unknown
            return None
        if not isinstance(note, dict) or note.get("token") != self.token or not isinstance(note.get("by"), dict):
            return None
        return note["by"]

    # -- holding it -------------------------------------------------------------------------
    def _refresh(self) -> bool:
        """One heartbeat: True while the lease is ours (else :attr:`lost` names what is there)."""
        with self._mutex:
            if not self.held:
                return False
            with contextlib.ExitStack() as stack:
                try:
                    stack.enter_context(self.files.flock(self.lock_path, create=False))
                except FileNotFoundError:            # its directory was removed: nothing is held
                    self._lose(None)
                    return False
                h = self.holder()                    # read-check-write, as a taker does
                if h is None or h.get("token") != self.token:
                    self._lose(h)
                    return False
                # Not synced: a heartbeat lost to a power cut only makes the lease look stale, and
                # the flock others wait on is held microseconds instead of an fsync's milliseconds.
                self.files.write_bytes(self.path, jsondoc.dumps(self._doc()), cap=LEASE_CAP, replace=True, sync=False)
            self._verified = clock()
            return True

    def _lose(self, h: dict[str, Any] | None) -> None:
        self.held, self.lost, self._lost_flag = False, h, True

    def _beat_loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                if not self._refresh():
                    return
            except Exception:      # a transient error (a full disk, a slow store): try again next beat
                continue

    def check_held(self, path: str | None = None, fresh: bool = False) -> None:
        """Before a write into what the lease guards: raise the capability's error if it was lost.

        The lease file is read again when the last look is older than half a beat (always after
        this process was paused), else this costs nothing; with ``fresh`` it is read again now
        (for writes rare and large enough that one more small read each is nothing). ``path``:
        what was to be written.
        """
        if self.held and (fresh or self._verified is None
                          or clock() - self._verified > self.interval / 2):
            with self._mutex:
                if self.held:
                    h = self.holder()
                    if h is None or h.get("token") != self.token:
                        self._lose(h)
                    else:
                        self._verified = clock()
        if self._lost_flag:
            taker = self._taker() if self.lost is None else None
            now = (describe_holder(self.lost) if taker is None
                   else f"nobody: it was taken over by {describe_holder(taker)}, which has let it go since")
            raise self.files.fail(path or self.path, f"not written: this writer lost the lease of {self.label} "
                                  f"(presumed dead and taken over: its lease had not changed for the taker's limit, was "
                                  f"this process paused?); held now by {now}. It stops here; what it wrote is kept")

    def release(self) -> None:
        """Stop the heartbeat and remove the lease file if it is still ours."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.interval + 5.0)
        key = self._key
        with _HELD_GUARD:
            ref = _HELD.get(key)
            if ref is not None and ref() is self:
                del _HELD[key]
        with self._mutex:
            if not self.held:
                return
            self.held = False
            try:
                with self.files.flock(self.lock_path, create=False):
                    h = self.holder()
                    if h is not None and h.get("token") == self.token:
                        self.files.remove(self.path)
            except Exception:      # the folder is gone, or unreadable: nothing left to free
                pass

    def __enter__(self) -> Lease:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()
