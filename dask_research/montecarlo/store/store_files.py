"""A run store's files: :class:`~dask_research.durable.Files` with the store's names, cap and error.

Everything about *how* a file is touched is the durability layer's (:mod:`dask_research.durable`):
no link inside the store is ever followed, only regular files are opened (a FIFO or a device
is refused before a byte is read), every read is bounded by :data:`MAX_FILE_BYTES` and every
write is refused beyond it (the store never writes a file its own readers refuse), writes are
atomic (a temporary file, ``fsync``, a hard link or rename, ``fsync`` of the directory; one
``put`` on object stores) and decoded JSON is strict and bounded. This module adds what is the
store's: where a run's files live, that an existing file is never overwritten unasked
(:class:`Exists`), the guard the run store calls before each write (it checks the run's
lease), and the checking of a decoded document against its schema
(:mod:`dask_research.durable.schema`). Whatever goes wrong is a one-line
:class:`~dask_research.exceptions.StoreError` naming the file.

Examples
--------
>>> import tempfile
>>> files = StoreFiles(tempfile.mkdtemp()).prepare()
>>> path = files.path("ab" * 32, "notes.json")
>>> files.write_json(path, {"x": 1})
>>> files.read_json(path)
{'x': 1}
>>> files.write_json(path, {"x": 2})
Traceback (most recent call last):
...
dask_research.montecarlo.store.store_files.Exists: ...notes.json: already exists; refusing to overwrite it
"""
from __future__ import annotations

import os
import posixpath
from collections.abc import Callable
from typing import Any

from ...durable import Files, missing_dirs, oserror, remove_empty_dirs, schema
from ...exceptions import StoreError
from .layout import RUNS_DIR, is_run_id

__all__ = ["StoreFiles", "Exists", "MAX_FILE_BYTES", "oserror"]

#: Largest file the store reads, and so the largest it writes (a shard file of a 4 KiB
#: accumulator x 4096 shards is ~40 MiB; a larger block is split into several files).
MAX_FILE_BYTES = 256 * 2**20


def cap() -> int:
    """The store's file size cap now (:data:`MAX_FILE_BYTES`, read at each call)."""
    return MAX_FILE_BYTES


class Exists(StoreError):
    """The file a no-overwrite write targets exists already."""


class StoreFiles:
    """The files under a store's root (a local path or fsspec URL): paths, reads and writes.

    ``guard``, when given, is called with the path before every write (the run store checks
    there that it still holds the run's lease). ``files`` is the underlying
    :class:`~dask_research.durable.Files`.
    """

    def __init__(self, url: str, guard: Callable[[str], None] | None = None, **storage_options: Any):
        self.files = Files(str(url), error=StoreError, storage_options=storage_options)
        self.url, self.root, self.local = self.files.url, self.files.root, self.files.local
        self.guard = guard
        #: The directories :meth:`prepare` created, the outermost first (see :meth:`discard_if_unused`).
        self.made: list[str] = []

    def __repr__(self) -> str:
        return f"StoreFiles({self.files.display(self.url)!r})"

    @property
    def fs(self) -> Any:
        """The fsspec file system of the store (object stores; local stores never need it)."""
        return self.files.fs

    @property
    def storage_options(self) -> dict[str, Any]:
        """The fsspec options the store was opened with."""
        return self.files.storage_options

    # -- paths ------------------------------------------------------------------------------
    def run_dir(self, run_id: str) -> str:
        """``<root>/runs/<run_id>``; a ``run_id`` that is not 64 lowercase hex characters is refused."""
        if not is_run_id(run_id):
            raise StoreError(str(run_id), "is not a run id (64 lowercase hex characters)")
        return self.files.join(RUNS_DIR, run_id)

    def path(self, run_id: str, *parts: str) -> str:
        """A path inside the run's directory."""
        return posixpath.join(self.run_dir(run_id), *parts)

    def join(self, *parts: str) -> str:
        """A path under the store's root."""
        return self.files.join(*parts)

    def display(self, path: str) -> str:
        """``path`` as messages show it (without credentials)."""
        return self.files.display(path)

    # -- the root ---------------------------------------------------------------------------
    def exists(self) -> bool:
        """Whether the store's root exists (a directory, or a prefix holding files)."""
        if self.local:
            return os.path.isdir(self.root)
        try:
            return bool(self.fs.exists(self.root)) and not self.fs.isfile(self.root)
        except OSError:
            return False

    def require(self) -> StoreFiles:
        """Raise :class:`StoreError` unless the store exists (readers never create one)."""
        if self.local and os.path.exists(self.root) and not os.path.isdir(self.root):
            raise StoreError(self.display(self.root), "is a file, not a run store (a directory)")
        dangling = self.files.dangling_link(self.root)
        if dangling:
            raise StoreError(self.display(self.root), f"{dangling}; give the path or URL of the store the "
                             "run was written to")
        if not self.exists():
            raise StoreError(self.display(self.root), "does not exist; give the path or URL of the store "
                             "the run was written to (mc run --store ...)")
        return self

    def root_problem(self) -> str | None:
        """Why a local store's root can never be one (it is a file), without touching anything;
        ``None`` where it can (it is a directory, or missing and created by :meth:`prepare`).

        >>> import tempfile
        >>> StoreFiles(tempfile.mkstemp()[1]).root_problem()
        'is a file, not a run store; give a directory (it is created if missing)'
        """
        return self._root_problem(missing_dirs(self.root)) if self.local else None

    def _root_problem(self, made: list[str]) -> str | None:
        """:meth:`root_problem`, given what creating the root would make (:func:`missing_dirs`)."""
        if os.path.exists(self.root) and not os.path.isdir(self.root):
            return "is a file, not a run store; give a directory (it is created if missing)"
        above = os.path.dirname(made[0]) if made else None
        if above and os.path.exists(above) and not os.path.isdir(above):
            return f"cannot be created: {self.display(above)} is a file"
        return None

    def discard_if_unused(self) -> None:
        """Remove the directories :meth:`prepare` created, where nothing was written into them
        since: a run refused before it stored anything (a pilot that fails, a cluster that cannot
        run the job) leaves no empty store behind. A directory something was written into stays.
        """
        remove_empty_dirs(self.made)
        self.made = []

    def prepare(self) -> StoreFiles:
        """Create the store's root for writing, or raise a one-line :class:`StoreError` why not."""
        where = self.display(self.root)
        if self.local:
            made = missing_dirs(self.root)
            problem = self._root_problem(made)
            if problem is not None:
                raise StoreError(where, problem)
            self.made = made
            try:                      # made like every directory of the durability layer: synced
                os.close(self.files.open_dir(self.root, create=True))
            except StoreError as e:
                hint = "; give a writable directory" if e.problem.startswith("cannot be created") else ""
                raise StoreError(where, e.problem + hint) from None
            if not os.access(self.root, os.W_OK | os.X_OK):
                raise StoreError(where, "is not writable by this user; give a writable directory")
            try:                      # a linked runs/ is refused now, before anything is computed
                with self.files.directory(self.files.join(RUNS_DIR)):
                    pass
            except FileNotFoundError:
                pass
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

    # -- what is there ----------------------------------------------------------------------
    def present(self, path: str) -> bool:
        """Whether something is at ``path`` (a link on the way is refused)."""
        return self.files.exists(path)

    def listdir(self, path: str, dirs_only: bool = False) -> list[str]:
        """The names in the directory ``path``, sorted (``[]`` if there is none); with
        ``dirs_only``, only real directories (no link)."""
        return self.files.listdir(path, dirs_only)

    def refuse_links_under(self, top: str) -> None:
        """Refuse a symbolic link between the root and ``top``, or anywhere below it (local stores)."""
        self.files.refuse_links_under(top)

    # -- writing ----------------------------------------------------------------------------
    def write_json(self, path: str, obj: Any, overwrite: bool = False) -> None:
        """Write ``obj`` as compact JSON whole at ``path``, at most :data:`MAX_FILE_BYTES`.

        Without ``overwrite`` an existing file is :class:`Exists` (never replaced).
        """
        if self.guard is not None:
            self.guard(path)
        if not self.files.write_json(path, obj, cap=cap(), replace=overwrite):
            raise Exists(self.display(path), "already exists; refusing to overwrite it")

    def write_raw(self, path: str, data: bytes, overwrite: bool = False) -> None:
        """:meth:`write_json` of a document already encoded (:func:`dask_research.durable.jsondoc.dumps`)."""
        if self.guard is not None:
            self.guard(path)
        if not self.files.write_bytes(path, data, cap=cap(), replace=overwrite):
            raise Exists(self.display(path), "already exists; refusing to overwrite it")

    def rename(self, src: str, dst: str) -> None:
        """Move ``src`` to ``dst`` inside the store (no link followed; both directories synced)."""
        if self.guard is not None:
            self.guard(dst)
        self.files.rename(src, dst)

    # -- reading ----------------------------------------------------------------------------
    def read_bytes(self, path: str) -> bytes:
        """A store file's bytes: a regular file of at most :data:`MAX_FILE_BYTES`, never blocking.

        Raises ``FileNotFoundError`` for a missing file, :class:`StoreError` for anything else.
        """
        return self.files.read_bytes(path, cap())

    def read_json(self, path: str) -> Any:
        """The JSON document at ``path``; a missing, oversized, invalid or too deeply nested file is refused."""
        return self.files.read_json(path, cap())

    def expect(self, path: str, doc: Any, fmt: str, run_id: str) -> dict:
        """``doc`` if it is a ``fmt`` document of ``run_id``; else a :class:`StoreError` naming ``path``."""
        if not isinstance(doc, dict):
            raise StoreError(self.display(path), f"holds a {type(doc).__name__}, not a {fmt} document")
        if doc.get("format") != fmt:
            raise StoreError(self.display(path), f"has format {_short(doc.get('format'))}; expected {fmt!r}")
        if doc.get("run_id") != run_id:
            raise StoreError(self.display(path), f"belongs to run {_short(doc.get('run_id'), 16)}, not {run_id[:16]}")
        return doc

    def check(self, path: str, doc: Any, checker: schema.Checker, what: str) -> Any:
        """``doc`` if ``checker`` admits it, else a :class:`StoreError` naming ``path`` and the wrong value."""
        try:
            return schema.check(doc, checker)
        except schema.Invalid as e:
            raise StoreError(self.display(path), f"{e}; not a {what} this project writes (edited or corrupt)") \
                from None


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
