"""One driver per journal: the journal's :class:`~dask_research.durable.Lease`.

A scheduler with a ``checkpoint`` holds the lease of its journal while it drives it. Next to
``runs/loop.jsonl``:

- ``loop.jsonl.lease``, the lease: a small JSON file naming the driver (owner, host, pid,
  start, heartbeat and a beat count), rewritten whole by a daemon thread every quarter of
  ``research.experiments.lock-timeout`` (default 30 s) or every 5 s, whichever is sooner, removed when the driver lets go;
- ``loop.jsonl.lock``, the file whose ``flock`` the lease's take-over and heartbeat hold. Its
  content is never read or written, so a lock file left by an earlier version of this module
  (empty, or holding a dead driver's JSON) holds nothing.

The rules are those of :mod:`dask_research.durable.lease`, the same for every capability:

- a second driver is refused with :class:`~dask_research.exceptions.CheckpointError` naming the
  holder (owner, host, pid) as soon as the holder is shown alive (its lease changed while this
  process watched: within a heartbeat); a second driver in this process is refused at once;
- a lease is stale, and is taken over with a :class:`JournalLockWarning`, when its process on
  this host is gone (at once), or when its bytes have not changed for ``lock-timeout`` seconds
  of the *waiting* process's own clock (a frozen driver, a driver on another host that died, a
  forged, future or ``NaN`` heartbeat: whatever the file claims);
- a driver whose lease was taken over while it was paused stops before its next journal write,
  with a :class:`CheckpointError` naming the driver that holds it now, or, if that one has
  finished meanwhile, the driver that took it over (from the taker's note,
  ``loop.jsonl.lease.taken``);
- the lease, its lock file and the journal are opened without following links and only as
  regular files: a link or a FIFO planted there is refused by name, the file it points to
  untouched.

Journals at fsspec URLs other than local files get the layer's best-effort lease (write, then
read back; no ``flock`` on object stores).

Examples
--------
>>> import os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "loop.jsonl")
>>> first = JournalLock(path).acquire()
>>> sorted(os.listdir(os.path.dirname(path)))
['loop.jsonl.lease', 'loop.jsonl.lock']
>>> try:
...     JournalLock(path).acquire()
... except Exception as exc:
...     print(type(exc).__name__, "already held by another writer in this process" in str(exc))
CheckpointError True
>>> first.release()
>>> JournalLock(path).acquire().release()         # free again
"""
from __future__ import annotations

import math
import os
import posixpath
import sys
import warnings
from typing import Any

from .. import config
from ..durable import Files, Lease, redact
from ..exceptions import CheckpointError

__all__ = ["JournalLock", "JournalLockWarning", "locate"]

LEASE_FORMAT = "dask-research.experiments.journal-lease/1"
HINT = ("one IterationScheduler per journal: wait for it to finish or stop it (its lease is taken over "
        "when it has not changed for research.experiments.lock-timeout seconds of the waiting "
        "process's clock, at once when its process on this host is gone)")


class JournalLockWarning(UserWarning):
    """A stale journal lease (its process gone, or unchanged for the lock timeout) was taken over."""


class _Errors:
    """A :class:`CheckpointError` naming the journal; a side file (the lease, its lock, a
    folder) is named inside the message: by name next to the journal, else in full."""

    def __init__(self, url: str):
        self.url = url
        self.journal: str | None = None          # the journal as Files shows it

    def __call__(self, shown: str, problem: str) -> Exception:
        journal = self.journal
        if journal is not None and shown != journal:
            near = posixpath.dirname(shown) == posixpath.dirname(journal)
            problem = f"{posixpath.basename(shown) if near else shown}: {problem}"
        return CheckpointError(self.url, problem)


def locate(journal: str | os.PathLike[str]) -> tuple[Files, str, str]:
    """``(files, path, url)`` of a journal: the :class:`~dask_research.durable.Files` of its folder
    (errors: :class:`CheckpointError` naming the journal), its path there, and its name in messages
    (a local path made absolute; a URL without credentials).

    >>> files, path, url = locate("/tmp/runs/loop.jsonl")
    >>> files.root, path, url
    ('/tmp/runs', '/tmp/runs/loop.jsonl', '/tmp/runs/loop.jsonl')
    """
    text = os.fspath(journal)
    if "://" not in text or text.startswith("file://"):
        local = posixpath.normpath(os.path.abspath(text[len("file://"):] if text.startswith("file://") else text))
        root, name, url = posixpath.dirname(local), posixpath.basename(local), local
    else:
        root, _, name = text.rpartition("/")
        root = root + "/" if root.endswith(":/") else root      # memory://loop.jsonl
        url = redact(text)
    errors = _Errors(url)
    files = Files(root, error=errors)
    path = files.join(name)
    errors.journal = files.display(path)
    return files, path, url


def _timeout(url: str, value: Any) -> float:
    value = config.resolve("experiments.lock-timeout", value)
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if isinstance(value, bool) or not (seconds > 0 and math.isfinite(seconds)):
        raise CheckpointError(url, f"research.experiments.lock-timeout={value!r} is invalid; expected a "
                                   "positive, finite number of seconds")
    return seconds


class JournalLock(Lease):
    """The lease of one journal (``<journal>.lease``, flock side file ``<journal>.lock``).

    Parameters
    ----------
    journal : str or path
        The journal (a local path or an fsspec URL).
    timeout : float, optional
        Seconds of a waiting driver's own clock after which an unchanged lease is stale
        (``research.experiments.lock-timeout``).
    located : tuple, optional
        What :func:`locate` returned for ``journal`` (the :class:`~.checkpoint.Journal` passes
        its own).
    """

    def __init__(self, journal: str | os.PathLike[str], timeout: float | None = None,
                 located: tuple[Files, str, str] | None = None):
        files, path, url = located if located is not None else locate(journal)
        self.journal, self.url = path, url
        super().__init__(files, path + ".lease", lock_path=path + ".lock", label="the journal",
                         timeout=_timeout(url, timeout), wait=0, fmt=LEASE_FORMAT,
                         extra={"journal": posixpath.basename(path)}, announce=self._announce, hint=HINT)

    def __repr__(self) -> str:
        return f"JournalLock({self.url!r}, held={self.held})"

    def _announce(self, kind: str, message: str) -> None:
        shown = self.files.display(self.path) + ": "       # the lease file, by name
        if message.startswith(shown):
            message = f"{posixpath.basename(self.path)}: {message[len(shown):]}"
        text = f"checkpoint {self.url}: {message}"
        if kind == "takeover":
            warnings.warn(text, JournalLockWarning, stacklevel=2)
        else:
            print(text, file=sys.stderr, flush=True)
