"""The durability layer: how every file the project writes is written, read, locked and trusted.

Monte-Carlo run stores, experiment journals and replay checkpoints all go through these four
modules, so a filesystem bug or a new link attack is fixed once:

- :mod:`.files` — :class:`Files`: every open refuses links and special files before a byte is
  read; every read is bounded by a cap its writer also enforces; writes are atomic (temporary
  file, ``fsync``, link or rename, ``fsync`` of the directory); appends and brief ``flock``\\ s;
  every failure is the capability's own error naming the file.
- :mod:`.lease` — :class:`Lease`: one writer at a time, with owner, host, pid and heartbeat,
  judged stale only by the waiting process's own monotonic clock.
- :mod:`.jsondoc` — strict, bounded JSON (no ``NaN``, no deep nesting, no giant integers).
- :mod:`.schema` — checking a decoded document's types, ranges and finiteness before it is used.

Examples
--------
>>> import tempfile
>>> from dask_research.durable import Files, Lease, schema
>>> from dask_research.exceptions import CheckpointError
>>> files = Files(tempfile.mkdtemp(), error=CheckpointError)
>>> with Lease(files, files.join("LEASE"), label="checkpoint", timeout=30, wait=0):
...     files.write_json(files.join("meta.json"), {"count": 3}, cap=4096)
True
>>> doc = files.read_json(files.join("meta.json"), cap=4096)
>>> schema.check(doc, schema.Obj({"count": schema.Int(0)}))
{'count': 3}
"""
from . import jsondoc, schema
from .files import (
    TMP_MARK,
    AppendFile,
    ErrorFactory,
    Files,
    kind_of,
    missing_dirs,
    oserror,
    printable,
    redact,
    remove_empty_dirs,
)
from .lease import LEASE_CAP, Lease, describe_holder, pid_alive

__all__ = ["Files", "AppendFile", "ErrorFactory", "Lease", "LEASE_CAP", "TMP_MARK", "describe_holder",
           "pid_alive", "oserror", "kind_of", "printable", "redact", "jsondoc", "schema", "missing_dirs",
           "remove_empty_dirs"]
