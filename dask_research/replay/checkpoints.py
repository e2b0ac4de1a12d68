"""Checkpoint files of the experience plane: one atomic commit per checkpoint, no pickle.

Every checkpoint of a plane (:meth:`ExperiencePlane.checkpoint`) and of a cluster shard
(``WorkerShard.checkpoint``) is written here. A checkpoint directory holds committed
*versions* and a pointer naming the current one::

    ck/
      CURRENT            one line: "v000007", written to a temporary name, then renamed
      v000007/
        data.npz         one array per field (+ the prioritized sampler's leaves), no pickle
        meta.json        spec, ring counters, sampler/generator/limiter state, the byte count
                         and SHA-256 of data.npz, and (shards) the shard's identity

A write goes through four named steps: ``data-written`` and ``meta-written`` (both files in a
fresh temporary directory, flushed to disk), ``version-renamed`` (that directory renamed to
``vNNNNNN``, not yet current) and ``pointer-committed`` (``CURRENT`` replaced by one
``os.replace``: the commit). Only then are older versions and leftovers of interrupted writes
removed. A process killed at any point leaves the previous checkpoint restorable and
untouched, or the new one committed; a reader never pairs one version's metadata with another's
data (each version names the digest of its own data file).

Readers follow ``CURRENT`` (a name that is not ``vNNNNNN`` is refused, so a hostile pointer
cannot send a restore elsewhere). A directory without ``CURRENT`` but with ``meta.json`` is read
as the layout of dask-research before versioned checkpoints (no digest); a versioned checkpoint
whose ``meta.json`` lacks the ``data`` record is refused. Readers never block and never follow a
link inside the checkpoint: ``CURRENT``, the version directory, ``meta.json`` and ``data.npz``
are opened relative to their parent's descriptor without following symbolic links and without
blocking, and anything that is not a regular file (a FIFO, a device, a link) is refused with a
:class:`CheckpointError`; ``CURRENT`` and ``meta.json`` are read up to :data:`MAX_META_BYTES`,
``data.npz`` must have the size its metadata records. (The checkpoint directory itself may be a
link.)

Writers of one directory are serialised within a process (the periodic shard checkpoint and a
requested one may overlap, the second waits). Across processes a write holds ``fcntl.flock`` on
``.lock`` in the directory, which names the writer (pid, host, version, start time) while the
write lasts: a second process that writes meanwhile is refused at once with a
:class:`CheckpointError` naming the holder, rather than interleave the two writes (which could
delete each other's versions or roll ``CURRENT`` back). The kernel releases the lock of a
killed writer, so the next writer takes it over and removes what the dead write left. Cleanup
after a commit removes only versions older than the new one.

Examples
--------
>>> import tempfile, numpy as np
>>> from dask_research.replay import checkpoints
>>> d = tempfile.mkdtemp()
>>> v = checkpoints.write(d, {"format": "example"}, {"x": np.arange(3)})
>>> v.name, checkpoints.current(d) == v
('v000001', True)
>>> meta, arrays, where = checkpoints.load(d)
>>> arrays["x"].tolist(), meta["data"]["bytes"] > 0
([0, 1, 2], True)
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import pathlib
import re
import shutil
import socket
import stat
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from ..exceptions import CheckpointError

__all__ = ["write", "load", "read_meta", "current", "POINTER", "LOCK",
           "STEPS", "MAX_META_BYTES"]

logger = logging.getLogger(__name__)

#: file naming the committed version
POINTER = "CURRENT"
#: the named steps of a write, in order (see the module docstring)
STEPS = ("data-written", "meta-written", "version-renamed", "pointer-committed")
#: file whose ``flock`` a writer holds (with its pid, host and version as content) while it writes
LOCK = ".lock"
#: the most bytes ``CURRENT`` or a ``meta.json`` may have (a larger one is refused, not read)
MAX_META_BYTES = 64 * 2**20
_VERSION = re.compile(r"v([0-9]{6,})")
_TMP_PREFIX = ".tmp-"
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)

#: Called with each step's name as the write passes it (tests pause or kill the process there).
_step_hook: Callable[[str], None] | None = None

_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def _step(name: str) -> None:
    hook = _step_hook
    if hook is not None:
        hook(name)


def _lock_for(path: pathlib.Path) -> threading.Lock:
    key = os.path.realpath(path)
    with _locks_guard:
        return _locks.setdefault(key, threading.Lock())


def _fsync_dir(path: pathlib.Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory handles
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _sha256_fd(fd: int) -> str:
    h = hashlib.sha256()
    os.lseek(fd, 0, os.SEEK_SET)
    while True:
        block = os.read(fd, 1 << 20)
        if not block:
            break
        h.update(block)
    return h.hexdigest()


def _versions(path: pathlib.Path) -> list[int]:
    out = []
    for p in path.iterdir():
        m = _VERSION.fullmatch(p.name)
        if m and p.is_dir():
            out.append(int(m.group(1)))
    return sorted(out)


# --- reading: relative to directory descriptors, no links, nothing but regular files -----
def _open_in(dir_fd: int, name: str, path: pathlib.Path, label: str, *, directory: bool = False
             ) -> int:
    """Open ``name`` in the directory ``dir_fd`` without following a link and without blocking.

    Raises ``FileNotFoundError`` if it does not exist, :class:`CheckpointError` if it is a
    link or not a regular file (``directory``: not a directory).
    """
    flags = os.O_RDONLY | _CLOEXEC | _NOFOLLOW | (_DIRECTORY if directory else _NONBLOCK)
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as e:
        try:
            is_link = stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode)
        except OSError:
            is_link = False
        if is_link:
            raise CheckpointError(str(path), f"{label} is a symbolic link; a checkpoint's "
                                             "files are never links (refused, not followed)") from None
        what = "a directory" if directory else "a regular file"
        if e.errno in (errno.ENOTDIR, errno.EISDIR):
            raise CheckpointError(str(path), f"{label} is not {what}") from None
        raise CheckpointError(str(path), f"{label} is unreadable ({type(e).__name__}: "
                                         f"{e.strerror or e})") from None
    mode = os.fstat(fd).st_mode
    if not (stat.S_ISDIR(mode) if directory else stat.S_ISREG(mode)):
        os.close(fd)
        kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
                else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
        want = "a directory" if directory else "a regular file"
        raise CheckpointError(str(path), f"{label} is {kind}, not {want}; refused (reading it "
                                         "could block or never end)")
    return fd


def _read_small(fd: int, path: pathlib.Path, label: str) -> bytes:
    """At most :data:`MAX_META_BYTES` of the regular file ``fd`` (a larger one is refused)."""
    if os.fstat(fd).st_size > MAX_META_BYTES:
        raise CheckpointError(str(path), f"{label} has {os.fstat(fd).st_size:,} bytes, more than "
                                         f"the {MAX_META_BYTES:,} it may have")
    chunks, got = [], 0
    while got <= MAX_META_BYTES:
        block = os.read(fd, min(1 << 20, MAX_META_BYTES + 1 - got))
        if not block:
            break
        chunks.append(block)
        got += len(block)
    if got > MAX_META_BYTES:                  # grew while read
        raise CheckpointError(str(path), f"{label} has more than the {MAX_META_BYTES:,} bytes it "
                                         "may have")
    return b"".join(chunks)


def _open_root(path: pathlib.Path) -> int:
    """Descriptor of the checkpoint directory (which may itself be a link)."""
    try:
        return os.open(path, os.O_RDONLY | _CLOEXEC | _DIRECTORY)
    except (FileNotFoundError, NotADirectoryError):
        raise
    except OSError as e:
        raise CheckpointError(str(path), f"is unreadable ({type(e).__name__}: "
                                         f"{e.strerror or e})") from None


def _pointer(root: int, path: pathlib.Path) -> str | None:
    """The version name ``CURRENT`` holds (None without ``CURRENT``)."""
    try:
        fd = _open_in(root, POINTER, path, POINTER)
    except FileNotFoundError:
        return None
    try:
        raw = _read_small(fd, path, POINTER)
    except OSError as e:
        raise CheckpointError(str(path), f"{POINTER} is unreadable ({type(e).__name__}: {e})") from None
    finally:
        os.close(fd)
    try:
        name = raw.decode("utf-8").strip()
    except UnicodeDecodeError as e:
        raise CheckpointError(str(path), f"{POINTER} is unreadable ({type(e).__name__}: {e})") from None
    if not _VERSION.fullmatch(name):
        raise CheckpointError(str(path), f"{POINTER} names {name[:40]!r}; expected a version "
                                         "directory name like 'v000001'")
    return name


def current(path: str | os.PathLike) -> pathlib.Path | None:
    """The committed version directory of checkpoint ``path`` (None if none was committed).

    Raises :class:`CheckpointError` if ``CURRENT`` names something other than a version, or is
    not a regular file.
    """
    path = pathlib.Path(path)
    try:
        root = _open_root(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        name = _pointer(root, path)
    finally:
        os.close(root)
    return None if name is None else path / name


@contextlib.contextmanager
def _opened(path: pathlib.Path, version: pathlib.Path | None
            ) -> Iterator[tuple[int, pathlib.Path, bool]]:
    """``(descriptor, path, versioned)`` of the committed version of ``path`` (or of the
    directory ``version`` that :func:`read_meta` returned); closed on exit."""
    missing = CheckpointError(str(path), "meta.json is missing (no committed checkpoint: not a "
                                         "checkpoint, or its first write never finished)")
    try:
        root = _open_root(path)
    except (FileNotFoundError, NotADirectoryError):
        raise missing from None
    try:
        name: str | None
        if version is not None and pathlib.Path(version) != path:
            name = pathlib.Path(version).name
            if not _VERSION.fullmatch(name):
                raise CheckpointError(str(path), f"{name[:40]!r} is not a version directory "
                                                 "name like 'v000001'")
        elif version is None:
            name = _pointer(root, path)
        else:
            name = None
        if name is None:                     # the layout before versioned checkpoints
            try:
                os.lstat("meta.json", dir_fd=root)
            except FileNotFoundError:
                raise missing from None
            where_fd, where, versioned = os.dup(root), path, False
        else:
            try:
                where_fd = _open_in(root, name, path, name, directory=True)
            except FileNotFoundError:
                if version is not None:
                    raise CheckpointError(str(path), f"version {name} is gone (a newer checkpoint "
                                                     "replaced it after it was read); read the "
                                                     "checkpoint again") from None
                raise CheckpointError(str(path), f"{POINTER} names {name}, which is missing") from None
            where, versioned = path / name, True
    finally:
        os.close(root)
    try:
        yield where_fd, where, versioned
    finally:
        os.close(where_fd)


def _meta_at(where_fd: int, where: pathlib.Path, path: pathlib.Path) -> dict[str, Any]:
    try:
        fd = _open_in(where_fd, "meta.json", path, f"meta.json of {where.name}")
    except FileNotFoundError:
        raise CheckpointError(str(path), f"meta.json is missing from {where.name}") from None
    try:
        raw = _read_small(fd, path, "meta.json")
    finally:
        os.close(fd)
    try:
        meta = json.loads(raw.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(str(path), f"meta.json is not valid JSON ({e})") from None
    except RecursionError:
        raise CheckpointError(str(path), "meta.json is nested too deeply") from None
    if not isinstance(meta, dict):
        raise CheckpointError(str(path), "meta.json does not hold an object")
    return meta


# --- writing --------------------------------------------------------------------------------
def _describe(holder: Any) -> str:
    if not isinstance(holder, dict):
        return "another process (it has not named itself yet)"
    return (f"pid {holder.get('pid')} on host {holder.get('host')}, writing since "
            f"{holder.get('started')}")


def _read_holder(fd: int) -> Any:
    try:
        raw = os.pread(fd, 4096, 0)
        return json.loads(raw.decode("utf-8")) if raw.strip() else None
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def _exclusive(path: pathlib.Path) -> Iterator[None]:
    """Hold ``path/.lock`` (``flock``) for one write; refuse at once if another process holds it.

    The lock file holds the writer's pid, host and start time while it writes and is emptied
    afterwards (never deleted: a deleted lock file lets two processes lock two files). A
    non-empty lock file that is not locked was left by a writer that died mid-write; its
    leftovers are removed by this write's cleanup.
    """
    lock = path / LOCK
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | _CLOEXEC | _NOFOLLOW | _NONBLOCK, 0o644)
    except OSError:
        if os.path.islink(lock):
            raise CheckpointError(str(path), f"{LOCK} is a symbolic link; refused") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CheckpointError(str(path), f"{LOCK} is not a regular file; refused")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CheckpointError(
                str(path), f"is being checkpointed by {_describe(_read_holder(fd))} ({lock} "
                "is locked); one process writes a checkpoint directory at a time: give each "
                "plane its own directory, or retry when that write has finished") from None
        except OSError as e:
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                raise
            logger.warning("checkpoint %s: this file system cannot lock %s (%s); writes of "
                           "two processes into it are not detected", path, lock, e.strerror)
            unlocked = True
        else:
            unlocked = False
        if unlocked:
            yield
            return
        previous = _read_holder(fd)
        if previous is not None:
            logger.warning("checkpoint %s: the write by %s did not finish (its process "
                           "died); taking over its lock and removing what it left", path,
                           _describe(previous))
        record = {"pid": os.getpid(), "host": socket.gethostname(),
                  "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode("utf-8"), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)                          # closing releases the flock


def write(path: str | os.PathLike, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]
          ) -> pathlib.Path:
    """Commit ``meta`` (JSON-able) and ``arrays`` as the new current version of ``path``.

    Returns the committed version directory. ``meta`` gains ``"data": {"file", "bytes",
    "sha256"}``. On any failure the temporary directory is removed and the previous version
    stays current; an ``OSError`` (a full disk, a path that is a file) is raised as a
    :class:`CheckpointError` naming ``path``. While another process writes into ``path``, a
    :class:`CheckpointError` naming that process is raised at once and nothing is written.
    """
    path = pathlib.Path(path)
    try:
        return _write(path, meta, arrays)
    except OSError as e:                      # a full disk, a read-only or foreign path
        raise CheckpointError(str(path), f"could not be written ({type(e).__name__}: "
                                         f"{e.strerror or e}); the previous checkpoint, if "
                                         "any, is kept") from e


def _write(path: pathlib.Path, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]
           ) -> pathlib.Path:
    path.mkdir(parents=True, exist_ok=True)
    with _lock_for(path), _exclusive(path):
        prev = current(path)
        n = max(_versions(path), default=0) + 1
        name = f"v{n:06d}"
        tmp = path / f"{_TMP_PREFIX}{name}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            data = tmp / "data.npz"
            with open(data, "wb") as f:
                np.savez(f, **arrays)  # type: ignore[arg-type]  # numpy's stub types **kwds as bool
                f.flush()
                os.fsync(f.fileno())
                size = os.fstat(f.fileno()).st_size
            _step("data-written")
            doc = dict(meta)
            fd = os.open(data, os.O_RDONLY | _CLOEXEC)
            try:
                digest = _sha256_fd(fd)
            finally:
                os.close(fd)
            doc["data"] = {"file": "data.npz", "bytes": size, "sha256": digest}
            with open(tmp / "meta.json", "w") as f:
                f.write(json.dumps(doc, indent=1))
                f.flush()
                os.fsync(f.fileno())
            _fsync_dir(tmp)
            _step("meta-written")
            target = path / name
            os.rename(tmp, target)
            _fsync_dir(path)
            _step("version-renamed")
            ptr = path / f"{_TMP_PREFIX}{POINTER}-{uuid.uuid4().hex[:8]}"
            with open(ptr, "w") as f:
                f.write(name + "\n")
                f.flush()
                os.fsync(f.fileno())
            try:
                os.replace(ptr, path / POINTER)
            except BaseException:
                ptr.unlink(missing_ok=True)
                raise
            _fsync_dir(path)
            _step("pointer-committed")
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            try:
                committed = current(path) == path / name
            except CheckpointError:           # an unreadable pointer does not name ours
                committed = False
            if not committed:
                shutil.rmtree(path / name, ignore_errors=True)
            raise
        _clean(path, keep=name, below=n, prev=prev)
    return target


def _clean(path: pathlib.Path, keep: str, below: int, prev: pathlib.Path | None) -> None:
    """Remove versions older than ``below`` (but ``keep``) and leftovers of interrupted writes.

    Runs under the directory's lock, so every temporary name is a dead writer's.
    """
    for p in path.iterdir():
        if p.name == keep:
            continue
        m = _VERSION.fullmatch(p.name)
        if (m and int(m.group(1)) < below) or p.name.startswith(_TMP_PREFIX):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
    if prev is None:          # a plane checkpointed here before versions: drop its files
        for legacy in ("meta.json", "data.npz", "shard.json"):
            (path / legacy).unlink(missing_ok=True)


# --- reading ----------------------------------------------------------------------------------
def read_meta(path: str | os.PathLike, version: pathlib.Path | None = None
              ) -> tuple[dict[str, Any], pathlib.Path]:
    """``(meta, version directory)`` of the committed checkpoint at ``path`` (or of the
    version directory ``version`` that an earlier call returned)."""
    path = pathlib.Path(path)
    with _opened(path, version) as (where_fd, where, _):
        return _meta_at(where_fd, where, path), where


def load(path: str | os.PathLike, version: pathlib.Path | None = None
         ) -> tuple[dict[str, Any], dict[str, np.ndarray], pathlib.Path]:
    """``(meta, arrays, version directory)`` of the committed checkpoint at ``path`` (or of
    ``version``, a directory :func:`read_meta` returned).

    The data file must match the size and SHA-256 its metadata records (a versioned checkpoint
    without that record is refused; only the layout before versions lacks it); arrays are
    loaded with ``allow_pickle=False``. Any problem raises :class:`CheckpointError` naming
    ``path``. The arrays are not checked against a spec here: see
    :func:`~dask_research.replay.snapshot.check_snapshot`.
    """
    path = pathlib.Path(path)
    with _opened(path, version) as (where_fd, where, versioned):
        meta = _meta_at(where_fd, where, path)
        rec = meta.get("data")
        if versioned and rec is None:
            raise CheckpointError(str(path), f"meta.json of {where.name} has no 'data' record "
                                             "(the size and SHA-256 of its data.npz, which every "
                                             "versioned checkpoint records); refused")
        if rec is not None and (not isinstance(rec, dict) or not isinstance(rec.get("sha256"), str)
                                or type(rec.get("bytes")) is not int):
            raise CheckpointError(str(path), "meta.json's 'data' entry is malformed")
        try:
            fd = _open_in(where_fd, "data.npz", path, f"data.npz of {where.name}")
        except FileNotFoundError:
            raise CheckpointError(str(path), "data.npz is missing") from None
        with os.fdopen(fd, "rb") as f:
            if rec is not None:
                size = os.fstat(fd).st_size
                if size != rec["bytes"] or _sha256_fd(fd) != rec["sha256"]:
                    raise CheckpointError(str(path), f"data.npz of {where.name} does not match "
                                                     f"its meta.json ({size:,} bytes; the file "
                                                     "was changed or truncated)")
                f.seek(0)
            try:
                with np.load(f, allow_pickle=False) as z:
                    arrays = {k: z[k] for k in z.files}
            except Exception as e:  # noqa: BLE001 - any failure to parse the archive: unreadable
                # (a flipped bit in an .npy header reaches numpy's literal_eval: SyntaxError,
                # tokenize.TokenError; a truncated zip: BadZipFile, EOFError)
                raise CheckpointError(str(path), f"data.npz is unreadable ({type(e).__name__}: "
                                                 f"{e})") from None
    return meta, arrays, where
