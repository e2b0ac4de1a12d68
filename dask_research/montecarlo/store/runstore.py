"""The run store: a manifest, accepted shard accumulators as they arrive, and the result.

Where each file lives is in :mod:`.layout`; how they are read and written without trusting
the store is :mod:`.store_files` (the durability layer, :mod:`dask_research.durable`); what each
document may hold is :mod:`.documents`; one writer per run is :mod:`.run_lease`; what a store holds
of a job, asked once before a run, is :mod:`.holdings`. Every manifest and shard file carries a
sha256 of its content, and every document is checked against its schema before it is used: a
corrupt, foreign, truncated or retyped file is refused with a
:class:`~dask_research.exceptions.StoreError` that names it.

Examples
--------
>>> import tempfile
>>> from dask_research.montecarlo import Job, Normal, compute_shard
>>> job = Job(lambda a: a, {"a": Normal(0.0, 1.0)}, shards=2, samples_per_shard=64, seed=1, range=(-5, 5))
>>> store = RunStore(tempfile.mkdtemp())
>>> path = store.write_shards(job.id, {0: compute_shard(job, 0)}, "here")
>>> store.read_shards(job.id)[0][0] == compute_shard(job, 0), store.list_runs() == [job.id]
(True, True)
"""
from __future__ import annotations

import bisect
import hashlib
import os
import posixpath
import re
import time
import warnings
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

from ...durable import jsondoc
from ...exceptions import InputError, StoreError
from ..address import canonical_json
from ..codec import CodecError, decode, encode
from . import store_files as store_files
from .documents import MANIFEST, RESULT, SHARDS
from .holdings import Holdings, state_problem, stored_state_problem, template_of
from .layout import (
    MANIFEST_FILE,
    MANIFEST_FORMAT,
    QUARANTINE_DIR,
    REASON_SUFFIX,
    RESULT_FILE,
    RESULT_FORMAT,
    RUNS_DIR,
    SHARDS_DIR,
    SHARDS_FORMAT,
    StoreWarning,
    checksum,
    classify_shard_name,
    finite_json,
    is_run_id,
    is_shard_index,
    json_roundtrip,
    redact,
    shard_file_name,
    shard_file_range,
)
from .manifest import build_manifest, check_manifest
from .run_lease import Lease
from .store_files import Exists, StoreFiles

if TYPE_CHECKING:
    from ..job import Job
    from ..pilot import Pilot

__all__ = ["RunStore", "BadRunId"]


class BadRunId(StoreError):
    """The run named is not a run id prefix, or more than one run's id starts with it."""


_WARNED: set[str] = set()
#: What follows a shard file's states, up to its checksum's opening quote.
_TAIL = b'},"checksum":'


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, StoreWarning, stacklevel=3)


def _warn_foreign(path: str) -> None:
    _warn_once(f"{path}: not a shard file (foreign name); ignored")


def _range_of(path: str) -> tuple[int, int]:
    """``(first, stop)`` of a path :meth:`RunStore.shard_files` listed (its name matched)."""
    rng = shard_file_range(posixpath.basename(path))
    assert rng is not None, path
    return rng


class RunStore:
    """A run store rooted at ``url`` (a local path or fsspec URL)."""

    def __init__(self, url: str, **storage_options: Any):
        self.files = StoreFiles(url, guard=self._guard, **storage_options)
        self.url, self.root = self.files.url, self.files.root
        self._leases: dict[str, Lease] = {}     # runs this object holds the lease of (see _guard)

    def __repr__(self) -> str:
        return f"RunStore({redact(self.url)!r})"

    @property
    def fs(self) -> Any:
        """The store's fsspec file system."""
        return self.files.fs

    @property
    def location(self) -> str:
        """Where another process opens this store: its absolute local path, or its fsspec URL."""
        return self.root if self.files.local else self.url

    @property
    def storage_options(self) -> dict[str, Any]:
        """The fsspec options the store was opened with (they travel with :attr:`location`)."""
        return self.files.storage_options

    # -- paths ------------------------------------------------------------------------------
    def run_dir(self, run_id: str) -> str:
        """The directory of run ``run_id`` (a whole run id; anything else is refused)."""
        return self.files.run_dir(run_id)

    def path(self, run_id: str, *parts: str) -> str:
        """A path inside run ``run_id``'s directory."""
        return self.files.path(run_id, *parts)

    def display(self, path: str) -> str:
        """``path`` as messages show it (without credentials)."""
        return self.files.display(path)

    # -- existence --------------------------------------------------------------------------
    def exists(self) -> bool:
        """Whether the store's root exists (a directory, or a prefix holding files)."""
        return self.files.exists()

    def require(self) -> RunStore:
        """Raise :class:`StoreError` unless the store exists (readers never create one)."""
        self.files.require()
        return self

    def prepare(self) -> RunStore:
        """Create the store's root for writing, or raise a one-line :class:`StoreError` why not."""
        self.files.prepare()
        return self

    def _guard(self, path: str) -> None:
        """Before a write into a run this store holds the lease of: stop if the lease was lost."""
        rel = posixpath.relpath(path, self.files.join(RUNS_DIR))
        lease = self._leases.get(rel.split("/")[0]) if not rel.startswith("..") else None
        if lease is not None:
            lease.check_held(path, fresh=True)   # each write into the run reads the lease again first

    # -- what the store holds of a job ------------------------------------------------------
    def holdings(self, job: Job, pilot: Pilot | None = None) -> Holdings:
        """Ask the store once what it holds of ``job``; with ``pilot``, a missing manifest is written.

        A run with a manifest is checked against the job (:func:`.manifest.check_manifest`).
        Shards without a manifest (a deleted manifest) are validated against the job and the
        pilot's range, which is a deterministic function of the job, and reused; the manifest is
        then written again. Without ``pilot`` (a reader) the manifest must exist. Every stored
        shard must be what the job's reducer produces (the run's histogram and sample count, or
        the user reducer's state type). The caller of a writing ask holds the run's lease, so
        nobody else writes while this is read.
        """
        run_dir = self.run_dir(job.id)
        mpath = self.display(self.files.path(job.id, MANIFEST_FILE))
        self.refuse_links(job.id)
        if self.has_run(job.id):
            manifest = self.read_manifest(job.id)
            check_manifest(manifest, job, mpath)
            orphan = False
        elif pilot is None:
            manifest = self.read_manifest(job.id)      # raises: does not exist
        else:
            manifest = build_manifest(job, pilot)
            orphan = True
        rng = manifest["range"]
        stored = self.read_shards(job.id)
        reducer = job.make_reducer(tuple(rng) if rng is not None else None) if (rng or job.frozen) else None
        template = reducer.init() if reducer is not None else None
        for s, (state, _, fpath) in stored.items():
            problem = stored_state_problem(job, s, state, template)
            if problem:
                if orphan:
                    problem += (f"; the run's manifest is missing, so these shards cannot be reused: delete "
                                f"{self.display(run_dir)} to compute the run again")
                raise StoreError(self.display(fpath), problem)
        if orphan:
            self.write_manifest(job.id, manifest)
        return Holdings(job.shards, manifest, {s: v[0] for s, v in stored.items()},
                        {s: v[1] for s, v in stored.items()})

    def check_states(self, manifest: dict, stored: dict[int, tuple[Any, str, str]]) -> None:
        """Refuse (naming the file) a stored state that is not what the manifest's run produces.

        For a reader without the job (``show``): the manifest (checked) says the shard count,
        the sample count and, for the built-in accumulator, the histogram. A user reducer's
        states are only known to its code: they are checked by ``replay`` and by a run.
        """
        part = manifest["job"]["partitioning"]
        template, moments = template_of(manifest)
        for s, (state, _, fpath) in sorted(stored.items()):
            problem = state_problem(s, state, template, shards=part["shards"], samples=part["samples_per_shard"],
                                    moments=moments)
            if problem:
                raise StoreError(self.display(fpath), problem)

    # -- manifest ---------------------------------------------------------------------------
    def list_runs(self) -> list[str]:
        """The ids of the runs in the store, sorted: directories named by a run id (a symbolic link
        named like one is left out with a :class:`StoreWarning`; opening it would be refused)."""
        runs = self.files.join(RUNS_DIR)
        real = self.files.listdir(runs, dirs_only=True)
        for name in sorted(set(self.files.listdir(runs)) - set(real)):
            if is_run_id(name) and self.files.local and os.path.islink(posixpath.join(runs, name)):
                _warn_once(f"{self.display(posixpath.join(runs, name))}: a symbolic link, not a run; ignored")
        return [name for name in real if is_run_id(name)]

    def resolve(self, run_id: str) -> str:
        """The whole id of the one run whose id starts with ``run_id`` (a prefix is enough).

        A ``run_id`` that is not a hex prefix, or that several runs start with, is
        :class:`BadRunId` (the caller's mistake: the command line makes it a usage error);
        a prefix no run starts with is a plain :class:`StoreError`.
        """
        if not isinstance(run_id, str) or not run_id or not re.fullmatch(r"[0-9a-f]{1,64}", run_id):
            raise BadRunId(self.display(self.root), f"{run_id!r} is not a run id or a prefix of one (lowercase hex characters)")
        runs = self.list_runs()
        matches = [r for r in runs if r.startswith(run_id)]
        if len(matches) > 1:
            raise BadRunId(self.display(self.root), f"{len(matches)} runs start with {run_id!r}; give more characters")
        if not matches:
            raise StoreError(self.display(self.root), f"has no run starting with {run_id!r} ({len(runs)} "
                             f"run{'s' if len(runs) != 1 else ''} in it; mc show lists them)")
        return matches[0]

    def has_run(self, run_id: str) -> bool:
        """Whether run ``run_id`` has a manifest."""
        return self.files.present(self.files.path(run_id, MANIFEST_FILE))

    def write_manifest(self, run_id: str, manifest: dict) -> None:
        """Sign and write the run's manifest (never replacing one)."""
        doc = {"format": MANIFEST_FORMAT, "run_id": run_id, **manifest}
        doc["checksum"] = checksum({k: v for k, v in doc.items() if k != "checksum"})
        self.files.write_json(self.files.path(run_id, MANIFEST_FILE), doc)

    def read_manifest(self, run_id: str) -> dict:
        """The run's manifest: its format, run id and checksum verified, then its schema (:data:`.documents.MANIFEST`)."""
        path = self.files.path(run_id, MANIFEST_FILE)
        doc = self.files.expect(path, self.files.read_json(path), MANIFEST_FORMAT, run_id)
        body = {k: v for k, v in doc.items() if k != "checksum"}
        if doc.get("checksum") != checksum(body):
            raise StoreError(self.display(path), "checksum does not match its content (edited or corrupt)")
        return self.files.check(path, doc, MANIFEST, "manifest")

    # -- shards -----------------------------------------------------------------------------
    def write_shards(self, run_id: str, states: dict[int, Any], worker: str, encoder: Callable = encode,
                     cap: int | None = None) -> str:
        """Persist accepted shard states: one file for a contiguous set of shard indices.

        A set whose file would be larger than what the store's readers accept (``cap``, default
        :data:`~.store_files.MAX_FILE_BYTES`) is split into several files, each named by its
        ``[first, stop)``; a single shard larger than that is refused before anything is
        written. Idempotent: if a file exists with the same states (another writer of the same
        run got there first), nothing is written; different states under the same name are
        refused. Returns the (first) file's path.
        """
        return self.write_shard_file(run_id, states, worker, encoder, cap)[0]

    def write_shard_file(self, run_id: str, states: dict[int, Any], worker: str,
                         encoder: Callable = encode, cap: int | None = None) -> tuple[str, str]:
        """:meth:`write_shards`, returning ``(path, checksum)``: the (first) file and the sha256 of its states.

        What a block task that writes its own shard files (on a worker) sends back to the client.
        """
        if not states:
            raise ValueError("no shard states to write")
        try:
            body = {str(k): encoder(v) for k, v in sorted(states.items())}
        except CodecError as e:
            raise StoreError(self.display(self.run_dir(run_id)), f"cannot store the accumulator: {e}") from None
        limit = store_files.cap() if cap is None else int(cap)
        where = self.display(self.files.path(run_id, SHARDS_DIR))
        # Each state is encoded once; a file is its head, its states and its checksum, byte for
        # byte what jsondoc.dumps writes of the whole document (so what jsondoc.loads reads).
        head = jsondoc.dumps({"format": SHARDS_FORMAT, "run_id": run_id, "worker": worker,
                              "written": time.time()})[:-1] + b',"states":{'
        entries = [(key, self._entry(where, key, value)) for key, value in body.items()]
        written = []
        for group in self._split(where, entries, len(head) + len(_TAIL) + 67, limit):
            part = body if len(group) == len(entries) else {key: body[key] for key, _ in group}
            # Each entry is canonical JSON, so the canonical form of ``part`` (what
            # ``checksum`` signs and a reader recomputes) is the entries in key order.
            signature = hashlib.sha256(b"{" + b",".join(e for _, e in sorted(group)) + b"}").hexdigest()
            data = head + b",".join(e for _, e in group) + _TAIL + b'"' + signature.encode() + b'"}'
            keys = [int(key) for key, _ in group]
            path = self.files.path(run_id, SHARDS_DIR, shard_file_name(min(keys), max(keys) + 1))
            self._write_shard_doc(run_id, path, part, data, limit)
            written.append((path, signature))
        return written[0]

    @staticmethod
    def _entry(where: str, key: str, value: Any) -> bytes:
        """``"key":value`` as the shard file holds it; nested at most as deep as its readers read."""
        try:                                        # the file adds two levels: itself and "states"
            return jsondoc.dumps({key: value}, max_depth=jsondoc.MAX_DEPTH - 1, sort_keys=True)[1:-1]
        except jsondoc.Malformed as e:
            raise StoreError(where, f"not written: the state of shard {key} {e}") from None

    @staticmethod
    def _split(where: str, entries: list[tuple[str, bytes]], base: int, limit: int) -> list[list[tuple[str, bytes]]]:
        """``entries`` cut, in shard order, into groups whose shard file (``base`` bytes when empty) fits ``limit``."""
        groups: list[list[tuple[str, bytes]]] = []
        group: list[tuple[str, bytes]] = []
        size = base
        for key, entry in entries:
            if base + len(entry) > limit:
                raise StoreError(where, f"not written: shard {key}'s accumulator alone makes a "
                                 f"{base + len(entry):,}-byte shard file, more than the {limit:,} the store's "
                                 "readers accept; use fewer bins or a smaller reducer state")
            grown = size + len(entry) + (1 if group else 0)
            if group and grown > limit:
                groups.append(group)
                group, grown = [], base + len(entry)
            group.append((key, entry))
            size = grown
        groups.append(group)
        return groups

    def _write_shard_doc(self, run_id: str, path: str, states: dict[str, Any], data: bytes, limit: int) -> None:
        if len(data) > limit:    # a smaller cap than the store's (which its own write enforces)
            raise StoreError(self.display(path), f"would be {len(data):,} bytes, more than the {limit:,} its "
                             "readers accept; nothing was written")
        try:
            self.files.write_raw(path, data)
        except Exists:
            old = self.files.read_json(path)
            if not (isinstance(old, dict) and old.get("run_id") == run_id
                    and canonical_json(old.get("states")) == canonical_json(json_roundtrip(states))):
                raise StoreError(self.display(path), "already exists with different states for the same shards "
                                 "(another writer of this run disagrees); refusing to overwrite it") from None

    def shard_files(self, run_id: str) -> list[str]:
        """The shard files of a run, in name order.

        Names that do not claim to be shard files (``.DS_Store``, ``*.json~``, editor swap
        files, interrupted writes ``*.tmp-*``) are ignored, with a warning once per name; a name
        that looks like a shard file but is not ``<12 digits>-<12 digits>.json`` is refused.
        """
        base = self.files.path(run_id, SHARDS_DIR)
        out = []
        for name in self.files.listdir(base):
            p = posixpath.join(base, name)
            kind = classify_shard_name(name)
            if kind == "shard":
                out.append(p)
            elif kind == "partial":
                continue  # an interrupted write of ours: never accepted, never a complaint
            elif kind == "bad":
                raise StoreError(self.display(p), "is named like a shard file but not <12 digits>-<12 digits>.json; "
                                 f"it is not a shard file of this store (move it out of {SHARDS_DIR}/)")
            else:
                _warn_foreign(self.display(p))
        return out

    def shard_ranges(self, run_id: str) -> list[tuple[int, int]]:
        """The ``[first, stop)`` ranges the run's shard files are named for, sorted; no file is read."""
        return sorted(_range_of(p) for p in self.shard_files(run_id))

    def read_shards(self, run_id: str, decoder: Callable = decode,
                    only: Collection[int] | None = None) -> dict[int, tuple[Any, str, str]]:
        """``{shard: (state, worker, file)}`` for every stored shard.

        With ``only``, just the files whose name's range holds one of those shards are read
        (replaying one shard of a 4096-file store read all 4096); the result may then hold
        other shards of those files too.

        Each file's format, run id and checksum are verified, then its schema
        (:data:`.documents.SHARDS`), then each state is decoded (and an accumulator checked,
        :meth:`~dask_research.montecarlo.Moments.check`). A shard stored in two files (two
        writers with different task sizes) is accepted when both hold the same state;
        different states are refused naming both files.
        """
        out: dict[int, tuple[Any, str, str]] = {}
        raw: dict[int, str] = {}
        wanted = None if only is None else sorted(set(only))
        for path in self.shard_files(run_id):
            if wanted is not None:
                lo, hi = _range_of(path)
                i = bisect.bisect_left(wanted, lo)
                if i == len(wanted) or wanted[i] >= hi:
                    continue          # holds none of the shards asked for: never read
            doc = self.files.expect(path, self.files.read_json(path), SHARDS_FORMAT, run_id)
            body = doc.get("states")
            if not isinstance(body, dict) or doc.get("checksum") != checksum(body):
                raise StoreError(self.display(path), "checksum does not match its content (corrupt or edited)")
            self.files.check(path, doc, SHARDS, "shard file")
            a, b = _range_of(path)
            for key, value in body.items():
                if not is_shard_index(key) or not a <= int(key) < b:
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
                    out[s] = (decoder(value), str(doc.get("worker") or "?"), path)
                except (CodecError, ValueError, TypeError, KeyError, OverflowError, InputError) as e:
                    raise StoreError(self.display(path), f"shard {key} cannot be decoded: {e}") from None
                raw[s] = text
        return out

    def quarantine(self, run_id: str, path: str, reason: str) -> str:
        """Move a shard file aside (never deleted) and record why."""
        dest = self.files.path(run_id, QUARANTINE_DIR, posixpath.basename(path))
        self.files.rename(path, dest)
        self.files.write_json(dest + REASON_SUFFIX, {"reason": reason, "time": time.time()}, overwrite=True)
        return dest

    def refuse_links(self, run_id: str) -> None:
        """Refuse, before any computing, a symbolic link in a run's directory tree (local stores)."""
        self.files.refuse_links_under(self.run_dir(run_id))

    # -- one writer per run -----------------------------------------------------------------
    def lease(self, run_id: str, *, timeout: float | None = None, wait: float | None = None,
              announce: Callable[[str], None] | None = None) -> Lease:
        """A :class:`Lease` on ``run_id``: enter it to become the run's only writer."""
        return Lease(self.files, run_id, registry=self._leases, timeout=timeout, wait=wait, announce=announce)

    def lease_holder(self, run_id: str) -> dict | None:
        """What the run's lease file says (``None``: nobody holds the run); a FIFO or link there is refused."""
        return self.lease(run_id).holder()

    # -- result -----------------------------------------------------------------------------
    def write_result(self, run_id: str, summary: dict) -> None:
        """Write (or replace) the run's ``result.json``, a convenience copy of its summary."""
        doc = {"format": RESULT_FORMAT, "run_id": run_id, **summary}
        self.files.write_json(self.files.path(run_id, RESULT_FILE), finite_json(doc), overwrite=True)

    def read_result(self, run_id: str) -> dict | None:
        """The run's ``result.json`` checked against its schema (:data:`.documents.RESULT`), or ``None``."""
        path = self.files.path(run_id, RESULT_FILE)
        if not self.files.present(path):
            return None
        doc = self.files.expect(path, self.files.read_json(path), RESULT_FORMAT, run_id)
        return self.files.check(path, doc, RESULT, RESULT_FILE)
