"""What a run store's files are called, and how their documents are named and signed.

Layout under any fsspec URL (a local path, ``s3://bucket/prefix``, ``memory://x``)::

    <store>/runs/<run id>/manifest.json       everything in the content address, versions, pilot
    <store>/runs/<run id>/shards/<a>-<b>.json accumulators of shards a..b-1 (those computed)
    <store>/runs/<run id>/quarantine/...       shard files moved aside after a failed check
    <store>/runs/<run id>/result.json          the accepted result's summary and verification
    <store>/runs/<run id>/lease.json           the one writer's lease (see :mod:`.run_lease`)

Every other module takes these names from here (:data:`RUNS_DIR`, :data:`MANIFEST_FILE`,
:data:`SHARDS_DIR`, :data:`QUARANTINE_DIR`, :data:`RESULT_FILE`, :data:`LEASE_FILE`, :data:`LEASE_LOCK_FILE`,
:data:`REASON_SUFFIX`).

Examples
--------
>>> "/".join((RUNS_DIR, "<run id>", SHARDS_DIR, shard_file_name(0, 8)))
'runs/<run id>/shards/000000000000-000000000008.json'
>>> shard_file_name(0, 8)
'000000000000-000000000008.json'
>>> shard_file_range("000000000000-000000000008.json")
(0, 8)
>>> redact("s3://key:secret@bucket/runs")
's3://***@bucket/runs'
>>> checksum({"b": 1, "a": 2}) == checksum({"a": 2, "b": 1})
True
"""
from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from ...exceptions import redact
from ..address import canonical_json

__all__ = ["RUNS_DIR", "MANIFEST_FILE", "SHARDS_DIR", "QUARANTINE_DIR", "RESULT_FILE", "LEASE_FILE",
           "LEASE_LOCK_FILE", "REASON_SUFFIX", "MANIFEST_FORMAT", "SHARDS_FORMAT", "RESULT_FORMAT", "LEASE_FORMAT", "StoreWarning", "redact",
           "checksum", "finite_json", "json_roundtrip", "is_run_id", "shard_file_name", "shard_file_range",
           "classify_shard_name", "is_shard_index"]

#: The store's directory of runs, and in each run's directory its files and directories.
RUNS_DIR = "runs"
MANIFEST_FILE = "manifest.json"
SHARDS_DIR = "shards"
QUARANTINE_DIR = "quarantine"
RESULT_FILE = "result.json"
LEASE_FILE = "lease.json"
#: The lock file the lease's take-over and heartbeat ``flock`` (beside :data:`LEASE_FILE`).
LEASE_LOCK_FILE = "lease.lock"
#: Beside a quarantined shard file: why it was moved aside (``<file>.reason.json``).
REASON_SUFFIX = ".reason.json"

MANIFEST_FORMAT = "dask-research-run/1"
SHARDS_FORMAT = "dask-research-shards/1"
RESULT_FORMAT = "dask-research-result/1"
LEASE_FORMAT = "dask-research-lease/1"
# ASCII digits only ([0-9], not \d), matched with fullmatch (``$`` would accept a trailing newline).
_SHARD_FILE = re.compile(r"([0-9]{12})-([0-9]{12})\.json")
_LOOKS_LIKE_SHARD = re.compile(r"[0-9]+-[0-9]+\.json")
_RUN_ID = re.compile(r"[0-9a-f]{64}")
_INDEX = re.compile(r"[0-9]+")


class StoreWarning(UserWarning):
    """Something in a store that is not ours and was left alone (a foreign file in shards/)."""


def checksum(obj: Any) -> str:
    """The sha256 of ``obj``'s canonical JSON: what a store document is signed with."""
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()


def finite_json(obj: Any) -> Any:
    """JSON-able copy with non-finite floats as None (JSON has no NaN).

    >>> finite_json({"a": float("nan"), "b": [1.5, float("inf")]})
    {'a': None, 'b': [1.5, None]}
    """
    if isinstance(obj, dict):
        return {str(k): finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(v) for v in obj]
    if isinstance(obj, float) or hasattr(obj, "dtype"):
        try:
            f = float(obj)
        except (TypeError, ValueError):
            return str(obj)
        return f if f == f and abs(f) != float("inf") else None
    return obj


def json_roundtrip(obj: Any) -> Any:
    """``obj`` as it reads back from the JSON a store writes (tuples become lists, ...).

    >>> json_roundtrip({"a": (1, 2)})
    {'a': [1, 2]}
    """
    return json.loads(json.dumps(obj, allow_nan=False))


def is_run_id(text: Any) -> bool:
    """Whether ``text`` is a whole run id (64 lowercase hex characters).

    >>> is_run_id("ab" * 32), is_run_id("AB" * 32), is_run_id("ab" * 32 + "\\n")
    (True, False, False)
    """
    return isinstance(text, str) and _RUN_ID.fullmatch(text) is not None


def shard_file_name(first: int, stop: int) -> str:
    """The name of the file holding shards ``first .. stop-1``."""
    return f"{first:012d}-{stop:012d}.json"


def shard_file_range(name: str) -> tuple[int, int] | None:
    """``(first, stop)`` of a shard file's name, or ``None`` if it is not one."""
    m = _SHARD_FILE.fullmatch(name)
    return None if m is None else (int(m.group(1)), int(m.group(2)))


def classify_shard_name(name: str) -> str:
    """What a name in ``shards/`` is: ``"shard"``, ``"partial"`` (ours, interrupted), ``"bad"`` or ``"foreign"``.

    ``"bad"`` looks like a shard file but is not ``<12 digits>-<12 digits>.json``.

    >>> [classify_shard_name(n) for n in ("000000000000-000000000001.json", "x.json.tmp-1a2b",
    ...                                    "0-1.json", ".DS_Store")]
    ['shard', 'partial', 'bad', 'foreign']
    """
    if _SHARD_FILE.fullmatch(name):
        return "shard"
    if ".tmp-" in name:
        return "partial"
    if _LOOKS_LIKE_SHARD.fullmatch(name):
        return "bad"
    return "foreign"


def is_shard_index(key: str) -> bool:
    """Whether ``key`` (a key of a shard file's ``states``) is written in ASCII digits."""
    return _INDEX.fullmatch(key) is not None
