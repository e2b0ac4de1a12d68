"""The run store: a manifest, accepted shard accumulators as they arrive, and the result.

Where each file lives is in :mod:`.layout`; how they are read and written without trusting
the store is :mod:`.files`; one writer per run is :mod:`.lease`; what a store holds of a job,
asked once before a run, is :mod:`.holdings`. Every shard file carries a sha256 of its content;
a corrupt, foreign or truncated file is refused with a
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

import os
import posixpath
import re
import stat
import time
import warnings
from typing import TYPE_CHECKING, Any

from ...exceptions import StoreError
from ..address import canonical_json
from ..codec import CodecError, decode, encode
from .files import Exists, StoreFiles, oserror
from .holdings import Holdings, stored_state_problem
from .layout import (
    MANIFEST_FORMAT,
    RESULT_FORMAT,
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
from .lease import Lease
from .manifest import build_manifest, check_manifest

if TYPE_CHECKING:
    from ..job import Job
    from ..pilot import Pilot

__all__ = ["RunStore"]

_WARNED: set[str] = set()


def _warn_foreign(path: str) -> None:
    if path not in _WARNED:
        _WARNED.add(path)
        warnings.warn(f"{path}: not a shard file (foreign name); ignored", StoreWarning, stacklevel=3)


def _range_of(path: str) -> tuple[int, int]:
    """``(first, stop)`` of a path :meth:`RunStore.shard_files` listed (its name matched)."""
    rng = shard_file_range(posixpath.basename(path))
    assert rng is not None, path
    return rng


class RunStore:
    """A run store rooted at ``url`` (a local path or fsspec URL)."""

    def __init__(self, url: str, **storage_options: Any):
        self.files = StoreFiles(url, guard=self._guard, **storage_options)
        self.url, self.fs, self.root = self.files.url, self.files.fs, self.files.root
        #: Runs this store object holds the lease of (see :meth:`_guard`).
        self.leases: dict[str, Lease] = {}

    def __repr__(self) -> str:
        return f"RunStore({redact(self.url)!r})"

    @property
    def _local(self) -> bool:
        """Whether the store is on the local file system (read by :mod:`..blocks`)."""
        return self.files.local

    # -- paths ------------------------------------------------------------------------------
    def run_dir(self, run_id: str) -> str:
        """The directory of run ``run_id`` (a whole run id; anything else is refused)."""
        return self.files.run_dir(run_id)

    def _path(self, run_id: str, *parts: str) -> str:
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
        rel = posixpath.relpath(path, posixpath.join(self.root, "runs"))
        lease = self.leases.get(rel.split("/")[0]) if not rel.startswith("..") else None
        if lease is not None and path not in (lease.path, lease.lock_path):
            lease.check_held(path)

    # -- what the store holds of a job ------------------------------------------------------
    def holdings(self, job: Job, pilot: Pilot | None = None) -> Holdings:
        """Ask the store once what it holds of ``job``; with ``pilot``, a missing manifest is written.

        A run with a manifest is checked against the job (:func:`.manifest.check_manifest`).
        Shards without a manifest (a deleted manifest) are validated against the job and the
        pilot's range, which is a deterministic function of the job, and reused; the manifest is
        then written again. Without ``pilot`` (a reader) the manifest must exist. Every stored
        shard must be one of the job's, with the run's histogram and sample count. The caller of a
        writing ask holds the run's lease, so nobody else writes while this is read.
        """
        run_dir = self.run_dir(job.id)
        mpath = self.display(run_dir + "/manifest.json")
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

    # -- manifest ---------------------------------------------------------------------------
    def list_runs(self) -> list[str]:
        base = posixpath.join(self.root, "runs")
        if not self.fs.exists(base):
            return []
        return sorted(posixpath.basename(p.rstrip("/")) for p in self.fs.ls(base, detail=False)
                      if is_run_id(posixpath.basename(p.rstrip("/"))))

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
        return self.fs.exists(self.files.path(run_id, "manifest.json"))

    def write_manifest(self, run_id: str, manifest: dict) -> None:
        doc = {"format": MANIFEST_FORMAT, "run_id": run_id, **manifest}
        doc["checksum"] = checksum({k: v for k, v in doc.items() if k != "checksum"})
        self.files.write_json(self.files.path(run_id, "manifest.json"), doc)

    def read_manifest(self, run_id: str) -> dict:
        path = self.files.path(run_id, "manifest.json")
        doc = self.files.expect(path, self.files.read_json(path), MANIFEST_FORMAT, run_id)
        body = {k: v for k, v in doc.items() if k != "checksum"}
        if doc.get("checksum") != checksum(body):
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
        signed = checksum(body)
        doc = {"format": SHARDS_FORMAT, "run_id": run_id, "worker": worker, "written": time.time(),
               "states": body, "checksum": signed}
        path = self.files.path(run_id, "shards", shard_file_name(first, last + 1))
        try:
            self.files.write_json(path, doc)
        except Exists:
            old = self.files.read_json(path)
            if not (isinstance(old, dict) and old.get("run_id") == run_id
                    and canonical_json(old.get("states")) == canonical_json(json_roundtrip(body))):
                raise StoreError(self.display(path), "already exists with different states for the same shards "
                                 "(another writer of this run disagrees); refusing to overwrite it") from None
        return path, signed

    def shard_files(self, run_id: str) -> list[str]:
        """The shard files of a run, in name order.

        Names that do not claim to be shard files (``.DS_Store``, ``*.json~``, editor swap
        files, interrupted writes ``*.tmp-*``) are ignored, with a warning once per name; a name
        that looks like a shard file but is not ``<12 digits>-<12 digits>.json`` is refused.
        """
        base = self.files.path(run_id, "shards")
        if not self.fs.exists(base):
            return []
        out = []
        for p in sorted(self.fs.ls(base, detail=False)):
            kind = classify_shard_name(posixpath.basename(p.rstrip("/")))
            if kind == "shard":
                out.append(p)
            elif kind == "partial":
                continue  # an interrupted write of ours: never accepted, never a complaint
            elif kind == "bad":
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
            doc = self.files.expect(path, self.files.read_json(path), SHARDS_FORMAT, run_id)
            body = doc.get("states")
            if not isinstance(body, dict) or doc.get("checksum") != checksum(body):
                raise StoreError(self.display(path), "checksum does not match its content (corrupt or edited)")
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
                    out[s] = (decoder(value), str(doc.get("worker", "?")), path)
                except (CodecError, ValueError, TypeError, KeyError) as e:
                    raise StoreError(self.display(path), f"shard {key} cannot be decoded: {e}") from None
                raw[s] = text
        return out

    def quarantine(self, run_id: str, path: str, reason: str) -> str:
        """Move a shard file aside (never deleted) and record why."""
        dest = self.files.path(run_id, "quarantine", posixpath.basename(path))
        self._guard(dest)
        if self.files.local:
            sfd = qfd = None
            try:
                sfd = self.files.open_dir(posixpath.dirname(path), create=False)
                qfd = self.files.open_dir(posixpath.dirname(dest), create=True)
                if stat.S_ISLNK(os.stat(posixpath.basename(path), dir_fd=sfd, follow_symlinks=False).st_mode):
                    raise self.files.link_error(path)
                os.rename(posixpath.basename(path), posixpath.basename(dest), src_dir_fd=sfd, dst_dir_fd=qfd)
            except StoreError:
                raise
            except OSError as e:
                raise StoreError(self.display(path), f"could not be moved to quarantine/ ({oserror(e)})") from None
            finally:
                for fd in (sfd, qfd):
                    if fd is not None:
                        os.close(fd)
        else:
            self.fs.makedirs(posixpath.dirname(dest), exist_ok=True)
            self.fs.mv(path, dest)
        self.files.write_json(dest + ".reason.json", {"reason": reason, "time": time.time()}, overwrite=True)
        return dest

    def refuse_links(self, run_id: str) -> None:
        """Refuse, before any computing, a symbolic link in a run's directory tree (local stores)."""
        self.files.refuse_links_under(self.run_dir(run_id))

    # -- one writer per run -----------------------------------------------------------------
    def lease(self, run_id: str, *, timeout: float | None = None, wait: float | None = None,
              announce=None) -> Lease:
        """A :class:`Lease` on ``run_id``: enter it to become the run's only writer."""
        return Lease(self.files, run_id, registry=self.leases, timeout=timeout, wait=wait, announce=announce)

    # -- result -----------------------------------------------------------------------------
    def write_result(self, run_id: str, summary: dict) -> None:
        doc = {"format": RESULT_FORMAT, "run_id": run_id, **summary}
        self.files.write_json(self.files.path(run_id, "result.json"), finite_json(doc), overwrite=True)

    def read_result(self, run_id: str) -> dict | None:
        path = self.files.path(run_id, "result.json")
        if not self.fs.exists(path):
            return None
        return self.files.expect(path, self.files.read_json(path), RESULT_FORMAT, run_id)
