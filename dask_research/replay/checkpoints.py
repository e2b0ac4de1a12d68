"""Checkpoint files of the experience plane: one atomic commit per checkpoint, one writer, no pickle.

Every checkpoint of a plane (:meth:`ExperiencePlane.checkpoint`) and of a cluster shard
(``WorkerShard.checkpoint``) is written here, and every file of it is opened, read, written,
renamed and removed through the durability layer (:class:`~dask_research.durable.Files`, with
:class:`~dask_research.exceptions.CheckpointError` as its error). A checkpoint directory holds
committed *versions*, a pointer naming the current one, and the lease of its writer::

    ck/
      CURRENT            one line: "v000007" (replaced atomically: the commit)
      v000007/
        data.npz         one uncompressed .npy member per array, no pickle
        meta.json        spec, ring counters, sampler/generator/limiter state, the byte count
                         and SHA-256 of data.npz, and (shards) the shard's identity
      .lease             the writer's lease (owner, host, pid, heartbeat), while it lives
      .lock              what a lease take-over and each heartbeat ``flock`` for a moment
                         (the file the writers before the durable layer locked; never removed)

**One writer per directory, for its lifetime.** A :class:`Writer` takes the directory's
:class:`~dask_research.durable.Lease` at its first checkpoint and keeps it, heartbeating, until
it is closed (a plane's or a shard's ``close()``): a second live writer, in this process or
another, is refused with a :class:`CheckpointError` naming it (``wait=0``: no waiting for a
live holder); a holder whose process is dead on this host is taken over at once, and one whose
lease has not changed for ``research.replay.checkpoint-lease-timeout`` (30) seconds of the new writer's own clock (frozen,
or on a host that went away) is taken over then. A writer that was taken over stops with a
:class:`CheckpointError` before its next step instead of writing next to the new holder; its
next checkpoint asks for the lease anew (refused while the new holder lives).

**A write** goes through four named steps: ``data-written`` and ``meta-written`` (both files in
a fresh temporary directory, each synced, then the directory), ``version-renamed`` (that
directory renamed to ``vNNNNNN``, not yet current) and ``pointer-committed`` (``CURRENT``
replaced atomically: the commit). Only then are older versions and leftovers of interrupted
writes removed. A process killed at any point leaves the previous checkpoint restorable and
untouched, or the new one committed; a reader never pairs one version's metadata with
another's data (each version names the digest of its own data file).

**Readers** follow ``CURRENT`` (a name that is not ``vNNNNNN`` is refused, so a hostile pointer
cannot send a restore elsewhere). A directory without ``CURRENT`` but with ``meta.json`` is
read as the layout of dask-research before versioned checkpoints (no digest); a versioned
checkpoint whose ``meta.json`` lacks the ``data`` record is refused. No link inside the
checkpoint is followed and nothing but a regular file is opened (a FIFO, a device or a link is
refused before a byte is read; the checkpoint directory itself may be a link). ``CURRENT`` and
``meta.json`` are read up to :data:`POINTER_BYTES` and :data:`MAX_META_BYTES`, the caps their
writer enforces; ``meta.json`` must be strict JSON (no ``NaN``, bounded depth). ``data.npz``
must have the size and digest its metadata records, and, before any array is read, its members
must be exactly the arrays the caller expects (:class:`Array`: dtype and shape, from the spec
and the counts, never from sizes the metadata claims), each stored uncompressed with an
``.npy`` header that matches: a restore never allocates more than the file holds, and an
unknown, compressed or oversized member is refused.

Examples
--------
>>> import tempfile, numpy as np
>>> from dask_research.replay import checkpoints
>>> d = tempfile.mkdtemp()
>>> v = checkpoints.write(d, {"format": "example"}, {"x": np.arange(3)})
>>> v.name, checkpoints.current(d) == v
('v000001', True)
>>> meta, arrays, where = checkpoints.load(d, expect=lambda meta: {"x": checkpoints.Array("int64", (3,))})
>>> arrays["x"].tolist(), meta["data"]["bytes"] > 0
([0, 1, 2], True)
>>> checkpoints.load(d, expect=lambda meta: {"y": checkpoints.Array("int64", (3,))})
Traceback (most recent call last):
...
dask_research.exceptions.CheckpointError: checkpoint .../v000001/data.npz: holds an array 'x' that this checkpoint does not have (expected exactly: 'y'); refused before reading any array
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import pathlib
import posixpath
import re
import threading
import uuid
import zipfile
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from .. import config
from ..durable import TMP_MARK, Files, Lease
from ..exceptions import CheckpointError

__all__ = ["write", "load", "read_meta", "current", "Writer", "Array", "POINTER", "LEASE", "LOCK",
           "STEPS", "MAX_META_BYTES", "POINTER_BYTES", "LEASE_TIMEOUT", "NPY_HEADER_BYTES",
           "npz_cap"]

logger = logging.getLogger(__name__)

#: file naming the committed version
POINTER = "CURRENT"
#: the named steps of a write, in order (see the module docstring)
STEPS = ("data-written", "meta-written", "version-renamed", "pointer-committed")
#: the writer's lease file (a :class:`~dask_research.durable.Lease`: owner, host, pid, heartbeat)
LEASE = ".lease"
#: the file a lease take-over and each heartbeat ``flock`` for a moment (never removed; the
#: writers before the durable layer held it for a whole write and left it empty)
LOCK = ".lock"
#: the most bytes a ``meta.json`` may have (its writer refuses more, its readers read no more)
MAX_META_BYTES = 64 * 2**20
#: the most bytes ``CURRENT`` may have (a version name and a newline)
POINTER_BYTES = 64
#: seconds of a waiting writer's own clock after which a lease that has not changed is stale
#: (its holder beats every quarter of it or every 5 s, whichever is sooner, from a thread of its
#: own, while its process lives);
#: ``None``: ``research.replay.checkpoint-lease-timeout`` (30 s)
LEASE_TIMEOUT: float | None = None
#: the most bytes an ``.npy`` header in ``data.npz`` may have (numpy writes about 128)
NPY_HEADER_BYTES = 4096
#: bytes of zip bookkeeping per member (local header, central entry, zip64 records), beyond
#: its name (twice) and its ``.npy`` header
_ZIP_MEMBER_BYTES = 256
_ZIP_END_BYTES = 1024
_VERSION = re.compile(r"v([0-9]{6,})")
_OLD_TMP_PREFIX = ".tmp-"            # temporary names of the writers before the durable layer

#: Called with each step's name as the write passes it (tests pause or kill the process there).
_step_hook: Callable[[str], None] | None = None


def _step(name: str) -> None:
    hook = _step_hook
    if hook is not None:
        hook(name)


def _files(path: str | os.PathLike[str]) -> Files:
    files = Files(path, error=CheckpointError)
    if not files.local:
        raise CheckpointError(files.display(files.url), "is not a local directory; replay checkpoints are "
                              "written to and read from local (or network-mounted) directories")
    return files


@dataclasses.dataclass(frozen=True)
class Array:
    """An array a checkpoint's ``data.npz`` must hold: its exact ``dtype`` and ``shape``.

    ``required=False``: it may be absent (never different).
    """

    dtype: Any
    shape: tuple[int, ...]
    required: bool = True

    @property
    def nbytes(self) -> int:
        n = np.dtype(self.dtype).itemsize
        for s in self.shape:
            n *= int(s)
        return n


#: What a reader expects of ``data.npz``, from the (validated) metadata: array name -> Array.
Expect = Callable[[dict[str, Any]], Mapping[str, Array]]


def npz_cap(arrays: Mapping[str, Array]) -> int:
    """The most bytes a ``data.npz`` holding ``arrays`` may have: their bytes plus bookkeeping.

    The writer refuses to write more and the reader refuses to read more (the same function).

    >>> npz_cap({"x": Array("int64", (3,))})
    5410
    """
    return _ZIP_END_BYTES + sum(a.nbytes + NPY_HEADER_BYTES + _ZIP_MEMBER_BYTES + 2 * len(name.encode()) + 8
                                for name, a in arrays.items())


def _versions(names: Iterable[str]) -> list[int]:
    return sorted(int(m.group(1)) for m in map(_VERSION.fullmatch, names) if m)


# --- reading --------------------------------------------------------------------------------
def _pointer(files: Files) -> str | None:
    """The version name ``CURRENT`` holds (None without ``CURRENT``)."""
    path = files.join(POINTER)
    try:
        raw = files.read_bytes(path, POINTER_BYTES)
    except FileNotFoundError:
        return None
    try:
        name = raw.decode("utf-8").strip()
    except UnicodeDecodeError as e:
        raise files.fail(path, f"is not a version name (not UTF-8 text: byte {e.start})") from None
    if not _VERSION.fullmatch(name):
        raise files.fail(path, f"names {name[:40]!r}; expected a version directory name like 'v000001'")
    return name


def current(path: str | os.PathLike[str]) -> pathlib.Path | None:
    """The committed version directory of checkpoint ``path`` (None if none was committed).

    Raises :class:`CheckpointError` if ``CURRENT`` names something other than a version, or is
    not a regular file.
    """
    files = _files(path)
    if not files.exists(files.root):
        return None
    name = _pointer(files)
    return None if name is None else pathlib.Path(files.join(name))


def _locate(files: Files, version: str | os.PathLike[str] | None) -> tuple[str, bool]:
    """``(directory holding meta.json, versioned)`` of the committed version (or of ``version``)."""
    missing = files.fail(files.join("meta.json"), "is missing (no committed checkpoint: not a checkpoint, "
                         "or its first write never finished)")
    if not files.exists(files.root):
        raise missing
    name: str | None
    if version is not None and posixpath.normpath(os.path.abspath(os.fspath(version))) != files.root:
        name = pathlib.Path(version).name
        if not _VERSION.fullmatch(name):
            raise files.fail(files.join(name), "is not a version directory name like 'v000001'")
    elif version is None:
        name = _pointer(files)
    else:
        name = None
    if name is None:                       # the layout before versioned checkpoints
        if not files.exists(files.join("meta.json")):
            raise missing
        return files.root, False
    where = files.join(name)
    with contextlib.suppress(FileNotFoundError), files.directory(where):
        return where, True                 # a link or a file there is refused by directory()
    if version is not None:
        raise files.fail(where, "is gone (a newer checkpoint replaced it after it was read); read "
                         "the checkpoint again")
    raise files.fail(files.join(POINTER), f"names {name}, which is missing")


def _meta_at(files: Files, where: str) -> dict[str, Any]:
    path = posixpath.join(where, "meta.json")
    meta = files.read_json(path, cap=MAX_META_BYTES)
    if not isinstance(meta, dict):
        raise files.fail(path, f"holds {type(meta).__name__}, not an object; not a checkpoint's metadata")
    return meta


def read_meta(path: str | os.PathLike[str], version: str | os.PathLike[str] | None = None
              ) -> tuple[dict[str, Any], pathlib.Path]:
    """``(meta, version directory)`` of the committed checkpoint at ``path`` (or of the
    version directory ``version`` that an earlier call returned)."""
    files = _files(path)
    where, _ = _locate(files, version)
    return _meta_at(files, where), pathlib.Path(where)


def load(path: str | os.PathLike[str], version: str | os.PathLike[str] | None = None,
         expect: Expect | None = None) -> tuple[dict[str, Any], dict[str, np.ndarray], pathlib.Path]:
    """``(meta, arrays, version directory)`` of the committed checkpoint at ``path`` (or of
    ``version``, a directory :func:`read_meta` returned).

    ``expect(meta)`` says which arrays ``data.npz`` must hold (:class:`Array`; it may also
    refuse the metadata by raising): the member list must be exactly those names, and each
    member is checked (stored uncompressed, an ``.npy`` header of that dtype and shape, no more
    bytes than that) before any array is read; without ``expect``, any uncompressed members are
    read, each bounded by its own header. The data file must also match the size and SHA-256
    its metadata records (a versioned checkpoint without that record is refused; only the
    layout before versions lacks it). Nothing is unpickled. Any problem raises
    :class:`CheckpointError` naming the file.
    """
    files = _files(path)
    where, versioned = _locate(files, version)
    meta = _meta_at(files, where)
    meta_path, data_path = posixpath.join(where, "meta.json"), posixpath.join(where, "data.npz")
    rec = meta.get("data")
    if versioned and rec is None:
        raise files.fail(meta_path, "has no 'data' record (the size and SHA-256 of its data.npz, which every "
                         "versioned checkpoint records); refused")
    if rec is not None and (not isinstance(rec, dict) or not isinstance(rec.get("sha256"), str)
                            or type(rec.get("bytes")) is not int or rec["bytes"] < 0):
        raise files.fail(meta_path, f"has a malformed 'data' record {str(rec)[:80]}; expected "
                         "{\"file\": \"data.npz\", \"bytes\": <count>, \"sha256\": <hex digest>}")
    expected = None if expect is None else dict(expect(meta))
    try:
        with files.open_read(data_path) as fd:
            size = os.fstat(fd).st_size
            cap = npz_cap(expected) if expected is not None else rec["bytes"] if rec is not None else None
            if cap is not None and size > cap:
                raise files.fail(data_path, f"is {size:,} bytes, more than the {cap:,} "
                                 + ("the arrays its metadata describes take" if expected is not None
                                    else "its metadata records") + "; refused unread")
            if rec is not None and (size != rec["bytes"] or _sha256(files, data_path, fd, size) != rec["sha256"]):
                raise files.fail(data_path, f"does not match its meta.json ({size:,} bytes, "
                                 f"{rec['bytes']:,} recorded, or another digest; the file was changed or truncated)")
            os.lseek(fd, 0, os.SEEK_SET)
            with os.fdopen(os.dup(fd), "rb") as f:
                arrays = _read_npz(files, data_path, f, size, expected)
    except FileNotFoundError:
        raise files.fail(data_path, "is missing") from None
    return meta, arrays, pathlib.Path(where)


def _sha256(files: Files, path: str, fd: int, size: int) -> str:
    h, left = hashlib.sha256(), size
    os.lseek(fd, 0, os.SEEK_SET)
    while left > 0:
        try:
            block = os.read(fd, min(left, 1 << 20))
        except OSError as e:
            raise files.fail(path, f"cannot be read ({e.strerror or e})") from None
        if not block:
            break
        h.update(block)
        left -= len(block)
    return h.hexdigest()


def _unreadable(files: Files, path: str, e: BaseException) -> Exception:
    return files.fail(path, f"is unreadable ({type(e).__name__}: {str(e)[:200]})")


def _read_npz(files: Files, path: str, f: Any, size: int, expected: Mapping[str, Array] | None
              ) -> dict[str, np.ndarray]:
    """The arrays of the ``.npz`` file ``f`` (``size`` bytes), each member checked before it is read."""
    try:
        zf = zipfile.ZipFile(f)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
        raise _unreadable(files, path, e) from None
    with zf:
        infos = zf.infolist()
        names = [i.filename[:-4] if i.filename.endswith(".npy") else i.filename for i in infos]
        for info in infos:
            if not info.filename.endswith(".npy"):
                raise files.fail(path, f"holds a member {info.filename[:60]!r} that is not an .npy array; refused")
        if len(set(names)) != len(names):
            raise files.fail(path, "holds an array twice; refused")
        if expected is not None:
            shown = ", ".join(repr(n) for n in expected)
            for name in names:
                if name not in expected:
                    raise files.fail(path, f"holds an array {name[:60]!r} that this checkpoint does not have "
                                     f"(expected exactly: {shown}); refused before reading any array")
            for name, a in expected.items():
                if a.required and name not in names:
                    raise files.fail(path, f"has no array {name!r} (expected exactly: {shown})")
        plans = [_check_member(files, path, zf, info, name, size, None if expected is None else expected[name])
                 for info, name in zip(infos, names)]
        return {name: _read_member(files, path, zf, info, name, *plan)
                for (info, name), plan in zip(zip(infos, names), plans)}


def _check_member(files: Files, path: str, zf: zipfile.ZipFile, info: zipfile.ZipInfo, name: str,
                  size: int, want: Array | None) -> tuple[np.dtype, tuple[int, ...], bool, int]:
    """``(dtype, shape, fortran order, header bytes)`` of member ``info``, or the refusal."""
    if info.compress_type != zipfile.ZIP_STORED:
        raise files.fail(path, f"array {name!r} is compressed; a checkpoint stores its arrays uncompressed "
                         "(so that reading one never allocates more than the file holds); refused")
    if info.flag_bits & 0x1:
        raise files.fail(path, f"array {name!r} is encrypted; refused")
    if info.file_size != info.compress_size or info.file_size > size:
        raise files.fail(path, f"array {name!r} claims {info.file_size:,} bytes in a file of {size:,}; refused")
    try:
        with zf.open(info) as m:
            version = np.lib.format.read_magic(m)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(m, max_header_size=NPY_HEADER_BYTES)
            elif version in ((2, 0), (3, 0)):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(m, max_header_size=NPY_HEADER_BYTES)
            else:
                raise ValueError(f".npy format version {version}")
            header = m.tell()
    except Exception as e:  # noqa: BLE001 - numpy raises ValueError, SyntaxError, ...; all: unreadable
        raise files.fail(path, f"array {name!r} has an unreadable .npy header ({type(e).__name__}: "
                         f"{str(e)[:160]})") from None
    dtype = np.dtype(dtype)
    if dtype.hasobject:
        raise files.fail(path, f"array {name!r} holds Python objects ({dtype}); nothing is unpickled; refused")
    if want is not None and (dtype != np.dtype(want.dtype) or tuple(shape) != tuple(want.shape)):
        raise files.fail(path, f"array {name!r} is {dtype} {tuple(shape)}; this checkpoint's metadata makes it "
                         f"{np.dtype(want.dtype)} {tuple(want.shape)} (a restore casts nothing)")
    nbytes = dtype.itemsize
    for s in shape:
        nbytes *= int(s)
    if header + nbytes != info.file_size:
        raise files.fail(path, f"array {name!r} has {info.file_size - header:,} bytes of data; its header "
                         f"({dtype} {tuple(shape)}) makes it {nbytes:,}")
    return dtype, tuple(shape), bool(fortran), header


def _read_member(files: Files, path: str, zf: zipfile.ZipFile, info: zipfile.ZipInfo, name: str,
                 dtype: np.dtype, shape: tuple[int, ...], fortran: bool, header: int) -> np.ndarray:
    nbytes = info.file_size - header
    buf = bytearray(nbytes)
    view = memoryview(buf)
    try:
        with zf.open(info) as m:
            m.read(header)
            got = 0
            while got < nbytes:
                block = m.read(min(nbytes - got, 1 << 20))
                if not block:
                    break
                view[got:got + len(block)] = block
                got += len(block)
            m.read(1)                     # at the end: zipfile checks the member's CRC
    except Exception as e:  # noqa: BLE001 - a torn member: BadZipFile, EOFError, zlib.error
        raise files.fail(path, f"array {name!r} is unreadable ({type(e).__name__}: {str(e)[:160]})") from None
    if got != nbytes:
        raise files.fail(path, f"array {name!r} ends after {got:,} of its {nbytes:,} bytes")
    return np.frombuffer(buf, dtype=dtype).reshape(shape, order="F" if fortran else "C")


# --- writing --------------------------------------------------------------------------------
class Writer:
    """The one writer of checkpoint directory ``path``, for its lifetime (see the module docstring).

    :meth:`write` commits a version; the first one takes the directory's lease, which is kept
    (heartbeating) until :meth:`close`. Writes of one writer from several threads are
    serialised (a periodic shard checkpoint and a requested one may overlap: the second waits).
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.files = _files(path)
        self.path = self.files.root
        self.lease: Lease | None = None
        self.closed = False
        self._mutex = threading.Lock()

    def __repr__(self) -> str:
        return f"Writer({self.path!r}, held={bool(self.lease is not None and self.lease.held)})"

    def _acquire(self) -> Lease:
        files = self.files

        def announce(kind: str, message: str) -> None:
            (logger.warning if kind == "takeover" else logger.info)("%s", message)

        lease = Lease(files, files.join(LEASE), lock_path=files.join(LOCK),
                      label=f"checkpoint directory {files.display(self.path)}",
                      timeout=config.resolve("replay.checkpoint-lease-timeout", LEASE_TIMEOUT), wait=0, fmt="dask-research-replay-checkpoint-lease/1",
                      announce=announce,
                      hint="one writer per checkpoint directory for the writer's lifetime: give each plane "
                           "(or shard) its own directory, or close the plane that holds it")
        return lease.acquire()

    def acquire(self) -> Writer:
        """Take the directory's lease now, if this writer does not hold it yet (see :meth:`write`)."""
        with self._mutex:
            self._held()
        return self

    def _held(self) -> Lease:
        if self.closed:
            raise self.files.fail(self.path, "this checkpoint writer was closed (its plane or shard was "
                                  "closed); nothing was written")
        if self.lease is None:
            self.lease = self._acquire()
        return self.lease

    def write(self, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> pathlib.Path:
        """Commit ``meta`` (JSON-able) and ``arrays`` as the new current version; returns its directory.

        ``meta`` gains ``"data": {"file", "bytes", "sha256"}``. On any failure the temporary
        directory is removed and the previous version stays current; an ``OSError`` (a full
        disk) is raised as a :class:`CheckpointError` naming the directory.
        """
        with self._mutex:
            lease = self._held()
            try:
                return _commit(self.files, lease, meta, arrays)
            except OSError as e:           # a full disk, a read-only file system
                raise self.files.fail(self.path, f"could not be written ({type(e).__name__}: "
                                      f"{e.strerror or e}); the previous checkpoint, if any, is kept") from e
            finally:
                if not lease.held:         # taken over (or its file removed): this write stopped
                    self.lease = None      # with the error; a later one must take the lease anew
                    lease.release()

    def write_json(self, name: str, doc: Any, cap: int) -> None:
        """Replace the small JSON document ``name`` beside the versions (atomically, at most
        ``cap`` bytes), as this directory's writer (an integration's own state, e.g. TorchRL's
        ``writer.json``); refused unless this writer holds the lease."""
        if "/" in name or name == POINTER or _VERSION.fullmatch(name) or name.startswith((LEASE, LOCK)):
            raise self.files.fail(self.files.join(name), "is a name the checkpoint itself uses; refused")
        with self._mutex:
            if self.closed or self.lease is None:
                raise self.files.fail(self.files.join(name), "not written: this writer holds no lease on the "
                                      "directory (write a checkpoint first)")
            path = self.files.join(name)
            self.lease.check_held(path)
            self.files.write_json(path, doc, cap=cap, replace=True)

    def close(self) -> None:
        """Release the directory's lease (if this writer holds it); later writes are refused."""
        with self._mutex:
            self.closed = True
            lease, self.lease = self.lease, None
        if lease is not None:
            lease.release()

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def write(path: str | os.PathLike[str], meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]
          ) -> pathlib.Path:
    """Commit one version into ``path`` as a writer of its own (taking the lease for this write only).

    See :meth:`Writer.write`. While another writer holds the directory (a live plane that
    checkpointed there, in this process or another), a :class:`CheckpointError` naming it is
    raised and nothing is written.
    """
    with Writer(path) as w:
        return w.write(meta, arrays)


def _commit(files: Files, lease: Lease, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]
            ) -> pathlib.Path:
    pointer = files.join(POINTER)
    lease.check_held(pointer, fresh=True)
    prev = _pointer(files)
    names = files.listdir(files.root)
    n = max(_versions(names), default=0) + 1
    name = f"v{n:06d}"
    tmp, target = files.join(f"{name}{TMP_MARK}{uuid.uuid4().hex[:8]}"), files.join(name)
    cap = npz_cap({k: Array(np.asarray(a).dtype, np.shape(a)) for k, a in arrays.items()})
    files.make_dir(tmp)
    try:
        data = posixpath.join(tmp, "data.npz")
        with files.new_file(data, cap) as f:
            np.savez(f, **arrays)  # type: ignore[arg-type]  # numpy's stub types **kwds as bool
        with files.open_read(data) as fd:
            size = os.fstat(fd).st_size
            digest = _sha256(files, data, fd, size)
        _step("data-written")
        doc = dict(meta)
        doc["data"] = {"file": "data.npz", "bytes": size, "sha256": digest}
        files.write_json(posixpath.join(tmp, "meta.json"), doc, cap=MAX_META_BYTES)
        _step("meta-written")
        lease.check_held(target, fresh=True)
        files.rename(tmp, target)
        _step("version-renamed")
        lease.check_held(pointer, fresh=True)
        files.write_bytes(pointer, f"{name}\n".encode(), cap=POINTER_BYTES, replace=True)
        _step("pointer-committed")
    except BaseException:
        with contextlib.suppress(Exception):
            files.remove_tree(tmp)
        try:
            committed = _pointer(files) == name
        except CheckpointError:           # an unreadable pointer does not name ours
            committed = False
        if not committed:
            with contextlib.suppress(Exception):
                files.remove_tree(target)
        raise
    _clean(files, keep=name, below=n, legacy=prev is None)
    return pathlib.Path(target)


def _clean(files: Files, keep: str, below: int, legacy: bool) -> None:
    """Remove versions older than ``below`` (but ``keep``) and leftovers of interrupted writes.

    Runs while this writer holds the directory's lease, so every temporary name is a dead
    writer's (or an interrupted take-over's).
    """
    for name in files.listdir(files.root):
        if name == keep or name.startswith((LEASE, LOCK)):     # the lease's files are the lease's business
            continue
        m = _VERSION.fullmatch(name)
        if (m and int(m.group(1)) < below) or name.startswith(_OLD_TMP_PREFIX) or TMP_MARK in name:
            files.remove_tree(files.join(name))
    if legacy:                # a plane checkpointed here before versions: drop its files
        for old in ("meta.json", "data.npz", "shard.json"):
            files.remove(files.join(old))

