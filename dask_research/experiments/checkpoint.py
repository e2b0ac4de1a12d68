"""Crash-safe checkpoints: an append-only JSON-lines journal of the whole scheduler state.

With ``IterationScheduler(..., checkpoint="runs/loop.jsonl")`` the scheduler appends, before it
goes on:

- every batch of hypotheses it queues (yours and the expander's), payloads included;
- every event of the trace (``select`` without the per-branch ``scores``; ``dispatch`` of each
  experiment; ``result`` with the reward, metrics and duration; ``failure``; ``prune``;
  ``paper.trigger``; ...), plus the state of a randomised policy's generator;
- what each paper writer returned.

Replaying these records in order rebuilds the exact state after the last decision: branch
statistics, queues, pruned branches, paper flags, the trace, the policy's own statistics, and
the experiments that were in flight (dispatched, no outcome). See :mod:`.resume`.

Atomicity and integrity: a local journal is only ever appended to, one ``write`` of a whole
line followed by a flush, so a crash can at worst leave a torn *last* line; every earlier record
is untouched. Every line ends with ``"crc": "xxxxxxxx"``, the CRC-32 of the line's JSON without
that key, so reading tells a whole record from a damaged one:

- a last line without its newline whose checksum matches is a whole record (the crash came
  between the record and its newline): it is read, and the next append first ends it with a
  newline (it used to be cut off, and its experiment ran again);
- a last line without its newline that is not such a record is a torn tail: ignored, and cut
  off before the next append;
- any other line that fails its checksum, or is not a record, is refused with
  :class:`~dask_research.exceptions.CheckpointError` naming the file and the line number. An
  edited reward never resumes into different statistics.

An fsspec URL that is not a local file (``memory://``, ``s3://``, ...) is rewritten whole at
each record, to a temporary object that then replaces the journal (write-then-rename).
``close()`` fsyncs a local journal.

Version-2 journals (before checksums) are read as legacy, with a
:class:`JournalLegacyWarning`: their records cannot be checked, so a damaged one is caught only
if it no longer fits the state before it; records appended to them carry checksums.

The format is JSON only, never pickle: payloads must be JSON values (dicts, lists, strings,
numbers, booleans, ``None``; tuples come back as lists). A file that is not UTF-8 JSON lines
(a pickle, say) is refused with :class:`~dask_research.exceptions.CheckpointError` and nothing
in it is executed.

File format: a header ``{"format": "dask-research.experiments.journal", "version": 3,
"settings": {...}, "crc": ...}``, then records ``{"kind": "hyps", "hyps": [...]}``, ``{"kind": "event",
"e": {...}}`` and ``{"kind": "output", "branch": ..., "output": ...}``.

Examples
--------
>>> import os, tempfile
>>> from dask_research.experiments import Hypothesis
>>> from dask_research.experiments.checkpoint import Journal, hypothesis_to_json
>>> path = os.path.join(tempfile.mkdtemp(), "loop.jsonl")
>>> j = Journal(path)
>>> j.open({"slots": 1})
>>> j.append({"kind": "hyps", "hyps": [hypothesis_to_json(Hypothesis("h1", "a", {"lr": 0.1}))]})
>>> j.close()
>>> state = Journal(path).load()
>>> state.settings, state.records[0]["hyps"][0]["payload"]
({'slots': 1}, {'lr': 0.1})
"""
from __future__ import annotations

import json
import math
import os
import re
import uuid
import warnings
import zlib
from dataclasses import dataclass, field
from typing import Any

from ..exceptions import CheckpointError, ExperimentError
from .types import Hypothesis

__all__ = ["Journal", "JournalState", "JournalLegacyWarning", "hypothesis_to_json", "hypothesis_from_json"]

FORMAT = "dask-research.experiments.journal"
VERSION = 3            # every line carries a CRC-32 of its own bytes
LEGACY_VERSION = 2     # no checksums: read as it stands, with a warning
RECORD_KINDS = ("hyps", "event", "output")

_CRC = re.compile(r', "crc": "([0-9a-f]{8})"\}$')


class JournalLegacyWarning(UserWarning):
    """A journal without per-record checksums (version 2) was read."""


def _encode(rec: dict[str, Any]) -> str:
    """One journal line: the record's JSON with ``"crc"`` (CRC-32 of that JSON) as its last key.

    >>> _encode({"kind": "output", "branch": "a", "output": 1})
    '{"kind": "output", "branch": "a", "output": 1, "crc": "6ce6d00c"}'
    """
    body = json.dumps(rec)
    if not body.startswith("{") or body == "{}" or "crc" in rec:
        raise ValueError(f"not a journal record: {body[:60]!r}")
    crc = zlib.crc32(body.encode("utf-8"))
    return f'{body[:-1]}, "crc": "{crc:08x}"}}'


def _lines(data: bytes) -> Any:
    """``(line, ends with a newline)`` for each line of ``data``, without copying it whole."""
    start, end = 0, len(data)
    while start < end:
        stop = data.find(b"\n", start)
        if stop < 0:
            yield data[start:], False
            return
        yield data[start:stop], True
        start = stop + 1


def _decode(line: str) -> tuple[dict[str, Any], bool]:
    """``(record, checked)`` of one line; ``ValueError`` (saying what is wrong) when the line
    is not a JSON object or its checksum does not match. ``checked`` is False for a line
    without a checksum (legacy journals)."""
    m = _CRC.search(line, max(0, len(line) - 21))     # the last 21 characters, if anywhere
    if m is not None:
        body = line[:m.start()] + "}"
        if zlib.crc32(body.encode("utf-8")) != int(m.group(1), 16):
            raise ValueError("fails its checksum (the record was altered or damaged)")
    try:
        rec = json.loads(line)
    except ValueError:
        raise ValueError("is not a JSON object") from None
    if not isinstance(rec, dict):
        raise ValueError("is not a JSON object")
    if m is None:
        if "crc" in rec:
            raise ValueError("has a malformed checksum")
        return rec, False
    rec.pop("crc", None)
    return rec, True


def _strict(value: Any, what: str) -> str:
    try:
        return json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ExperimentError(
            f"{what} is not a JSON value ({exc}); checkpoints store JSON only (never pickle), "
            "so payloads must be dicts, lists, strings, numbers, booleans or None",
            value=value) from None


def hypothesis_to_json(h: Hypothesis) -> dict[str, Any]:
    """A hypothesis as a JSON-ready dict; :class:`ExperimentError` if its payload is not JSON.

    >>> hypothesis_to_json(Hypothesis("h1", "a", features=(1.0, 2.0)))["features"]
    [1.0, 2.0]
    """
    _strict(h.payload, f"the payload of hypothesis {h.id!r}")
    d: dict[str, Any] = {"id": h.id, "branch": h.branch, "payload": h.payload}
    if h.features is not None:
        d["features"] = [float(x) for x in h.features]
    if h.parent is not None:
        d["parent"] = h.parent
    if h.generation:
        d["generation"] = h.generation
    return d


def hypothesis_from_json(d: Any) -> Hypothesis:
    """Inverse of :func:`hypothesis_to_json` (``ValueError`` for malformed dicts)."""
    if not isinstance(d, dict) or not isinstance(d.get("id"), str) or not isinstance(
            d.get("branch"), str):
        raise ValueError(f"not a hypothesis: {str(d)[:60]!r}")
    f = d.get("features")
    if f is not None and (not isinstance(f, list) or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in f)):
        raise ValueError(f"bad features of hypothesis {d['id']!r}: {f!r}")
    gen = d.get("generation", 0)
    if not isinstance(gen, int) or isinstance(gen, bool):
        raise ValueError(f"bad generation of hypothesis {d['id']!r}: {gen!r}")
    return Hypothesis(d["id"], d["branch"], d.get("payload"),
                      None if f is None else tuple(float(x) for x in f), d.get("parent"), gen)


@dataclass
class JournalState:
    """What a journal holds: the header's ``settings`` and the records after it, in order."""

    settings: dict[str, Any] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)


def _is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file://")


class Journal:
    """Append-only JSON-lines journal at a local path or an fsspec URL (its folder is created).
    """

    def __init__(self, path: str | os.PathLike[str]):
        text = os.fspath(path)
        self.url = text
        self.local = _is_local(text)
        self.path = text[len("file://"):] if text.startswith("file://") else text
        self._fh: Any = None
        self._lines: list[str] | None = None      # remote: the whole journal, rewritten
        self._fs: Any = None
        self._lock: Any = None                    # a JournalLock once acquire() was called
        self._seen: int | None = None             # bytes of the file as this driver knows it

    # -- one driver per journal -----------------------------------------------------------
    def acquire(self) -> None:
        """Lock a local journal for this driver (see :mod:`.lock`); a no-op for remote URLs.

        Raises :class:`CheckpointError` naming the driver that holds it.
        """
        if not self.local:
            return
        if self._lock is None:
            from .lock import JournalLock

            self._lock = JournalLock(os.path.abspath(self.path))
        self._lock.acquire()

    def release(self) -> None:
        """Give the lock up (a later write takes it again, if the file did not change)."""
        if self._lock is not None:
            self._lock.release()

    def _guard(self) -> None:
        """Before a write: the lock must still be ours; taken again after a release only if
        nobody wrote to the journal in between."""
        lock = self._lock
        if lock is None:
            return
        again = not lock.held and lock.lost is None
        lock.ensure()
        if again and self._seen is not None:
            size = os.path.getsize(self.path) if os.path.exists(self.path) else 0
            if size != self._seen:
                lock.release()
                raise CheckpointError(
                    self.url, f"changed since this scheduler read it ({self._seen} bytes then, "
                    f"{size} now): another driver wrote to it; continue from it with "
                    "IterationScheduler.resume(path, runner)")

    def __repr__(self) -> str:
        return f"Journal({self.url!r})"

    def _remote(self) -> Any:
        if self._fs is None:
            from fsspec.core import url_to_fs

            self._fs, self.path = url_to_fs(self.url)
        return self._fs

    # -- reading ------------------------------------------------------------------------
    def _read(self) -> bytes | None:
        if self.local:
            if not os.path.exists(self.path):
                return None
            with open(self.path, "rb") as f:
                return f.read()
        fs = self._remote()
        return fs.cat_file(self.path) if fs.exists(self.path) else None

    def load(self, lazy: bool = False) -> JournalState | None:
        """Read the journal; ``None`` if it does not exist or is empty.

        With ``lazy=True`` only the header is read now, and ``records`` is an iterator that
        parses (and checks) one line at a time as it is consumed, so a resume never holds
        every record at once; the errors below are raised while iterating.

        Raises :class:`CheckpointError` (naming the file and the line) for anything that is
        not a complete journal of this format: a record whose checksum does not match, a
        line that is not a record. The one exception is a torn last line (no newline, and
        not a whole record with a matching checksum), which is ignored.
        """
        data = self._read()
        self._seen = len(data or b"")
        if not data:
            return None
        if not lazy:
            return self._parse(data)[0]
        scan = self._scan(data, {"good": 0})
        settings = next(scan, None)
        return None if settings is None else JournalState(settings, scan)

    def _parse(self, data: bytes) -> tuple[JournalState | None, int]:
        """``(state, good)``: the records, and how many leading bytes of ``data`` hold whole
        records (what an append keeps: a torn tail after them is cut off)."""
        box = {"good": 0}
        scan = self._scan(data, box)
        settings = next(scan, None)
        if settings is None:
            return None, 0
        state = JournalState(settings)
        state.records.extend(scan)
        return state, box["good"]

    def _scan(self, data: bytes, box: dict[str, int]) -> Any:
        """Yield the header's settings, then each record; ``box["good"]`` counts the bytes of
        whole lines read so far. Yields nothing if the header itself is torn."""
        legacy = False
        for n, (raw, terminated) in enumerate(_lines(data), start=1):
            torn_ok = not terminated            # only an unterminated last line may be torn
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                if not (torn_ok and exc.reason == "unexpected end of data"):
                    raise CheckpointError(
                        self.url, "is not a UTF-8 JSON-lines journal (binary content, e.g. a "
                        "pickle); checkpoints are JSON only and are never unpickled") from None
                line = "\x00"                   # a character cut at the very end: torn
            try:
                rec, checked = _decode(line)
            except ValueError as exc:
                if torn_ok:
                    return                       # torn write at a crash: ignore (a torn
                                                 # header: nothing was ever journaled)
                raise CheckpointError(self.url, f"line {n} {exc}: {line[:60]!r}") from None
            if n == 1:
                if rec.get("format") != FORMAT:
                    raise CheckpointError(self.url, "not an experiments journal (the first "
                                                    f"line must carry format={FORMAT!r})")
                version = rec.get("version")
                if version not in (LEGACY_VERSION, VERSION):
                    raise CheckpointError(self.url, f"journal version {version!r} "
                                                    f"is not supported (expected {VERSION}, "
                                                    f"or {LEGACY_VERSION} read as legacy)")
                legacy = version == LEGACY_VERSION
                if legacy and not checked:
                    warnings.warn(
                        f"checkpoint {self.url}: a version-{LEGACY_VERSION} journal, written "
                        "without per-record checksums, so damage to its records cannot be "
                        "detected; it is read as it stands, and records appended from now on "
                        "carry checksums", JournalLegacyWarning, stacklevel=4)
                elif not checked:
                    raise CheckpointError(self.url, "line 1 (the header) has no checksum; "
                                                    f"every line of a version-{VERSION} "
                                                    "journal carries one")
                settings = rec.get("settings", {})
                box["good"] += len(raw) + terminated
                yield settings if isinstance(settings, dict) else {}
                continue
            else:
                if not checked and not legacy:
                    if torn_ok:
                        return
                    raise CheckpointError(self.url, f"line {n} has no checksum; every record "
                                                    f"of a version-{VERSION} journal carries "
                                                    f"one: {line[:60]!r}")
                if rec.get("kind") not in RECORD_KINDS:
                    raise CheckpointError(self.url, f"line {n} is not a journal record: "
                                                    f"{line[:60]!r}")
                box["good"] += len(raw) + terminated
                yield rec

    # -- writing ------------------------------------------------------------------------
    def open(self, settings: dict[str, Any] | None = None) -> None:
        """Open for appending; a new journal gets its header (with ``settings``)."""
        if self._fh is not None or self._lines is not None:
            return
        self._guard()
        header = {"format": FORMAT, "version": VERSION, "settings": settings or {}}
        if not self.local:
            data = self._read()
            self._lines = []
            state, good = self._parse(data) if data else (None, 0)
            if state is not None and data is not None:
                keep = data[:good].decode("utf-8")          # drop a torn tail
                self._lines = [ln + "\n" for ln in keep.split("\n") if ln]
            else:
                self._lines = [_encode(_clean(header)) + "\n"]
                self._flush_remote()
            return
        folder = os.path.dirname(self.path)
        if folder:
            os.makedirs(folder, exist_ok=True)
        fresh = self._repair_torn_tail()
        self._fh = open(self.path, "a", encoding="utf-8")
        self._seen = self._fh.tell()
        if fresh:
            self._write(header)

    def _repair_torn_tail(self) -> bool:
        """Cut a torn last line off, and end a whole last record that lacks only its newline
        with one (so the next append cannot cut it off). True if no record survives."""
        if not os.path.exists(self.path):
            return True
        with open(self.path, "rb+") as f:
            data = f.read()
            state, good = self._parse(data) if data else (None, 0)
            if state is None:
                f.truncate(0)
                return True
            if good < len(data):
                f.truncate(good)
            elif not data.endswith(b"\n"):
                f.write(b"\n")
            return False

    def _flush_remote(self) -> None:
        fs = self._remote()
        tmp = f"{self.path}.tmp-{uuid.uuid4().hex[:8]}"
        parent = os.path.dirname(self.path)
        if parent:
            fs.makedirs(parent, exist_ok=True)
        fs.pipe_file(tmp, "".join(self._lines or []).encode("utf-8"))
        fs.mv(tmp, self.path)

    def _write(self, rec: dict[str, Any]) -> None:
        line = _encode(_clean(rec)) + "\n"
        if self._lines is not None:
            self._lines.append(line)
            self._flush_remote()
            return
        if self._lock is not None:
            self._lock.ensure()           # still ours (a paused driver stops here)
        self._fh.write(line)              # one write of the whole line
        self._fh.flush()                  # in the OS before the loop goes on
        self._seen = self._fh.tell()

    def append(self, rec: dict[str, Any]) -> None:
        """Append one record (opening the journal if needed)."""
        if self._fh is None and self._lines is None:
            self.open()
        self._write(rec)

    def close(self) -> None:
        """Flush to disk (``fsync``), close, and release the lock."""
        try:
            if self._fh is not None:
                self._fh.flush()
                os.fsync(self._fh.fileno())
                self._seen = self._fh.tell()
                self._fh.close()
                self._fh = None
            self._lines = None
        finally:
            self.release()


def _clean(x: Any) -> Any:
    """Non-finite floats as strings (JSON has none); numpy scalars as Python numbers."""
    from .events import _jsonable

    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, (str, int, bool, float)) or x is None:
        return x
    return _jsonable(x)
