"""A run store's files, read and written so that nothing in the store can mislead or escape it.

Files are JSON (never pickle), written to a temporary name and renamed on local file systems
(one ``put`` on object stores), so a partial write is never visible as accepted. On local
stores every write goes through directory descriptors opened one component at a time with
``O_NOFOLLOW`` (a symbolic link inside the store is refused, never followed), and every read
refuses what is not a regular file of at most :data:`MAX_FILE_BYTES` (a FIFO, a device) at
once, instead of blocking. Whatever goes wrong is a one-line
:class:`~dask_research.exceptions.StoreError` that names the file.

Examples
--------
>>> import tempfile
>>> files = StoreFiles(tempfile.mkdtemp()).prepare()
>>> path = files.path("ab" * 32, "result.json")
>>> files.write_json(path, {"x": 1})
>>> files.read_json(path)
{'x': 1}
>>> files.write_json(path, {"x": 2})
Traceback (most recent call last):
...
dask_research.montecarlo.store.files.Exists: ...result.json: already exists; refusing to overwrite it
"""
from __future__ import annotations

import errno
import json
import os
import posixpath
import stat
import uuid
from collections.abc import Callable
from typing import Any

import fsspec

from ...exceptions import StoreError
from .layout import is_run_id, redact

__all__ = ["StoreFiles", "Exists", "MAX_FILE_BYTES", "oserror"]

#: Largest file the store reads (a shard file of a 4 KiB accumulator x 4096 shards is ~40 MiB).
MAX_FILE_BYTES = 256 * 2**20


class Exists(StoreError):
    """The file a no-overwrite write targets exists already."""


def oserror(e: OSError) -> str:
    """An ``OSError`` as ``strerror [ENAME]``, for a one-line message.

    >>> oserror(FileNotFoundError(2, "No such file or directory"))
    'No such file or directory [ENOENT]'
    """
    name = errno.errorcode.get(e.errno, "") if e.errno else ""
    return f"{e.strerror or e}{f' [{name}]' if name else ''}"


class StoreFiles:
    """The files under a store's root (a local path or fsspec URL): paths, safe reads and writes.

    ``guard``, when given, is called with the path before every :meth:`write_json` (the run
    store checks there that it still holds the run's lease).
    """

    def __init__(self, url: str, guard: Callable[[str], None] | None = None, **storage_options: Any):
        self.url = str(url)
        self.fs, self.root = fsspec.core.url_to_fs(self.url, **storage_options)
        self.local = "file" in (self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,))
        self.guard = guard

    def __repr__(self) -> str:
        return f"StoreFiles({redact(self.url)!r})"

    # -- paths ------------------------------------------------------------------------------
    def run_dir(self, run_id: str) -> str:
        """``<root>/runs/<run_id>``; a ``run_id`` that is not 64 lowercase hex characters is refused."""
        if not is_run_id(run_id):
            raise StoreError(str(run_id), "is not a run id (64 lowercase hex characters)")
        return posixpath.join(self.root, "runs", run_id)

    def path(self, run_id: str, *parts: str) -> str:
        """A path inside the run's directory."""
        return posixpath.join(self.run_dir(run_id), *parts)

    def display(self, path: str) -> str:
        """``path`` as messages show it (without credentials)."""
        return redact(path)

    # -- the root ---------------------------------------------------------------------------
    def exists(self) -> bool:
        """Whether the store's root exists (a directory, or a prefix holding files)."""
        try:
            return bool(self.fs.exists(self.root)) and not self.fs.isfile(self.root)
        except OSError:
            return False

    def require(self) -> StoreFiles:
        """Raise :class:`StoreError` unless the store exists (readers never create one)."""
        if self.local and os.path.lexists(self.root) and not os.path.isdir(self.root):
            raise StoreError(self.display(self.root), "is a file, not a run store (a directory)")
        if not self.exists():
            raise StoreError(self.display(self.root), "does not exist; give the path or URL of the store "
                             "the run was written to (mc run --store ...)")
        return self

    def prepare(self) -> StoreFiles:
        """Create the store's root for writing, or raise a one-line :class:`StoreError` why not."""
        where = self.display(self.root)
        if self.local:
            if os.path.lexists(self.root) and not os.path.isdir(self.root):
                raise StoreError(where, "is a file, not a run store; give a directory (it is created if missing)")
            try:
                os.makedirs(self.root, exist_ok=True)
            except OSError as e:
                raise StoreError(where, f"cannot be created ({e.strerror or e}); give a writable directory") from None
            if not os.access(self.root, os.W_OK | os.X_OK):
                raise StoreError(where, "is not writable by this user; give a writable directory")
            self.refuse_links_to(posixpath.join(self.root, "runs", "x"))
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

    # -- writing ----------------------------------------------------------------------------
    def refuse_links_to(self, path: str) -> None:
        """Refuse a symbolic link anywhere between the store's root and ``path`` (local stores).

        Writes never follow a link inside a store: a linked ``runs/``, ``runs/<id>``,
        ``shards/`` or file would put (or overwrite) files outside it. The root itself may be
        a link (that is where you chose to put the store).
        """
        if not self.local:
            return
        rel = posixpath.relpath(path, self.root)
        if rel.startswith(".."):
            raise StoreError(self.display(path), f"lies outside the store {self.display(self.root)}")
        cur = self.root
        for part in rel.split("/"):
            cur = posixpath.join(cur, part)
            if os.path.islink(cur):
                raise self.link_error(cur)
            if not os.path.lexists(cur):
                return

    def link_error(self, path: str) -> StoreError:
        """The refusal of a symbolic link at ``path`` inside the store."""
        return StoreError(self.display(path), "is a symbolic link inside the store; writes never follow links "
                          "(replace it by a real directory or file, or point --store at the target)")

    def open_dir(self, path: str, create: bool) -> int:
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
                        raise self.link_error(cur) from None
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

    def open_parent(self, path: str) -> tuple[int, str]:
        """A descriptor of ``path``'s directory, created if missing (see :meth:`open_dir`), and its name."""
        parent, name = posixpath.split(path)
        try:
            return self.open_dir(parent, create=True), name
        except StoreError:
            raise
        except OSError as e:
            raise StoreError(self.display(parent), f"cannot be created ({oserror(e)})") from None

    def write_json(self, path: str, obj: Any, overwrite: bool = False) -> None:
        """Write ``obj`` as compact JSON (no NaN) whole at ``path``; without ``overwrite`` an existing file is :class:`Exists`."""
        data = json.dumps(obj, indent=None, separators=(",", ":"), allow_nan=False).encode()
        if self.guard is not None:
            self.guard(path)
        if self.local:
            self.write_local(path, data, overwrite)
            return
        try:
            if not overwrite and self.fs.exists(path):
                raise Exists(self.display(path), "already exists; refusing to overwrite it")
            self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
            self.fs.pipe_file(path, data)   # one put: an object appears whole or not at all
        except StoreError:
            raise
        except OSError as e:
            raise StoreError(self.display(path), f"could not be written ({oserror(e)})") from None

    def write_local(self, path: str, data: bytes, overwrite: bool) -> None:
        """Temporary file (exclusive, not following links), fsync, then an atomic link or rename.

        Everything happens relative to the parent directory's descriptor (see
        :meth:`open_dir`), so no path is resolved twice and no link inside the store is followed.
        """
        pfd, name = self.open_parent(path)
        tmp = f"{name}.tmp-{uuid.uuid4().hex[:8]}"
        made = False
        try:
            try:
                st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if st is not None and stat.S_ISLNK(st.st_mode):
                raise self.link_error(path)
            if st is not None and not overwrite:
                raise Exists(self.display(path), "already exists; refusing to overwrite it")
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
                    raise Exists(self.display(path), "already exists; refusing to overwrite it") from None
                except OSError as e:
                    if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                        raise
                    try:                            # a file system without hard links
                        os.stat(name, dir_fd=pfd, follow_symlinks=False)
                        raise Exists(self.display(path), "already exists; refusing to overwrite it") from None
                    except FileNotFoundError:
                        os.replace(tmp, name, src_dir_fd=pfd, dst_dir_fd=pfd)
        except StoreError:
            raise
        except OSError as e:
            raise StoreError(self.display(path), f"could not be written ({oserror(e)}); nothing was stored "
                             "under this name and the run can be resumed once the cause is fixed") from None
        finally:
            if made:
                try:
                    os.unlink(tmp, dir_fd=pfd)
                except OSError:   # renamed into place, or the directory vanished
                    pass
            os.close(pfd)

    # -- reading ----------------------------------------------------------------------------
    def read_bytes(self, path: str) -> bytes:
        """A store file's bytes: a regular file of at most :data:`MAX_FILE_BYTES`, never blocking.

        Local files are opened with ``O_NONBLOCK`` and checked with ``fstat``: a FIFO, a device
        or a socket (or a link to one) is refused at once instead of blocking or reading without
        end; at most ``MAX_FILE_BYTES + 1`` bytes are ever read. Raises ``FileNotFoundError``
        for a missing file and :class:`StoreError` for anything else.
        """
        if not self.local:
            try:
                with self.fs.open(path, "rb") as f:
                    raw = f.read(MAX_FILE_BYTES + 1)
            except FileNotFoundError:
                raise
            except OSError as e:
                raise StoreError(self.display(path), f"cannot be read ({oserror(e)})") from None
        else:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            except FileNotFoundError:
                raise
            except OSError as e:
                raise StoreError(self.display(path), f"cannot be read ({oserror(e)})") from None
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
                raise StoreError(self.display(path), f"cannot be read ({oserror(e)})") from None
            finally:
                os.close(fd)
        if len(raw) > MAX_FILE_BYTES:
            raise StoreError(self.display(path), f"is more than the {MAX_FILE_BYTES:,} bytes a store file may have")
        return raw

    def read_json(self, path: str) -> Any:
        """The JSON document at ``path``; a missing, oversized or invalid file is a :class:`StoreError`."""
        try:
            raw = self.read_bytes(path)
        except FileNotFoundError:
            raise StoreError(self.display(path), "does not exist") from None
        try:
            return json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
            raise StoreError(self.display(path), f"is not valid JSON ({type(e).__name__}: {e}); "
                             "the file is corrupt or not a dask-research store file") from None

    def expect(self, path: str, doc: Any, fmt: str, run_id: str) -> dict:
        """``doc`` if it is a ``fmt`` document of ``run_id``; else a :class:`StoreError` naming ``path``."""
        if not isinstance(doc, dict):
            raise StoreError(self.display(path), f"holds a {type(doc).__name__}, not a {fmt} document")
        if doc.get("format") != fmt:
            raise StoreError(self.display(path), f"has format {doc.get('format')!r}; expected {fmt!r}")
        if doc.get("run_id") != run_id:
            raise StoreError(self.display(path), f"belongs to run {str(doc.get('run_id'))[:16]!r}, not {run_id[:16]}")
        return doc

    def refuse_links_under(self, top: str) -> None:
        """Refuse a symbolic link at or anywhere below the directory ``top`` (local stores)."""
        if not self.local:
            return
        self.refuse_links_to(top)
        if not os.path.isdir(top):
            return
        for dirpath, dirnames, filenames in os.walk(top):
            for name in dirnames + filenames:
                p = os.path.join(dirpath, name)
                if os.path.islink(p):
                    raise self.link_error(p)
