"""Files under one root, read and written so that nothing in them can mislead, block or escape.

:class:`Files` is the one way the project touches its own files (Monte-Carlo stores,
experiment journals, replay checkpoints). Its rules, the same for every capability:

- **No link is followed inside the root.** Local paths are reached one component at a time
  from the root's descriptor with ``O_NOFOLLOW | O_DIRECTORY`` (the root itself may be a link:
  that is where you chose to put it); a symbolic link anywhere below it is refused, never
  followed, so a link swapped in after a check cannot redirect a write or a read.
- **Nothing but regular files is opened**, and never blockingly: every open adds
  ``O_NONBLOCK`` and checks ``fstat`` before a byte is read, so a FIFO, a device (a link to
  ``/dev/zero``), a socket or a directory is refused at once, by name.
- **Every read is bounded** by a size cap given by the reader, and **every write is checked
  against the same cap**, so the project never writes a file its own readers would refuse.
- **Writes are atomic.** A new file is written whole to a temporary name (``O_EXCL``), synced,
  then hard-linked into place (never replacing: a concurrent writer loses cleanly) or renamed
  over the old one; the directory is synced after. On object stores a write is one ``put``.
- **Every failure is one line in the capability's own error type** (``error``: a
  ``StoreError``, a ``CheckpointError``) naming the file; a decoded document that is not JSON
  the project writes (:mod:`.jsondoc`) is refused the same way.

Examples
--------
>>> import tempfile
>>> from dask_research.exceptions import StoreError
>>> files = Files(tempfile.mkdtemp(), error=StoreError)
>>> path = files.join("runs", "a", "doc.json")
>>> files.write_json(path, {"x": 1}, cap=1024)
True
>>> files.write_json(path, {"x": 2}, cap=1024)          # never replaces unless asked
False
>>> files.read_json(path, cap=1024)
{'x': 1}
>>> files.write_json(path, {"x": "y" * 2000}, cap=1024)
Traceback (most recent call last):
...
dask_research.exceptions.StoreError: .../runs/a/doc.json: would be 2,008 bytes, more than the 1,024 its readers accept; nothing was written
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import posixpath
import re
import shutil
import stat
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from . import jsondoc

__all__ = ["Files", "ErrorFactory", "AppendFile", "oserror", "kind_of", "redact", "TMP_MARK",
           "missing_dirs", "remove_empty_dirs"]

#: Makes an exception of the capability's own type from ``(path as shown, problem)``.
ErrorFactory = Callable[[str, str], Exception]

#: Part of every temporary name :class:`Files` writes (``<name>.tmp-<8 hex>``): readers that list
#: a directory skip such names (an interrupted write, never accepted).
TMP_MARK = ".tmp-"

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = os.O_NOFOLLOW
_DIRECTORY = os.O_DIRECTORY
#: How long :meth:`Files.flock` waits for a lock another process holds before it says so.
FLOCK_WAIT = 30.0


def oserror(e: OSError) -> str:
    """An ``OSError`` as ``strerror [ENAME]``, for a one-line message.

    >>> oserror(FileNotFoundError(2, "No such file or directory"))
    'No such file or directory [ENOENT]'
    """
    name = errno.errorcode.get(e.errno, "") if e.errno else ""
    return f"{e.strerror or e}{f' [{name}]' if name else ''}"


def kind_of(mode: int) -> str:
    """What a file of ``mode`` is, in words.

    >>> kind_of(stat.S_IFIFO), kind_of(stat.S_IFREG)
    ('a FIFO', 'a regular file')
    """
    return ("a regular file" if stat.S_ISREG(mode) else "a directory" if stat.S_ISDIR(mode)
            else "a symbolic link" if stat.S_ISLNK(mode) else "a FIFO" if stat.S_ISFIFO(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")


def redact(url: str) -> str:
    """``url`` without credentials (``s3://key:secret@bucket`` -> ``s3://***@bucket``).

    >>> redact("s3://key:secret@bucket/runs")
    's3://***@bucket/runs'
    """
    return re.sub(r"//[^/@]*@", "//***@", str(url))


def printable(text: Any, limit: int = 200) -> str:
    """``text`` as one printable line for a message: control characters (a newline that would
    forge a line of output, a terminal escape from a hostile file name or field) shown escaped,
    and at most ``limit`` characters of it.

    >>> printable("x\\n  mean 42\\x1b[2J")
    'x\\\\n  mean 42\\\\x1b[2J'
    >>> printable("a" * 10, limit=4)
    'aaaa...'
    """
    text = str(text)
    out = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text[:limit])
    return out + ("..." if len(text) > limit else "")


def missing_dirs(path: str) -> list[str]:
    """The local directories from the first missing ancestor of ``path`` down to ``path``: what
    creating ``path`` makes (none where it exists). With :func:`remove_empty_dirs`, a command that
    fails before it wrote anything leaves no empty directory behind.

    >>> import tempfile, os
    >>> base = tempfile.mkdtemp()
    >>> [os.path.relpath(d, base) for d in missing_dirs(os.path.join(base, "a", "b"))]
    ['a', 'a/b']
    """
    missing: list[str] = []
    while not os.path.lexists(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return missing[::-1]


def remove_empty_dirs(made: Sequence[str]) -> None:
    """Remove the directories ``made`` (outermost first, as :func:`missing_dirs` lists them), the
    innermost first, while they are empty; the first that is not (something was written into
    it) stays, with every one above it."""
    for path in reversed(made):
        try:
            os.rmdir(path)
        except OSError:          # not empty, or gone: keep what is there
            return


def _is_local_url(url: str) -> bool:
    return "://" not in url or url.startswith("file://")


class Files:
    """The files under ``root`` (a local directory or an fsspec URL), with the rules above.

    Paths given to the methods are absolute paths inside the root (build them with
    :meth:`join`); one outside it is refused. ``error`` makes the capability's exception from
    ``(path as shown, problem)``. ``fs`` is the fsspec file system (created on first use for
    local roots, which never need it).
    """

    def __init__(self, root: str | os.PathLike[str], *, error: ErrorFactory,
                 storage_options: dict[str, Any] | None = None):
        self.url = os.fspath(root)
        self.error = error
        self.local = _is_local_url(self.url)
        self._fs: Any = None
        self._options = dict(storage_options or {})
        if self.local:
            text = self.url[len("file://"):] if self.url.startswith("file://") else self.url
            self.root = posixpath.normpath(os.path.abspath(text))
        else:
            import fsspec

            self._fs, self.root = fsspec.core.url_to_fs(self.url, **self._options)

    def __repr__(self) -> str:
        return f"Files({redact(self.url)!r})"

    @property
    def fs(self) -> Any:
        """The fsspec file system of the root."""
        if self._fs is None:
            import fsspec

            self._fs = fsspec.filesystem("file")
        return self._fs

    @property
    def storage_options(self) -> dict[str, Any]:
        """The fsspec storage options the root was opened with."""
        return dict(self._options)

    # -- paths ------------------------------------------------------------------------------
    def join(self, *parts: str) -> str:
        """``root/part/...`` (each part one name, or a relative path without ``..``)."""
        return posixpath.join(self.root, *parts)

    def display(self, path: str) -> str:
        """``path`` as messages show it: spelled as the root was given (``memory://x/runs``, not
        fsspec's ``/x/runs``), without credentials, control characters escaped (:func:`printable`).

        >>> Files("memory://store/a", error=OSError).display("/store/a/runs")
        'memory://store/a/runs'
        """
        if not self.local:
            root = self.root.rstrip("/")
            if path == root or path.startswith(root + "/"):
                path = self.url.rstrip("/") + path[len(root):]
            elif "://" not in path:
                path = self.fs.unstrip_protocol(path)
        return printable(redact(path), limit=4096)

    def fail(self, path: str, problem: str) -> Exception:
        """The capability's error for ``path`` (to ``raise``)."""
        return self.error(self.display(path), problem)

    def _parts(self, path: str) -> list[str]:
        rel = posixpath.relpath(path, self.root)
        if rel == ".":
            return []
        parts = rel.split("/")
        if ".." in parts:
            raise self.fail(path, f"lies outside {self.display(self.root)}")
        return parts

    def dangling_link(self, path: str) -> str | None:
        """``"is a symbolic link to T, which does not exist"`` if the local ``path`` is a link to
        nothing (a root given as a link whose target was removed), else ``None``. Links inside the
        root are refused whatever they point at (:meth:`link_error`); a root may be one.
        """
        if not self.local or not os.path.islink(path) or os.path.exists(path):
            return None
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        return f"is a symbolic link to {printable(target, 4096)}, which does not exist"

    def link_error(self, path: str) -> Exception:
        """The refusal of a symbolic link at ``path`` inside the root."""
        return self.fail(path, "is a symbolic link; links inside it are refused, never followed (replace it "
                         "by a real file or directory, or point at the link's target instead)")

    # -- directories (local) ----------------------------------------------------------------
    def open_dir(self, path: str, create: bool = False) -> int:
        """A descriptor of the directory ``path``, reached one component at a time without links.

        With ``create``, missing directories (and the root) are made. Raises
        ``FileNotFoundError`` for a missing one, the capability's error for a link or a file.
        """
        parts = self._parts(path)
        if create:
            try:
                _makedirs_synced(self.root)
            except OSError as e:
                raise self.fail(self.root, f"cannot be created ({oserror(e)})") from None
        try:
            fd = os.open(self.root, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
        except FileNotFoundError:
            dangling = self.dangling_link(self.root)
            if create and dangling:
                raise self.fail(self.root, f"{dangling}; create that directory or point at another") from None
            raise
        except OSError as e:
            if e.errno == errno.ENOTDIR:
                raise self.fail(self.root, "is a file, not a directory") from None
            raise self.fail(self.root, f"cannot be opened ({oserror(e)})") from None
        try:
            cur = self.root
            for part in parts:
                cur = posixpath.join(cur, part)
                if create:
                    try:
                        os.mkdir(part, 0o777, dir_fd=fd)
                        _fsync(fd)       # the new directory's name, durable before anything in it is
                    except FileExistsError:
                        pass
                    except OSError as e:
                        raise self.fail(cur, f"cannot be created ({oserror(e)})") from None
                try:
                    nfd = os.open(part, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=fd)
                except FileNotFoundError:
                    raise
                except OSError as e:
                    st = self._lstat_at(fd, part)
                    if st is not None and stat.S_ISLNK(st.st_mode):
                        raise self.link_error(cur) from None
                    if st is not None and not stat.S_ISDIR(st.st_mode):
                        raise self.fail(cur, f"is {kind_of(st.st_mode)}, not a directory") from None
                    raise self.fail(cur, f"cannot be opened ({oserror(e)})") from None
                os.close(fd)
                fd = nfd
            return fd
        except BaseException:
            os.close(fd)
            raise

    @contextlib.contextmanager
    def directory(self, path: str, create: bool = False) -> Iterator[int]:
        """:meth:`open_dir` as a context manager (the descriptor is closed on exit)."""
        fd = self.open_dir(path, create)
        try:
            yield fd
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def parent(self, path: str, create: bool = False) -> Iterator[tuple[int, str]]:
        """``(descriptor of path's directory, path's name)``; see :meth:`open_dir`."""
        if path == self.root:
            raise self.fail(path, "is the root directory, not a file in it")
        folder, name = posixpath.split(path)
        with self.directory(folder, create) as fd:
            yield fd, name

    @staticmethod
    def _lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
        try:
            return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            return None

    def refuse_links_under(self, top: str) -> None:
        """Refuse a symbolic link between the root and ``top``, or anywhere below ``top`` (local)."""
        if not self.local:
            return
        try:
            fd = self.open_dir(top)
        except FileNotFoundError:
            return
        try:
            self._walk_refusing_links(fd, top)
        finally:
            os.close(fd)

    def _walk_refusing_links(self, fd: int, where: str) -> None:
        for entry in os.scandir(fd):
            path = posixpath.join(where, entry.name)
            if entry.is_symlink():
                raise self.link_error(path)
            if entry.is_dir(follow_symlinks=False):
                try:
                    sub = os.open(entry.name, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=fd)
                except OSError as e:
                    raise self.fail(path, f"cannot be opened ({oserror(e)})") from None
                try:
                    self._walk_refusing_links(sub, path)
                finally:
                    os.close(sub)

    # -- what is there ----------------------------------------------------------------------
    def exists(self, path: str) -> bool:
        """Whether anything (a link included) is at ``path``; a link on the way is refused."""
        if not self.local:
            try:
                return bool(self.fs.exists(path))
            except OSError:
                return False
        if path == self.root:
            return os.path.isdir(self.root)
        try:
            with self.parent(path) as (fd, name):
                return self._lstat_at(fd, name) is not None
        except FileNotFoundError:
            return False

    def listdir(self, path: str, dirs_only: bool = False) -> list[str]:
        """The names in directory ``path``, sorted (``[]`` if it does not exist); with
        ``dirs_only``, only those of real directories (a symbolic link to one is left out)."""
        if not self.local:
            try:
                if not self.fs.exists(path):
                    return []
                entries = self.fs.ls(path, detail=True)
            except OSError as e:
                raise self.fail(path, f"cannot be listed ({oserror(e)})") from None
            return sorted(posixpath.basename(e["name"].rstrip("/")) for e in entries
                          if not dirs_only or e.get("type") == "directory")
        try:
            with self.directory(path) as fd:
                names = os.listdir(fd)
                if dirs_only:
                    names = [n for n in names if (st := self._lstat_at(fd, n)) is not None and stat.S_ISDIR(st.st_mode)]
                return sorted(names)
        except FileNotFoundError:
            return []

    # -- reading ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def open_read(self, path: str) -> Iterator[int]:
        """A descriptor of the regular file ``path`` for reading (local), closed on exit.

        Opened without following a link and without blocking, then checked with ``fstat``:
        a link, FIFO, device, socket or directory is refused before a byte is read. A missing
        file raises ``FileNotFoundError``.
        """
        with self.parent(path) as (pfd, name):
            fd = self._open_regular(pfd, name, path, os.O_RDONLY, "read")
        try:
            yield fd
        finally:
            os.close(fd)

    def _open_regular(self, pfd: int, name: str, path: str, flags: int, doing: str) -> int:
        """``name`` in directory ``pfd`` opened with ``flags`` (plus no links, no blocking),
        and only if it is a regular file; ``FileNotFoundError`` if it is missing (unless
        ``flags`` create it). Anything else is refused with the capability's error."""
        try:
            fd = os.open(name, flags | _NOFOLLOW | os.O_NONBLOCK | _CLOEXEC, 0o644, dir_fd=pfd)
        except (FileNotFoundError, FileExistsError):
            raise
        except OSError as e:
            st = self._lstat_at(pfd, name)
            if st is not None and stat.S_ISLNK(st.st_mode):
                raise self.link_error(path) from None
            if st is not None and not stat.S_ISREG(st.st_mode):
                raise self.fail(path, f"is {kind_of(st.st_mode)}, not a regular file; refused") from None
            raise self.fail(path, f"cannot be {doing} ({oserror(e)})") from None
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            raise self.fail(path, f"is {kind_of(mode)}, not a regular file; refused before reading "
                            "or writing a byte (it could block or never end)")
        return fd

    def read_bytes(self, path: str, cap: int) -> bytes:
        """The bytes of the regular file ``path``: at most ``cap`` (a larger file is refused).

        Raises ``FileNotFoundError`` for a missing file and the capability's error otherwise.
        """
        if not self.local:
            try:
                with self.fs.open(path, "rb") as f:
                    raw = f.read(cap + 1)
            except FileNotFoundError:
                raise
            except OSError as e:
                raise self.fail(path, f"cannot be read ({oserror(e)})") from None
        else:
            with self.open_read(path) as fd:
                size = os.fstat(fd).st_size
                if size > cap:
                    raise self.fail(path, f"is {size:,} bytes, more than the {cap:,} it may have")
                raw = _read_at_most(fd, cap + 1, lambda e: self.fail(path, f"cannot be read ({oserror(e)})"))
        if len(raw) > cap:
            raise self.fail(path, f"is more than the {cap:,} bytes it may have")
        return raw

    def read_json(self, path: str, cap: int, max_depth: int = jsondoc.MAX_DEPTH) -> Any:
        """The JSON document at ``path`` (:func:`.jsondoc.loads`); a missing or malformed file is refused."""
        try:
            raw = self.read_bytes(path, cap)
        except FileNotFoundError:
            raise self.fail(path, "does not exist") from None
        try:
            return jsondoc.loads(raw, max_depth)
        except jsondoc.Malformed as e:
            raise self.fail(path, f"{e}; the file is corrupt, or not one this project wrote") from None

    # -- writing ----------------------------------------------------------------------------
    def _check_cap(self, path: str, size: int, cap: int) -> None:
        if size > cap:
            raise self.fail(path, f"would be {size:,} bytes, more than the {cap:,} its readers accept; "
                            "nothing was written")

    def write_bytes(self, path: str, data: bytes, *, cap: int, replace: bool = False, sync: bool = True) -> bool:
        """Write ``data`` whole at ``path``: True if written, False if it exists (without ``replace``).

        Local: a temporary file (``O_EXCL``, no links), written, synced, then hard-linked into
        place (atomic, never replacing) or, with ``replace``, renamed over the old file; the
        directory is synced. Object stores: one ``put``. ``data`` longer than ``cap`` (what its
        readers accept) is refused before anything is written. ``sync=False`` skips both syncs
        (still whole or absent, but possibly lost to a power cut): for files that are only ever
        a hint of something alive, such as a lease's heartbeat, written under a lock others wait on.
        """
        self._check_cap(path, len(data), cap)
        if not self.local:
            try:
                if not replace and self.fs.exists(path):
                    return False
                self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
                self.fs.pipe_file(path, data)   # one put: whole or absent
            except OSError as e:
                raise self.fail(path, f"could not be written ({oserror(e)})") from None
            return True
        try:
            with self.parent(path, create=True) as (pfd, name):
                return self._write_local(pfd, name, path, data, replace, sync)
        except FileNotFoundError as e:     # the directory vanished under us
            raise self.fail(path, f"could not be written ({oserror(e)}); nothing was stored under "
                            "this name") from None

    def _write_local(self, pfd: int, name: str, path: str, data: bytes, replace: bool, sync: bool) -> bool:
        st = self._lstat_at(pfd, name)
        if st is not None and stat.S_ISLNK(st.st_mode):
            raise self.link_error(path)
        if st is not None and not replace:
            return False
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise self.fail(path, f"is {kind_of(st.st_mode)}, not a regular file; refusing to replace it")
        tmp = f"{name}{TMP_MARK}{uuid.uuid4().hex[:8]}"
        made = False
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o644, dir_fd=pfd)
            made = True
            try:
                _write_all(fd, data)
                if sync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            if replace:
                os.replace(tmp, name, src_dir_fd=pfd, dst_dir_fd=pfd)
            elif not self._link_into_place(pfd, tmp, name):
                return False
            if sync:
                _fsync(pfd)
            return True
        except OSError as e:
            raise self.fail(path, f"could not be written ({oserror(e)}); nothing was stored under this name") \
                from None
        finally:
            if made:
                with contextlib.suppress(OSError):   # renamed into place already, or the directory went
                    os.unlink(tmp, dir_fd=pfd)

    @staticmethod
    def _link_into_place(pfd: int, tmp: str, name: str) -> bool:
        """Hard-link ``tmp`` to ``name`` (False: ``name`` exists). On a file system without hard
        links it renames with ``RENAME_NOREPLACE``, as exclusive; only where that is refused too
        does it check, then rename, and two racing creators could then both win."""
        try:
            os.link(tmp, name, src_dir_fd=pfd, dst_dir_fd=pfd, follow_symlinks=False)
            return True
        except FileExistsError:
            return False
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                raise
        # No hard links here: a rename that refuses an existing name is just as exclusive.
        created = _rename_noreplace(pfd, tmp, name)
        if created is not None:
            return created
        if Files._lstat_at(pfd, name) is not None:     # neither: check, then rename (best effort)
            return False
        os.replace(tmp, name, src_dir_fd=pfd, dst_dir_fd=pfd)
        return True

    def write_json(self, path: str, obj: Any, *, cap: int, replace: bool = False) -> bool:
        """:meth:`write_bytes` of ``obj`` as compact JSON (:func:`.jsondoc.dumps`)."""
        try:
            data = jsondoc.dumps(obj)
        except jsondoc.Malformed as e:
            raise self.fail(path, f"not written: the document {e}") from None
        return self.write_bytes(path, data, cap=cap, replace=replace)

    @contextlib.contextmanager
    def new_file(self, path: str, cap: int) -> Iterator[Any]:
        """A new regular file at ``path`` to write into (``O_EXCL``, no links), synced on exit.

        Yields a binary file object. If the block raises, or the file ends up larger than
        ``cap``, the file is removed and the capability's error raised (for the cap).
        Meant for files inside a fresh directory that is then renamed into place.
        """
        with self.parent(path, create=True) as (pfd, name):
            try:
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o644, dir_fd=pfd)
            except OSError as e:
                raise self.fail(path, f"could not be created ({oserror(e)})") from None
            ok = False
            try:
                with os.fdopen(fd, "wb", closefd=True) as f:
                    yield f
                    f.flush()
                    size = os.fstat(f.fileno()).st_size
                    self._check_cap(path, size, cap)
                    os.fsync(f.fileno())
                _fsync(pfd)
                ok = True
            finally:
                if not ok:
                    with contextlib.suppress(OSError):
                        os.unlink(name, dir_fd=pfd)

    def make_dir(self, path: str) -> None:
        """Create the directory ``path`` (its parent must exist, or is created); it must not exist."""
        with self.parent(path, create=True) as (pfd, name):
            try:
                os.mkdir(name, 0o777, dir_fd=pfd)
            except OSError as e:
                raise self.fail(path, f"could not be created ({oserror(e)})") from None
            _fsync(pfd)

    def rename(self, src: str, dst: str) -> None:
        """Move ``src`` to ``dst`` (replacing a file there), both inside the root; both directories synced."""
        if not self.local:
            try:
                self.fs.makedirs(posixpath.dirname(dst), exist_ok=True)
                self.fs.mv(src, dst)
            except OSError as e:
                raise self.fail(src, f"could not be moved to {self.display(dst)} ({oserror(e)})") from None
            return
        with self.parent(src) as (sfd, sname), self.parent(dst, create=True) as (dfd, dname):
            st = self._lstat_at(sfd, sname)
            if st is not None and stat.S_ISLNK(st.st_mode):
                raise self.link_error(src)
            try:
                os.rename(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd)
            except OSError as e:
                raise self.fail(src, f"could not be moved to {self.display(dst)} ({oserror(e)})") from None
            _fsync(dfd)
            _fsync(sfd)

    def remove(self, path: str) -> None:
        """Remove the file (or link) ``path``; nothing there is fine."""
        if not self.local:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(path)
            return
        try:
            with self.parent(path) as (pfd, name):
                os.unlink(name, dir_fd=pfd)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise self.fail(path, f"could not be removed ({oserror(e)})") from None

    def remove_tree(self, path: str) -> None:
        """Remove the directory ``path`` and what it holds, never following a link; nothing there is fine."""
        if not self.local:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(path, recursive=True)
            return
        try:
            with self.parent(path) as (pfd, name):
                st = self._lstat_at(pfd, name)
                if st is None:
                    return
                if not stat.S_ISDIR(st.st_mode):
                    os.unlink(name, dir_fd=pfd)      # a link or a file where a directory was: unlink it
                    return
                shutil.rmtree(name, dir_fd=pfd)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise self.fail(path, f"could not be removed ({oserror(e)})") from None

    # -- appending (local) ------------------------------------------------------------------
    def open_append(self, path: str, cap: int) -> AppendFile:
        """An :class:`AppendFile` on ``path`` (created if missing; no link, only a regular file)."""
        with self.parent(path, create=True) as (pfd, name):
            created = False
            flags = os.O_WRONLY | os.O_APPEND
            try:
                fd = self._open_regular(pfd, name, path, flags | os.O_CREAT | os.O_EXCL, "created")
                created = True
            except FileExistsError:
                fd = self._open_regular(pfd, name, path, flags, "opened for writing")
            os.set_blocking(fd, True)
            if created:
                _fsync(pfd)
        return AppendFile(self, path, fd, cap)

    # -- locks (local) ----------------------------------------------------------------------
    @contextlib.contextmanager
    def flock(self, path: str, wait: float = FLOCK_WAIT, create: bool = True) -> Iterator[None]:
        """Hold ``flock`` on the lock file ``path`` (created if missing; never a link), briefly.

        The file's content is never read or written and the file is never removed (removing a
        file another process is about to lock lets two processes hold two "locks"). Waits at
        most ``wait`` seconds for another holder, then raises the capability's error. On a
        file system without locks the block runs unlocked (what callers do under the lock must
        be safe without it, only less tidy). Elsewhere than local files: a no-op. Without
        ``create`` a missing directory is ``FileNotFoundError``, never made again (a heartbeat must
        not bring back a directory its user removed).
        """
        if not self.local:
            yield
            return
        with self.parent(path, create=create) as (pfd, name):
            fd = self._open_regular(pfd, name, path, os.O_RDWR | os.O_CREAT, "opened")
        try:
            deadline = time.monotonic() + wait
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise self.fail(path, f"has been locked by another process for more than {wait:g} s; "
                                        "a holder keeps it for milliseconds, so that process is stuck: stop it") \
                            from None
                    time.sleep(0.01)
                except OSError as e:
                    if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                        break     # no locks on this file system
                    raise self.fail(path, f"cannot be locked ({oserror(e)})") from None
            yield
        finally:
            os.close(fd)          # closing drops the lock


def _renameat2() -> Any:
    try:
        import ctypes  # only here: the one call the os module lacks
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (ImportError, AttributeError, OSError):   # no ctypes, not Linux, or a libc without it
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_RENAMEAT2 = _renameat2()
_RENAME_NOREPLACE = 1


def _rename_noreplace(dir_fd: int, src: str, dst: str) -> bool | None:
    """Rename ``src`` to ``dst`` in ``dir_fd`` only if ``dst`` does not exist, atomically
    (Linux's ``renameat2(RENAME_NOREPLACE)``): ``True`` renamed, ``False`` ``dst`` exists,
    ``None`` not supported here (no such call, or a file system that refuses the flag).

    On a network file system the guarantee is only as strong as its client and server make it
    (an SMB client checks the name on its own host first): exclusive among the processes of one
    host, best effort between hosts."""
    if _RENAMEAT2 is None:
        return None
    if _RENAMEAT2(dir_fd, os.fsencode(src), dir_fd, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
        return True
    import ctypes  # loaded already by _renameat2
    err = ctypes.get_errno()
    if err == errno.EEXIST:
        return False
    # EPERM: a sandbox (seccomp) that forbids the call itself; a rename that is really not
    # permitted fails again, with its own error, in the caller's fallback.
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM):
        return None
    raise OSError(err, os.strerror(err), dst)


class AppendFile:
    """A regular file opened for appending whole records, within a size cap (see :meth:`Files.open_append`)."""

    def __init__(self, files: Files, path: str, fd: int, cap: int):
        self.files, self.path, self.fd, self.cap = files, path, fd, cap

    @property
    def size(self) -> int:
        """The file's size now."""
        return os.fstat(self.fd).st_size

    def write(self, data: bytes) -> int:
        """Append ``data`` in one ``write`` (looped only if the kernel takes less); the new size.

        Refused, with nothing written, if the file would grow past its cap.
        """
        size = self.size
        if size + len(data) > self.cap:
            raise self.files.fail(self.path, f"would grow to {size + len(data):,} bytes, more than the "
                                  f"{self.cap:,} its readers accept; nothing was written")
        written = 0
        try:
            view = memoryview(data)
            while view:
                n = os.write(self.fd, view)
                written += n
                view = view[n:]
        except OSError as e:
            raise self.files.fail(self.path, f"could not be written ({oserror(e)}); "
                                  f"{self._cut_back(size, written)}") from None
        return size + len(data)

    def _cut_back(self, size: int, written: int) -> str:
        """After a failed append of which ``written`` bytes landed at ``size``: cut them off again
        (a full disk takes part of a record before it refuses the rest; the next record must not
        be glued to it), but only if the file ends where this write left it. If another writer
        appended meanwhile, cutting would take its records too: the torn part stays, for readers
        to skip. Says what is left."""
        if written == 0:
            return "nothing was written"
        try:
            if os.fstat(self.fd).st_size == size + written:
                os.ftruncate(self.fd, size)
                return "nothing was written"
        except OSError:
            pass
        return (f"{written:,} bytes of this record could not be removed and stay in the file as a torn "
                "record (its readers skip it)")

    def truncate(self, size: int) -> None:
        """Cut the file to ``size`` bytes (a torn tail)."""
        os.ftruncate(self.fd, size)

    def sync(self) -> None:
        """``fsync`` the file."""
        os.fsync(self.fd)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _read_at_most(fd: int, limit: int, fail: Callable[[OSError], Exception]) -> bytes:
    chunks, left = [], limit
    try:
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as e:
        raise fail(e) from None
    return b"".join(chunks)


def _makedirs_synced(path: str) -> None:
    """``os.makedirs(path, exist_ok=True)``, with each directory it makes synced in its parent
    (a crash must not lose the name of a directory whose files were synced)."""
    try:
        os.mkdir(path)
    except FileExistsError:                  # a directory, or something its opener refuses
        return
    except FileNotFoundError:
        parent = os.path.dirname(os.path.abspath(path))
        if parent == os.path.abspath(path):
            raise
        _makedirs_synced(parent)
        try:
            os.mkdir(path)
        except FileExistsError:              # made meanwhile by another process
            return
    parent_fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    try:
        _fsync(parent_fd)
    finally:
        os.close(parent_fd)


def _fsync(fd: int) -> None:
    """``fsync`` a directory descriptor (what makes a rename or link durable); never fails."""
    with contextlib.suppress(OSError):
        os.fsync(fd)
