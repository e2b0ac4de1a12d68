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

import hashlib
import json
import posixpath
import re
import time
import uuid
from typing import Any

import fsspec

from ..exceptions import StoreError
from .address import canonical_json
from .codec import CodecError, decode, encode

__all__ = ["RunStore", "MANIFEST_FORMAT", "SHARDS_FORMAT", "RESULT_FORMAT"]

MANIFEST_FORMAT = "dask-research-run/1"
SHARDS_FORMAT = "dask-research-shards/1"
RESULT_FORMAT = "dask-research-result/1"
_SHARD_FILE = re.compile(r"^(\d{12})-(\d{12})\.json$")
_RUN_ID = re.compile(r"^[0-9a-f]{64}$")
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


def redact(url: str) -> str:
    """``url`` without credentials (``s3://key:secret@bucket`` -> ``s3://***@bucket``)."""
    return re.sub(r"//[^/@]*@", "//***@", str(url))


class RunStore:
    """A run store rooted at ``url`` (a local path or fsspec URL)."""

    def __init__(self, url: str, **storage_options: Any):
        self.url = str(url)
        self.fs, self.root = fsspec.core.url_to_fs(self.url, **storage_options)
        self._local = "file" in (self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,))

    def __repr__(self) -> str:
        return f"RunStore({redact(self.url)!r})"

    # -- paths ------------------------------------------------------------------------------
    def run_dir(self, run_id: str) -> str:
        if not _RUN_ID.match(str(run_id)):
            raise StoreError(str(run_id), "is not a run id (64 lowercase hex characters)")
        return posixpath.join(self.root, "runs", run_id)

    def _path(self, run_id: str, *parts: str) -> str:
        return posixpath.join(self.run_dir(run_id), *parts)

    def display(self, path: str) -> str:
        return redact(path)

    # -- low level --------------------------------------------------------------------------
    def _write_json(self, path: str, obj: Any, overwrite: bool = False) -> None:
        data = json.dumps(obj, indent=None, separators=(",", ":"), allow_nan=False).encode()
        if not overwrite and self.fs.exists(path):
            raise StoreError(self.display(path), "already exists; refusing to overwrite it")
        self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
        if self._local:
            tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
            self.fs.pipe_file(tmp, data)
            self.fs.mv(tmp, path)
        else:
            self.fs.pipe_file(path, data)

    def _read_json(self, path: str) -> Any:
        try:
            size = self.fs.size(path)
        except FileNotFoundError:
            raise StoreError(self.display(path), "does not exist") from None
        if size is not None and size > MAX_FILE_BYTES:
            raise StoreError(self.display(path), f"is {size:,} bytes, more than the {MAX_FILE_BYTES:,} a store file may have")
        raw = self.fs.cat_file(path)
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
                      if _RUN_ID.match(posixpath.basename(p.rstrip("/"))))

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
        """Persist accepted shard states (one file for a contiguous set of shard indices)."""
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
        self._write_json(path, doc)
        return path

    def shard_files(self, run_id: str) -> list[str]:
        base = self._path(run_id, "shards")
        if not self.fs.exists(base):
            return []
        out = []
        for p in sorted(self.fs.ls(base, detail=False)):
            name = posixpath.basename(p)
            if ".tmp-" in name:
                continue  # an interrupted write: never accepted
            if not _SHARD_FILE.match(name):
                raise StoreError(self.display(p), "is not a shard file of this store (unexpected name)")
            out.append(p)
        return out

    def read_shards(self, run_id: str, decoder=decode) -> dict[int, tuple[Any, str, str]]:
        """``{shard: (state, worker, file)}`` for every stored shard."""
        out: dict[int, tuple[Any, str, str]] = {}
        for path in self.shard_files(run_id):
            doc = self._expect(path, self._read_json(path), SHARDS_FORMAT, run_id)
            body = doc.get("states")
            if not isinstance(body, dict) or doc.get("checksum") != _checksum(body):
                raise StoreError(self.display(path), "checksum does not match its content (corrupt or edited)")
            a, b = (int(x) for x in _SHARD_FILE.match(posixpath.basename(path)).groups())
            for key, value in body.items():
                if not key.isdigit() or not a <= int(key) < b:
                    raise StoreError(self.display(path), f"holds shard {key!r} outside its range [{a}, {b})")
                if int(key) in out:
                    raise StoreError(self.display(path), f"repeats shard {key}, already in {self.display(out[int(key)][2])}")
                try:
                    out[int(key)] = (decoder(value), str(doc.get("worker", "?")), path)
                except (CodecError, ValueError, TypeError, KeyError) as e:
                    raise StoreError(self.display(path), f"shard {key} cannot be decoded: {e}") from None
        return out

    def quarantine(self, run_id: str, path: str, reason: str) -> str:
        """Move a shard file aside (never deleted) and record why."""
        dest = self._path(run_id, "quarantine", posixpath.basename(path))
        self.fs.makedirs(posixpath.dirname(dest), exist_ok=True)
        self.fs.mv(path, dest)
        self._write_json(dest + ".reason.json", {"reason": reason, "time": time.time()}, overwrite=True)
        return dest

    # -- result -----------------------------------------------------------------------------
    def write_result(self, run_id: str, summary: dict) -> None:
        doc = {"format": RESULT_FORMAT, "run_id": run_id, **summary}
        self._write_json(self._path(run_id, "result.json"), _finite_json(doc), overwrite=True)

    def read_result(self, run_id: str) -> dict | None:
        path = self._path(run_id, "result.json")
        if not self.fs.exists(path):
            return None
        return self._expect(path, self._read_json(path), RESULT_FORMAT, run_id)
