"""The run store: a manifest, accepted shard accumulators as they arrive, and the result.

Layout under any fsspec URL (a local path, ``s3://bucket/prefix``, ``memory://x``)::

    <store>/runs/<run id>/manifest.json       everything in the content address, versions, pilot
    <store>/runs/<run id>/shards/<a>-<b>.json accumulators of shards a..b-1 (those computed)
    <store>/runs/<run id>/quarantine/...       shard files moved aside after a failed check
    <store>/runs/<run id>/result.json          the accepted result's summary and verification

Files are JSON (never pickle), written to a temporary name and renamed on local file systems
(one ``put`` on object stores), so a partial write is never visible as accepted. Every shard
file carries a sha256 of its content; a corrupt, foreign or truncated file is refused with a
:class:`~dask_research.exceptions.StoreError` that names it.

Examples
--------
>>> import tempfile
>>> from dask_research.montecarlo.store import RunStore
>>> store = RunStore(tempfile.mkdtemp())
>>> store.list_runs()
[]
"""
from __future__ import annotations

import contextlib
import errno
import getpass
import hashlib
import json
import os
import posixpath
import re
import socket
import stat
import sys
import threading
import time
import uuid
import warnings
from typing import Any

import fsspec

from ..exceptions import StoreError
from .address import canonical_json
from .codec import CodecError, decode, encode

__all__ = ["RunStore", "Lease", "StoreWarning", "MANIFEST_FORMAT", "SHARDS_FORMAT", "RESULT_FORMAT"]

MANIFEST_FORMAT = "dask-research-run/1"
SHARDS_FORMAT = "dask-research-shards/1"
RESULT_FORMAT = "dask-research-result/1"
# ASCII digits only ([0-9], not \d), matched with fullmatch (``$`` would accept a trailing newline).
_SHARD_FILE = re.compile(r"([0-9]{12})-([0-9]{12})\.json")
_LOOKS_LIKE_SHARD = re.compile(r"[0-9]+-[0-9]+\.json")
_RUN_ID = re.compile(r"[0-9a-f]{64}")
_INDEX = re.compile(r"[0-9]+")
#: Largest file the store reads (a shard file of a 4 KiB accumulator x 4096 shards is ~40 MiB).
MAX_FILE_BYTES = 256 * 2**20


def _checksum(obj: Any) -> str:
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()


def _finite_json(obj: Any) -> Any:
    """JSON-able copy with non-finite floats as None (JSON has no NaN)."""
    if isinstance(obj, dict):
        return {str(k): _finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite_json(v) for v in obj]
    if isinstance(obj, float) or hasattr(obj, "dtype"):
        try:
            f = float(obj)
        except (TypeError, ValueError):
            return str(obj)
        return f if f == f and abs(f) != float("inf") else None
    return obj


class _Exists(StoreError):
    """The file a no-overwrite write targets exists already."""


def _oserror(e: OSError) -> str:
    name = errno.errorcode.get(e.errno, "") if e.errno else ""
    return f"{e.strerror or e}{f' [{name}]' if name else ''}"


_WARNED: set[str] = set()


def _warn_foreign(path: str) -> None:
    if path not in _WARNED:
        _WARNED.add(path)
        warnings.warn(f"{path}: not a shard file (foreign name); ignored", StoreWarning, stacklevel=3)


class StoreWarning(UserWarning):
    """Something in a store that is not ours and was left alone (a foreign file in shards/)."""


def _roundtrip(obj: Any) -> Any:
    return json.loads(json.dumps(obj, allow_nan=False))


def redact(url: str) -> str:
    """``url`` without credentials (``s3://key:secret@bucket`` -> ``s3://***@bucket``)."""
    return re.sub(r"//[^/@]*@", "//***@", str(url))


class RunStore:
    """A run store rooted at ``url`` (a local path or fsspec URL)."""

    def __init__(self, url: str, **storage_options: Any):
        self.url = str(url)
        self.fs, self.root = fsspec.core.url_to_fs(self.url, **storage_options)
        self._local = "file" in (self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,))
        self._leases: dict[str, Lease] = {}   # runs this store object holds the lease of (see _guard)

    def __repr__(self) -> str:
        return f"RunStore({redact(self.url)!r})"

    # -- paths ------------------------------------------------------------------------------
    def run_dir(self, run_id: str) -> str:
        if not _RUN_ID.fullmatch(str(run_id)):
            raise StoreError(str(run_id), "is not a run id (64 lowercase hex characters)")
        return posixpath.join(self.root, "runs", run_id)

    def _path(self, run_id: str, *parts: str) -> str:
        return posixpath.join(self.run_dir(run_id), *parts)

    def display(self, path: str) -> str:
        return redact(path)

    # -- existence --------------------------------------------------------------------------
    def exists(self) -> bool:
        """Whether the store's root exists (a directory, or a prefix holding files)."""
        try:
            return bool(self.fs.exists(self.root)) and not self.fs.isfile(self.root)
        except OSError:
            return False

    def require(self) -> RunStore:
        """Raise :class:`StoreError` unless the store exists (readers never create one)."""
        if self._local and os.path.lexists(self.root) and not os.path.isdir(self.root):
            raise StoreError(self.display(self.root), "is a file, not a run store (a directory)")
        if not self.exists():
            raise StoreError(self.display(self.root), "does not exist; give the path or URL of the store "
                             "the run was written to (mc run --store ...)")
        return self

    def prepare(self) -> RunStore:
        """Create the store's root for writing, or raise a one-line :class:`StoreError` why not."""
        where = self.display(self.root)
        if self._local:
            if os.path.lexists(self.root) and not os.path.isdir(self.root):
                raise StoreError(where, "is a file, not a run store; give a directory (it is created if missing)")
            try:
                os.makedirs(self.root, exist_ok=True)
            except OSError as e:
                raise StoreError(where, f"cannot be created ({e.strerror or e}); give a writable directory") from None
            if not os.access(self.root, os.W_OK | os.X_OK):
                raise StoreError(where, "is not writable by this user; give a writable directory")
            self._refuse_links(posixpath.join(self.root, "runs", "x"))
            return self
        try:
            if self.fs.isfile(self.root):
                raise StoreError(where, "is a file, not a run store; give a prefix")
            self.fs.makedirs(self.root, exist_ok=True)
        except StoreError:
            raise
        except (OSError, ValueError) as e:
            raise StoreError(where, f"cannot be created ({type(e).__name__}: {e})") from None
        return self

    # -- low level --------------------------------------------------------------------------
    def _refuse_links(self, path: str) -> None:
        """Refuse a symbolic link anywhere between the store's root and ``path`` (local stores).

        Writes never follow a link inside a store: a linked ``runs/``, ``runs/<id>``,
        ``shards/`` or file would put (or overwrite) files outside it. The root itself may be
        a link (that is where you chose to put the store).
        """
        if not self._local:
            return
        rel = posixpath.relpath(path, self.root)
        if rel.startswith(".."):
            raise StoreError(self.display(path), f"lies outside the store {self.display(self.root)}")
        cur = self.root
        for part in rel.split("/"):
            cur = posixpath.join(cur, part)
            if os.path.islink(cur):
                raise StoreError(self.display(cur), "is a symbolic link inside the store; writes never follow "
                                 "links (replace it by a real directory or file, or point --store at the target)")
            if not os.path.lexists(cur):
                return

    def _link_error(self, path: str) -> StoreError:
        return StoreError(self.display(path), "is a symbolic link inside the store; writes never follow links "
                          "(replace it by a real directory or file, or point --store at the target)")

    def _open_dir(self, path: str, create: bool) -> int:
        """A descriptor of the directory ``path`` inside the store, reached one component at a time.

        Each component is opened relative to its parent's descriptor with ``O_NOFOLLOW |
        O_DIRECTORY`` (and created first with ``create``), so a link swapped in after any check
        is refused, never followed: what is written through the descriptor stays in the store.
        The root itself may be a link (that is where you chose to put the store).
        """
        rel = posixpath.relpath(path, self.root)
        if rel == ".." or rel.startswith("../"):
            raise StoreError(self.display(path), f"lies outside the store {self.display(self.root)}")
        parts = [] if rel == "." else rel.split("/")
        if create:
            os.makedirs(self.root, exist_ok=True)   # the root (not inside the store) may be created as given
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            cur = self.root
            for part in parts:
                cur = posixpath.join(cur, part)
                if create:
                    try:
                        os.mkdir(part, 0o777, dir_fd=fd)
                    except FileExistsError:
                        pass
                try:
                    nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                except OSError as e:
                    try:
                        st = os.stat(part, dir_fd=fd, follow_symlinks=False)
                    except OSError:
                        st = None
                    if st is not None and stat.S_ISLNK(st.st_mode):
                        raise self._link_error(cur) from None
                    if st is not None and not stat.S_ISDIR(st.st_mode):
                        raise StoreError(self.display(cur), "is not a directory; a run store's runs/, runs/<id> "
                                         "and shards/ are directories") from None
                    raise e
                os.close(fd)
                fd = nfd
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _guard(self, path: str) -> None:
        """Before a write into a run this store holds the lease of: stop if the lease was lost."""
        rel = posixpath.relpath(path, posixpath.join(self.root, "runs"))
        lease = self._leases.get(rel.split("/")[0]) if not rel.startswith("..") else None
        if lease is not None and path not in (lease.path, lease.lock_path):
            lease.check_held(path)

    def _write_json(self, path: str, obj: Any, overwrite: bool = False) -> None:
        data = json.dumps(obj, indent=None, separators=(",", ":"), allow_nan=False).encode()
        self._guard(path)
        if self._local:
            self._write_local(path, data, overwrite)
            return
        try:
            if not overwrite and self.fs.exists(path):
                raise _Exists(self.display(path), "already exists; refusing to overwrite it")
            self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
            self.fs.pipe_file(path, data)   # one put: an object appears whole or not at all
        except StoreError:
            raise
        except OSError as e:
            raise StoreError(self.display(path), f"could not be written ({_oserror(e)})") from None

    def _write_local(self, path: str, data: bytes, overwrite: bool) -> None:
        """Temporary file (exclusive, not following links), fsync, then an atomic link or rename.

        Everything happens relative to the parent directory's descriptor (see
        :meth:`_open_dir`), so no path is resolved twice and no link inside the store is followed.
        """
        parent, name = posixpath.split(path)
        try:
            pfd = self._open_dir(parent, create=True)
        except StoreError:
            raise
        except OSError as e:
            raise StoreError(self.display(parent), f"cannot be created ({_oserror(e)})") from None
        tmp = f"{name}.tmp-{uuid.uuid4().hex[:8]}"
        made = False
        try:
            try:
                st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if st is not None and stat.S_ISLNK(st.st_mode):
                raise self._link_error(path)
            if st is not None and not overwrite:
                raise _Exists(self.display(path), "already exists; refusing to overwrite it")
            if st is not None and not stat.S_ISREG(st.st_mode):
                raise StoreError(self.display(path), "is not a regular file; refusing to replace it")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=pfd)
            made = True
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            if overwrite:
                os.replace(tmp, name, src_dir_fd=pfd, dst_dir_fd=pfd)
            else:
                try:   # atomic and never replaces: a concurrent writer loses cleanly
                    os.link(tmp, name, src_dir_fd=pfd, dst_dir_fd=pfd, follow_symlinks=False)
                except FileExistsError:
                    raise _Exists(self.display(path), "already exists; refusing to overwrite it") from None
                except OSError as e:
                    if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                        raise
                    try:                            # a file system without hard links
                        os.stat(name, dir_fd=pfd, follow_symlinks=False)
                        raise _Exists(self.display(path), "already exists; refusing to overwrite it") from None
                    except FileNotFoundError:
                        os.replace(tmp, name, src_dir_fd=pfd, dst_dir_fd=pfd)
        except StoreError:
            raise
        except OSError as e:
            raise StoreError(self.display(path), f"could not be written ({_oserror(e)}); nothing was stored "
                             "under this name and the run can be resumed once the cause is fixed") from None
        finally:
            if made:
                try:
                    os.unlink(tmp, dir_fd=pfd)
                except OSError:   # renamed into place, or the directory vanished
                    pass
            os.close(pfd)

    def _read_bytes(self, path: str) -> bytes:
        """A store file's bytes: a regular file of at most :data:`MAX_FILE_BYTES`, never blocking.

        Local files are opened with ``O_NONBLOCK`` and checked with ``fstat``: a FIFO, a device
        or a socket (or a link to one) is refused at once instead of blocking or reading without
        end; at most ``MAX_FILE_BYTES + 1`` bytes are ever read. Raises ``FileNotFoundError``
        for a missing file and :class:`StoreError` for anything else.
        """
        if not self._local:
            try:
                with self.fs.open(path, "rb") as f:
                    raw = f.read(MAX_FILE_BYTES + 1)
            except FileNotFoundError:
                raise
            except OSError as e:
                raise StoreError(self.display(path), f"cannot be read ({_oserror(e)})") from None
        else:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            except FileNotFoundError:
                raise
            except OSError as e:
                raise StoreError(self.display(path), f"cannot be read ({_oserror(e)})") from None
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode)
                            else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
                            else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file")
                    raise StoreError(self.display(path), f"is {kind}, not a regular file; a run store holds "
                                     "only regular files (remove it)")
                if st.st_size > MAX_FILE_BYTES:
                    raise StoreError(self.display(path), f"is {st.st_size:,} bytes, more than the "
                                     f"{MAX_FILE_BYTES:,} a store file may have")
                chunks, left = [], MAX_FILE_BYTES + 1
                while left > 0:
                    chunk = os.read(fd, min(left, 1 << 20))
                    if not chunk:
                        break
                    chunks.append(chunk)
                    left -= len(chunk)
                raw = b"".join(chunks)
            except StoreError:
                raise
            except OSError as e:
                raise StoreError(self.display(path), f"cannot be read ({_oserror(e)})") from None
            finally:
                os.close(fd)
        if len(raw) > MAX_FILE_BYTES:
            raise StoreError(self.display(path), f"is more than the {MAX_FILE_BYTES:,} bytes a store file may have")
        return raw

    def _read_json(self, path: str) -> Any:
        try:
            raw = self._read_bytes(path)
        except FileNotFoundError:
            raise StoreError(self.display(path), "does not exist") from None
        try:
            return json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
            raise StoreError(self.display(path), f"is not valid JSON ({type(e).__name__}: {e}); "
                             "the file is corrupt or not a dask-research store file") from None

    def _expect(self, path: str, doc: Any, fmt: str, run_id: str) -> dict:
        if not isinstance(doc, dict):
            raise StoreError(self.display(path), f"holds a {type(doc).__name__}, not a {fmt} document")
        if doc.get("format") != fmt:
            raise StoreError(self.display(path), f"has format {doc.get('format')!r}; expected {fmt!r}")
        if doc.get("run_id") != run_id:
            raise StoreError(self.display(path), f"belongs to run {str(doc.get('run_id'))[:16]!r}, not {run_id[:16]}")
        return doc

    # -- manifest ---------------------------------------------------------------------------
    def list_runs(self) -> list[str]:
        base = posixpath.join(self.root, "runs")
        if not self.fs.exists(base):
            return []
        return sorted(posixpath.basename(p.rstrip("/")) for p in self.fs.ls(base, detail=False)
                      if _RUN_ID.fullmatch(posixpath.basename(p.rstrip("/"))))

    def resolve(self, run_id: str) -> str:
        """The whole id of the one run whose id starts with ``run_id`` (a prefix is enough)."""
        if not isinstance(run_id, str) or not run_id or not re.fullmatch(r"[0-9a-f]{1,64}", run_id):
            raise StoreError(repr(self), f"{run_id!r} is not a run id or a prefix of one (lowercase hex characters)")
        matches = [r for r in self.list_runs() if r.startswith(run_id)]
        if len(matches) != 1:
            raise StoreError(repr(self), f"{len(matches)} runs start with {run_id!r}; give more characters"
                             if matches else f"has no run starting with {run_id!r}")
        return matches[0]

    def has_run(self, run_id: str) -> bool:
        return self.fs.exists(self._path(run_id, "manifest.json"))

    def write_manifest(self, run_id: str, manifest: dict) -> None:
        doc = {"format": MANIFEST_FORMAT, "run_id": run_id, **manifest}
        doc["checksum"] = _checksum({k: v for k, v in doc.items() if k != "checksum"})
        self._write_json(self._path(run_id, "manifest.json"), doc)

    def read_manifest(self, run_id: str) -> dict:
        path = self._path(run_id, "manifest.json")
        doc = self._expect(path, self._read_json(path), MANIFEST_FORMAT, run_id)
        body = {k: v for k, v in doc.items() if k != "checksum"}
        if doc.get("checksum") != _checksum(body):
            raise StoreError(self.display(path), "checksum does not match its content (edited or corrupt)")
        for key in ("job", "range", "engine"):
            if key not in doc:
                raise StoreError(self.display(path), f"has no {key!r} entry")
        return doc

    # -- shards -----------------------------------------------------------------------------
    def write_shards(self, run_id: str, states: dict[int, Any], worker: str, encoder=encode) -> str:
        """Persist accepted shard states (one file for a contiguous set of shard indices).

        Idempotent: if the file exists with the same states (another writer of the same run got
        there first), nothing is written; different states under the same name are refused.
        """
        return self.write_shard_file(run_id, states, worker, encoder)[0]

    def write_shard_file(self, run_id: str, states: dict[int, Any], worker: str,
                         encoder=encode) -> tuple[str, str]:
        """:meth:`write_shards`, returning ``(path, checksum)``: the file and the sha256 of its states.

        What a block task that writes its own shard file (on a worker) sends back to the client.
        """
        if not states:
            raise ValueError("no shard states to write")
        first, last = min(states), max(states)
        try:
            body = {str(k): encoder(v) for k, v in sorted(states.items())}
        except CodecError as e:
            raise StoreError(self.display(self.run_dir(run_id)), f"cannot store the accumulator: {e}") from None
        doc = {"format": SHARDS_FORMAT, "run_id": run_id, "worker": worker, "written": time.time(),
               "states": body, "checksum": _checksum(body)}
        path = self._path(run_id, "shards", f"{first:012d}-{last + 1:012d}.json")
        try:
            self._write_json(path, doc)
        except _Exists:
            old = self._read_json(path)
            if not (isinstance(old, dict) and old.get("run_id") == run_id
                    and canonical_json(old.get("states")) == canonical_json(_roundtrip(body))):
                raise StoreError(self.display(path), "already exists with different states for the same shards "
                                 "(another writer of this run disagrees); refusing to overwrite it") from None
        return path, doc["checksum"]

    def shard_files(self, run_id: str) -> list[str]:
        """The shard files of a run, in name order.

        Names that do not claim to be shard files (``.DS_Store``, ``*.json~``, editor swap
        files, interrupted writes ``*.tmp-*``) are ignored, with a warning once per name; a name
        that looks like a shard file but is not ``<12 digits>-<12 digits>.json`` is refused.
        """
        base = self._path(run_id, "shards")
        if not self.fs.exists(base):
            return []
        out = []
        for p in sorted(self.fs.ls(base, detail=False)):
            name = posixpath.basename(p.rstrip("/"))
            if _SHARD_FILE.fullmatch(name):
                out.append(p)
            elif ".tmp-" in name:
                continue  # an interrupted write of ours: never accepted, never a complaint
            elif _LOOKS_LIKE_SHARD.fullmatch(name):
                raise StoreError(self.display(p), "is named like a shard file but not <12 digits>-<12 digits>.json; "
                                 "it is not a shard file of this store (move it out of shards/)")
            else:
                _warn_foreign(self.display(p))
        return out

    def read_shards(self, run_id: str, decoder=decode) -> dict[int, tuple[Any, str, str]]:
        """``{shard: (state, worker, file)}`` for every stored shard.

        A shard stored in two files (two writers with different task sizes) is accepted when
        both hold the same state; different states are refused naming both files.
        """
        out: dict[int, tuple[Any, str, str]] = {}
        raw: dict[int, str] = {}
        for path in self.shard_files(run_id):
            doc = self._expect(path, self._read_json(path), SHARDS_FORMAT, run_id)
            body = doc.get("states")
            if not isinstance(body, dict) or doc.get("checksum") != _checksum(body):
                raise StoreError(self.display(path), "checksum does not match its content (corrupt or edited)")
            a, b = (int(x) for x in _SHARD_FILE.fullmatch(posixpath.basename(path)).groups())
            for key, value in body.items():
                if not _INDEX.fullmatch(key) or not a <= int(key) < b:
                    raise StoreError(self.display(path), f"holds shard {key!r} outside its range [{a}, {b})")
                s = int(key)
                text = canonical_json(value)
                if s in out:
                    if raw[s] == text:
                        continue  # the same state written twice: harmless
                    raise StoreError(self.display(path), f"holds shard {key} with a state different from the one in "
                                     f"{self.display(out[s][2])}; one of the two files is wrong (replay the shard "
                                     "to see which, then move that file aside)")
                try:
                    out[s] = (decoder(value), str(doc.get("worker", "?")), path)
                except (CodecError, ValueError, TypeError, KeyError) as e:
                    raise StoreError(self.display(path), f"shard {key} cannot be decoded: {e}") from None
                raw[s] = text
        return out

    def quarantine(self, run_id: str, path: str, reason: str) -> str:
        """Move a shard file aside (never deleted) and record why."""
        dest = self._path(run_id, "quarantine", posixpath.basename(path))
        self._guard(dest)
        if self._local:
            sfd = qfd = None
            try:
                sfd = self._open_dir(posixpath.dirname(path), create=False)
                qfd = self._open_dir(posixpath.dirname(dest), create=True)
                if stat.S_ISLNK(os.stat(posixpath.basename(path), dir_fd=sfd, follow_symlinks=False).st_mode):
                    raise self._link_error(path)
                os.rename(posixpath.basename(path), posixpath.basename(dest), src_dir_fd=sfd, dst_dir_fd=qfd)
            except StoreError:
                raise
            except OSError as e:
                raise StoreError(self.display(path), f"could not be moved to quarantine/ ({_oserror(e)})") from None
            finally:
                for fd in (sfd, qfd):
                    if fd is not None:
                        os.close(fd)
        else:
            self.fs.makedirs(posixpath.dirname(dest), exist_ok=True)
            self.fs.mv(path, dest)
        self._write_json(dest + ".reason.json", {"reason": reason, "time": time.time()}, overwrite=True)
        return dest

    def refuse_links(self, run_id: str) -> None:
        """Refuse, before any computing, a symbolic link in a run's directory tree (local stores)."""
        if not self._local:
            return
        top = self.run_dir(run_id)
        self._refuse_links(top)
        if not os.path.isdir(top):
            return
        for dirpath, dirnames, filenames in os.walk(top):
            for name in dirnames + filenames:
                p = os.path.join(dirpath, name)
                if os.path.islink(p):
                    raise StoreError(self.display(p), "is a symbolic link inside the store; writes never follow "
                                     "links (replace it by a real directory or file, or point --store at the target)")

    # -- one writer per run -----------------------------------------------------------------
    def lease(self, run_id: str, *, timeout: float | None = None, wait: float | None = None,
              announce=None) -> Lease:
        """A :class:`Lease` on ``run_id``: enter it to become the run's only writer."""
        return Lease(self, run_id, timeout=timeout, wait=wait, announce=announce)

    # -- result -----------------------------------------------------------------------------
    def write_result(self, run_id: str, summary: dict) -> None:
        doc = {"format": RESULT_FORMAT, "run_id": run_id, **summary}
        self._write_json(self._path(run_id, "result.json"), _finite_json(doc), overwrite=True)

    def read_result(self, run_id: str) -> dict | None:
        path = self._path(run_id, "result.json")
        if not self.fs.exists(path):
            return None
        return self._expect(path, self._read_json(path), RESULT_FORMAT, run_id)


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
    """

    POLL = 0.25

    def __init__(self, store: RunStore, run_id: str, *, timeout: float | None = None,
                 wait: float | None = None, announce=None):
        from .. import config

        self.store, self.run_id = store, run_id
        self.path = store._path(run_id, "lease.json")
        self.lock_path = store._path(run_id, "lease.lock")
        self.timeout = float(config.get("montecarlo.lease-timeout", timeout))
        if not (self.timeout > 0 and self.timeout != float("inf")):
            raise StoreError(store.display(self.path), f"lease-timeout {self.timeout!r} must be a positive, finite "
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
        return {"format": "dask-research-lease/1", "run_id": self.run_id, "token": self.token, "owner": user,
                "host": socket.gethostname(), "pid": os.getpid(), "started": started, "heartbeat": time.time()}

    def _raw(self) -> bytes | None:
        """The lease file's bytes (``None``: no lease); a FIFO or device is a StoreError, at once."""
        try:
            if self.store._local:
                return self.store._read_bytes(self.path)
            return self.store.fs.cat_file(self.path)
        except FileNotFoundError:
            return None
        except StoreError:
            raise
        except OSError as e:
            raise StoreError(self.store.display(self.path), f"cannot be read ({_oserror(e)})") from None

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
        key = raw if raw is not None else canonical_json(_finite_json(h)).encode()
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
            ago = time.time() - float(h.get("heartbeat"))
            # Another host's clock, or a forged value: a future or non-finite heartbeat is not a time.
            age = f", heartbeat {ago:.0f} s ago by its clock" if 0 <= ago < 1e9 else ", heartbeat unknown"
        except (TypeError, ValueError, OverflowError):
            age = ", heartbeat unknown"
        return f"{h.get('owner', '?')} on host {h.get('host', '?')}, pid {h.get('pid', '?')} (since {when}{age})"

    @contextlib.contextmanager
    def _locked(self):
        """``flock`` on ``runs/<id>/lease.lock`` (local stores; elsewhere a no-op)."""
        st = self.store
        if not st._local:
            yield
            return
        import fcntl

        parent, name = posixpath.split(self.lock_path)
        try:
            pfd = st._open_dir(parent, create=True)
        except StoreError:
            raise
        except OSError as e:
            raise StoreError(st.display(parent), f"cannot be created ({_oserror(e)})") from None
        try:
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644, dir_fd=pfd)
        except OSError as e:
            os.close(pfd)
            raise StoreError(st.display(self.lock_path), f"cannot be opened ({_oserror(e)})") from None
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
        st, data = self.store, json.dumps(doc).encode()
        if st._local:
            try:
                st._write_local(self.path, data, overwrite=False)   # tmp + hard link: whole or absent
            except _Exists:
                return False
            return True
        if st.fs.exists(self.path):
            return False
        st.fs.makedirs(posixpath.dirname(self.path), exist_ok=True)
        st.fs.pipe_file(self.path, data)
        h = self.holder()                     # the last writer of a race wins; the others see its token
        return bool(h) and h.get("token") == self.token

    def _take_over(self, seen: bytes | None = None) -> bool:
        """Remove the stale lease whose content was ``seen``; False if it changed meanwhile."""
        st = self.store
        if not st._local:
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
            pfd = st._open_dir(parent, create=False)
            try:
                try:
                    os.rename(name, aside, src_dir_fd=pfd, dst_dir_fd=pfd)   # one taker wins the rename
                except FileNotFoundError:
                    return True
                try:
                    again = st._read_bytes(posixpath.join(parent, aside))
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
                self.announce(f"{self.store.display(self.path)}: taking over a stale lease of {self.describe(h)} "
                              f"(unchanged for {time.monotonic() - self._seen[1]:.0f} s here, or its process is dead)")
                self._take_over(raw)
                self._seen = None
                continue
            if not said:
                self.waited = h
                self.announce(f"run {self.run_id[:12]} in {redact(self.store.url)} is being written by another run: "
                              f"{self.describe(h)}; waiting for it, then resuming from what it stored "
                              f"(taken over if its lease does not change for {self.timeout:g} s)")
                said = True
            if self.wait is not None and time.monotonic() - t0 > self.wait:
                raise StoreError(self.store.display(self.path), f"run {self.run_id[:12]} is held by another run: "
                                 f"{self.describe(h)}; gave up after waiting {self.wait:g} s "
                                 "(research.montecarlo.lease-wait)")
            time.sleep(self.POLL)
        self._held, self._lost = True, None
        self.store._leases[self.run_id] = self
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
            what = self.store.display(path) if path else self.store.display(self.path)
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
                    self.store._write_json(self.path, self._doc(started), overwrite=True)
            except Exception:     # a transient store error: try again next beat
                continue

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.store._leases.get(self.run_id) is self:
            del self.store._leases[self.run_id]
        if self._held:
            self._held = False
            try:
                with self._locked():
                    h = self.holder()
                    if h and h.get("token") == self.token:
                        self.store.fs.rm(self.path)
            except (OSError, StoreError):
                pass

    def __enter__(self) -> Lease:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
