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
as the layout of dask-research before versioned checkpoints (no digest).

Writers of one directory are serialised within a process (the periodic shard checkpoint and a
requested one may overlap); two processes must not checkpoint into the same directory.

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

import hashlib
import json
import os
import pathlib
import re
import shutil
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..exceptions import CheckpointError

__all__ = ["write", "load", "read_meta", "current", "POINTER", "STEPS"]

#: file naming the committed version
POINTER = "CURRENT"
#: the named steps of a write, in order (see the module docstring)
STEPS = ("data-written", "meta-written", "version-renamed", "pointer-committed")
_VERSION = re.compile(r"^v(\d{6,})$")
_TMP_PREFIX = ".tmp-"

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


def _sha256(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _versions(path: pathlib.Path) -> list[int]:
    out = []
    for p in path.iterdir():
        m = _VERSION.match(p.name)
        if m and p.is_dir():
            out.append(int(m.group(1)))
    return sorted(out)


def current(path: str | os.PathLike) -> pathlib.Path | None:
    """The committed version directory of checkpoint ``path`` (None if none was committed).

    Raises :class:`CheckpointError` if ``CURRENT`` names something other than a version.
    """
    path = pathlib.Path(path)
    try:
        name = (path / POINTER).read_text().strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(str(path), f"{POINTER} is unreadable ({type(e).__name__}: {e})") from None
    if not _VERSION.match(name):
        raise CheckpointError(str(path), f"{POINTER} names {name[:40]!r}; expected a version "
                                         "directory name like 'v000001'")
    return path / name


def write(path: str | os.PathLike, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]
          ) -> pathlib.Path:
    """Commit ``meta`` (JSON-able) and ``arrays`` as the new current version of ``path``.

    Returns the committed version directory. ``meta`` gains ``"data": {"file", "bytes",
    "sha256"}``. On any failure the temporary directory is removed and the previous version
    stays current; an ``OSError`` (a full disk, a path that is a file) is raised as a
    :class:`CheckpointError` naming ``path``.
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
    with _lock_for(path):
        prev = current(path)
        n = max(_versions(path), default=0) + 1
        name = f"v{n:06d}"
        tmp = path / f"{_TMP_PREFIX}{name}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            data = tmp / "data.npz"
            with open(data, "wb") as f:
                np.savez(f, **arrays)
                f.flush()
                os.fsync(f.fileno())
            _step("data-written")
            doc = dict(meta)
            doc["data"] = {"file": "data.npz", "bytes": data.stat().st_size, "sha256": _sha256(data)}
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
            if current(path) != path / name:
                shutil.rmtree(path / name, ignore_errors=True)
            raise
        _clean(path, keep=name, prev=prev)
    return target


def _clean(path: pathlib.Path, keep: str, prev: pathlib.Path | None) -> None:
    """Remove versions other than ``keep`` and leftovers of interrupted writes."""
    for p in path.iterdir():
        if p.name == keep:
            continue
        if _VERSION.match(p.name) or p.name.startswith(_TMP_PREFIX):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
    if prev is None:          # a plane checkpointed here before versions: drop its files
        for legacy in ("meta.json", "data.npz", "shard.json"):
            (path / legacy).unlink(missing_ok=True)


def _where(path: pathlib.Path) -> pathlib.Path:
    v = current(path)
    if v is not None:
        if not v.is_dir():
            raise CheckpointError(str(path), f"{POINTER} names {v.name}, which is missing")
        return v
    if (path / "meta.json").exists():        # the layout before versioned checkpoints
        return path
    raise CheckpointError(str(path), "meta.json is missing (no committed checkpoint: not a "
                                     "checkpoint, or its first write never finished)")


def read_meta(path: str | os.PathLike, version: pathlib.Path | None = None
              ) -> tuple[dict[str, Any], pathlib.Path]:
    """``(meta, version directory)`` of the committed checkpoint at ``path`` (or of the
    version directory ``version`` that an earlier call returned)."""
    path = pathlib.Path(path)
    where = _where(path) if version is None else pathlib.Path(version)
    try:
        meta = json.loads((where / "meta.json").read_text())
    except FileNotFoundError:
        raise CheckpointError(str(path), f"meta.json is missing from {where.name}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(str(path), f"meta.json is not valid JSON ({e})") from None
    if not isinstance(meta, dict):
        raise CheckpointError(str(path), "meta.json does not hold an object")
    return meta, where


def load(path: str | os.PathLike, version: pathlib.Path | None = None
         ) -> tuple[dict[str, Any], dict[str, np.ndarray], pathlib.Path]:
    """``(meta, arrays, version directory)`` of the committed checkpoint at ``path`` (or of
    ``version``, a directory :func:`read_meta` returned).

    The data file must match the size and SHA-256 its metadata records; arrays are loaded
    with ``allow_pickle=False``. Any problem raises :class:`CheckpointError` naming ``path``.
    """
    path = pathlib.Path(path)
    meta, where = read_meta(path, version)
    data = where / "data.npz"
    if not data.exists():
        raise CheckpointError(str(path), "data.npz is missing")
    rec = meta.get("data")
    if rec is not None:
        if not isinstance(rec, dict) or not isinstance(rec.get("sha256"), str):
            raise CheckpointError(str(path), "meta.json's 'data' entry is malformed")
        size = data.stat().st_size
        if size != rec.get("bytes") or _sha256(data) != rec["sha256"]:
            raise CheckpointError(str(path), f"data.npz of {where.name} does not match its "
                                             f"meta.json ({size:,} bytes; the file was changed "
                                             "or truncated)")
    try:
        with np.load(data, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except Exception as e:  # noqa: BLE001 - any failure to parse the archive: unreadable
        # (a flipped bit in an .npy header reaches numpy's literal_eval: SyntaxError,
        # tokenize.TokenError; a truncated zip: BadZipFile, EOFError)
        raise CheckpointError(str(path), f"data.npz is unreadable ({type(e).__name__}: {e})") from None
    return meta, arrays, where
