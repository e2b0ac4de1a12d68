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

Every file operation goes through :class:`dask_research.durable.Files` (the journal's folder):

- **Nothing but a journal is read or written.** The journal is opened without following a
  link and only as a regular file (a FIFO, a device, a directory, a link to ``/dev/zero`` or
  to a user's file are refused by name before a byte is read), and a file that is not an
  experiments journal is refused, never truncated or overwritten. (An empty file is a journal
  with nothing in it yet.)
- **Reads are bounded** by ``research.experiments.journal-max-bytes`` (default 1 GiB) for the
  file and ``journal-max-line-bytes`` (default 64 MiB) for one record, and **the writer
  enforces both**: a record that would pass either is refused with a
  :class:`~dask_research.exceptions.CheckpointError` before anything is written, and every
  line is parsed back by the reader's own strict parser (:mod:`dask_research.durable.jsondoc`)
  before it is written. The journal never holds a line its readers would refuse.
- **A new journal is created whole**: its header is written to a temporary file, synced, and
  linked into place (the folder synced too), so it is absent or has its header.
- **Appends are whole steps**: the records of one step of the loop (a decision and its
  dispatch; an outcome with its prune, paper trigger and expansion) are staged as they are
  made and committed together, in one ``write``, before the loop acts on them (before the
  experiment starts, before ``ask`` or ``tell`` returns). Every line of a step but its last
  carries ``"more": true``; a reader keeps a step only when its last line is there, so a crash
  in the middle of a step leaves the journal at the step before, never half a decision (a
  ``select`` without its ``dispatch`` resumed into a second pick of the same experiment, and a
  result without its expansion resumed without the follow-ups). ``close()`` commits and fsyncs.

Every line ends with ``"crc": "xxxxxxxx"``, the CRC-32 of the line's JSON without that key,
so reading tells a whole record from a damaged one:

- a last line without its newline whose checksum matches is a whole record (the crash came
  between the record and its newline): it is read, and the next append first ends it with a
  newline (it used to be cut off, and its experiment ran again);
- a last line without its newline that is not such a record is a torn tail: ignored, and cut
  off before the next append (a torn *first* line is the start of a header: nothing was
  journaled);
- any other line that fails its checksum, or is not a record, is refused with
  :class:`~dask_research.exceptions.CheckpointError` naming the file and the line number. An
  edited reward never resumes into different statistics, and a record whose checksum was
  recomputed still has to be one the live loop writes (:mod:`.resume`).

An fsspec URL that is not a local file (``memory://``, ``s3://``, ...) is rewritten whole at
each record, in one ``put`` (:meth:`~dask_research.durable.Files.write_bytes` with
``replace=True``).

Version-2 journals (before checksums) are read as legacy, with a
:class:`JournalLegacyWarning`: their records cannot be checked, so a damaged one is caught only
if it no longer fits the state before it; records appended to them carry checksums.

The format is JSON only, never pickle: payloads must be JSON values (dicts, lists, strings,
numbers, booleans, ``None``; tuples come back as lists). A file that is not UTF-8 JSON lines
(a pickle, say) is refused with :class:`~dask_research.exceptions.CheckpointError` and nothing
in it is executed.

File format: a header ``{"format": "dask-research.experiments.journal", "version": 3,
"settings": {...}, "crc": ...}``, then records ``{"kind": "hyps", "hyps": [...]}``, ``{"kind": "event",
"e": {...}}`` and ``{"kind": "output", "branch": ..., "output": ...}``, each but the last of its
step with ``"more": true`` (a journal written before steps has none: each record is a step).

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
>>> with open(os.path.join(os.path.dirname(path), "notes.txt"), "w") as f:
...     _ = f.write("my notes")
>>> Journal(os.path.join(os.path.dirname(path), "notes.txt")).open()
Traceback (most recent call last):
...
dask_research.exceptions.CheckpointError: checkpoint .../notes.txt: is not an experiments journal (its first line is neither a journal header nor the start of one); refusing to read or overwrite it
"""
from __future__ import annotations

import json
import math
import os
import re
import warnings
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from dask.utils import parse_bytes

from .. import config
from ..durable import AppendFile, jsondoc, oserror
from ..exceptions import CheckpointError, ConfigError, ExperimentError
from .lock import JournalLock, locate
from .types import Hypothesis

__all__ = ["Journal", "JournalState", "JournalLegacyWarning", "hypothesis_to_json", "hypothesis_from_json"]

FORMAT = "dask-research.experiments.journal"
VERSION = 3            # every line carries a CRC-32 of its own bytes
LEGACY_VERSION = 2     # no checksums: read as it stands, with a warning
RECORD_KINDS = ("hyps", "event", "output")
#: How every header this module ever wrote begins (versions 2 and 3): a torn first line is
#: the start of a header only if it agrees with this as far as it goes.
HEADER_START = b'{"format": "dask-research.experiments.journal", "version": '
#: Deepest payload nesting a journal keeps: a ``hyps`` record nests it three levels down.
PAYLOAD_DEPTH = jsondoc.MAX_DEPTH - 3

_CRC = re.compile(r', "crc": "([0-9a-f]{8})"\}$')


class JournalLegacyWarning(UserWarning):
    """A journal without per-record checksums (version 2) was read."""


def _size_setting(name: str) -> int:
    """``research.experiments.<name>``: a size in bytes (an integer, or a string such as "1GiB")."""
    value = config.resolve(f"experiments.{name}")
    try:
        size = parse_bytes(value) if isinstance(value, str) else value
    except ValueError:
        size = None
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise ConfigError(f"experiments.{name}", value, 'a size in bytes > 0 (an integer, or a string such '
                                                        'as "1GiB")')
    return size


def _encode(rec: dict[str, Any]) -> str:
    """One journal line: the record's JSON with ``"crc"`` (CRC-32 of that JSON) as its last key.

    >>> _encode({"kind": "output", "branch": "a", "output": 1})
    '{"kind": "output", "branch": "a", "output": 1, "crc": "6ce6d00c"}'
    """
    body = json.dumps(rec, allow_nan=False)
    if not body.startswith("{") or body == "{}" or "crc" in rec:
        raise ValueError(f"is not a journal record: {body[:60]!r}")
    crc = zlib.crc32(body.encode("utf-8"))
    return f'{body[:-1]}, "crc": "{crc:08x}"}}'


def _lines(data: bytes) -> Iterator[tuple[bytes, bool]]:
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
    is not a JSON object the project writes (:func:`~dask_research.durable.jsondoc.loads`: no
    ``NaN``, no deep nesting, no giant integers) or its checksum does not match. ``checked`` is
    False for a line without a checksum (legacy journals)."""
    m = _CRC.search(line, max(0, len(line) - 21))     # the last 21 characters, if anywhere
    if m is not None:
        body = line[:m.start()] + "}"
        if zlib.crc32(body.encode("utf-8")) != int(m.group(1), 16):
            raise ValueError("fails its checksum (the record was altered or damaged)")
    try:
        rec = jsondoc.loads(line)
    except jsondoc.Malformed as exc:
        raise ValueError(str(exc)) from None
    if not isinstance(rec, dict):
        raise ValueError("is not a JSON object")
    if m is None:
        if "crc" in rec:
            raise ValueError("has a malformed checksum")
        return rec, False
    rec.pop("crc", None)
    return rec, True


def _strict(value: Any, what: str) -> str:
    if jsondoc.depth(value, PAYLOAD_DEPTH) > PAYLOAD_DEPTH:
        raise ExperimentError(
            f"{what} is nested more than {PAYLOAD_DEPTH} levels deep; a checkpoint's readers refuse "
            "deeper JSON, so its writer does too", value=value)
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
    records: Any = field(default_factory=list)      # a list, or an iterator with ``lazy=True``


class Journal:
    """Append-only JSON-lines journal at a local path or an fsspec URL (its folder is created).

    Every read and write goes through the :class:`~dask_research.durable.Files` of its folder
    (see the module docstring); :meth:`acquire` takes its lease (:class:`~.lock.JournalLock`).
    """

    def __init__(self, path: str | os.PathLike[str]):
        self._source = os.fspath(path)
        self.files, self.path, self.url = locate(path)
        self.local = self.files.local
        self.max_bytes = _size_setting("journal-max-bytes")
        self.max_line = _size_setting("journal-max-line-bytes")
        self._fh: AppendFile | None = None
        self._lines: list[bytes] | None = None    # remote: the whole journal, rewritten
        self._size = 0                            # bytes of the open journal
        self._lock: JournalLock | None = None     # once acquire() was called
        self._seen: int | None = None             # bytes of the file as this driver knows it
        self._staged: list[tuple[dict[str, Any], bytes]] = []   # the step being made: (record, its line)

    # -- one driver per journal -----------------------------------------------------------
    def acquire(self) -> None:
        """Take the journal's lease for this driver (see :mod:`.lock`).

        Raises :class:`CheckpointError` naming the driver that holds it.
        """
        if self._lock is None:
            self._lock = JournalLock(self._source, located=(self.files, self.path, self.url))
        self._lock.acquire()

    def release(self) -> None:
        """Give the lease up (a later write takes it again, if the file did not change)."""
        if self._lock is not None:
            self._lock.release()

    def _guard(self) -> None:
        """Before a write: the lease must still be ours (else :class:`CheckpointError` naming
        who holds it now); taken again after a release only if nobody wrote to the journal in
        between."""
        lock = self._lock
        if lock is None:
            return
        lock.check_held(self.path)               # taken over while paused: stop here
        if lock.held:
            return
        lock.acquire()
        if self._seen is not None:
            size = self._current_size()
            if size != self._seen:
                lock.release()
                raise CheckpointError(
                    self.url, f"changed since this scheduler read it ({self._seen} bytes then, "
                    f"{size} now): another driver wrote to it; continue from it with "
                    "IterationScheduler.resume(path, runner)")

    def __repr__(self) -> str:
        return f"Journal({self.url!r})"

    # -- reading ------------------------------------------------------------------------
    def _current_size(self) -> int:
        """The journal's size now (0: missing), opened as the layer opens it (no link, no FIFO)."""
        try:
            if self.local:
                with self.files.open_read(self.path) as fd:
                    return os.fstat(fd).st_size
            return int(self.files.fs.size(self.path))
        except FileNotFoundError:
            return 0
        except OSError as exc:
            raise CheckpointError(self.url, f"cannot be read ({oserror(exc)})") from None

    def _read(self) -> bytes | None:
        size = self._current_size()
        if size > self.max_bytes:
            raise CheckpointError(self.url, f"is {size:,} bytes, more than the {self.max_bytes:,} a journal may "
                                            "have (research.experiments.journal-max-bytes); raise it to read it")
        try:
            return self.files.read_bytes(self.path, self.max_bytes)
        except FileNotFoundError:
            return None

    def load(self, lazy: bool = False) -> JournalState | None:
        """Read the journal; ``None`` if it does not exist or is empty.

        With ``lazy=True`` only the header is read now, and ``records`` is an iterator that
        parses (and checks) one line at a time as it is consumed, so a resume never holds
        every record at once; the errors below are raised while iterating.

        Raises :class:`CheckpointError` (naming the file and the line) for anything that is
        not a complete journal of this format: a file that is not a regular file, or larger
        than its cap; a record whose checksum does not match; a line that is not a record. The
        one exception is a torn last line (no newline, and not a whole record with a matching
        checksum), which is ignored.
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

    def _scan(self, data: bytes, box: dict[str, int]) -> Any:  # noqa: C901
        """Yield the header's settings, then each record; ``box["good"]`` counts the bytes of
        whole steps read so far. Yields nothing if the header itself is torn."""
        legacy = False
        step: list[dict[str, Any]] = []          # the records of the step being read
        step_bytes = 0
        for n, (raw, terminated) in enumerate(_lines(data), start=1):
            torn_ok = not terminated            # only an unterminated last line may be torn
            if len(raw) + terminated > self.max_line:
                raise CheckpointError(self.url, f"line {n} is {len(raw) + terminated:,} bytes, more than the "
                                                f"{self.max_line:,} a journal line may have "
                                                "(research.experiments.journal-max-line-bytes)")
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
                    if n == 1 and not (HEADER_START.startswith(raw) or raw.startswith(HEADER_START)):
                        raise CheckpointError(self.url, "is not an experiments journal (its first line is "
                                                        "neither a journal header nor the start of one); "
                                                        "refusing to read or overwrite it") from None
                    return                       # torn write at a crash: ignore (a torn
                                                 # header: nothing was ever journaled)
                raise CheckpointError(self.url, f"line {n} {exc}: {line[:60]!r}") from None
            if n == 1:
                if rec.get("format") != FORMAT:
                    raise CheckpointError(self.url, "not an experiments journal (the first "
                                                    f"line must carry format={FORMAT!r})")
                version = rec.get("version")
                if type(version) is not int or version not in (LEGACY_VERSION, VERSION):
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
                if not isinstance(settings, dict):
                    raise CheckpointError(self.url, f"line 1 (the header) holds settings {settings!r:.60}, "
                                                    "not an object of settings")
                box["good"] += len(raw) + terminated
                yield settings
                continue
            if not checked and not legacy:
                if torn_ok:
                    return
                raise CheckpointError(self.url, f"line {n} has no checksum; every record "
                                                f"of a version-{VERSION} journal carries "
                                                f"one: {line[:60]!r}")
            if rec.get("kind") not in RECORD_KINDS:
                raise CheckpointError(self.url, f"line {n} is not a journal record: "
                                                f"{line[:60]!r}")
            more = rec.pop("more", False)
            if more is not True and more is not False:
                raise CheckpointError(self.url, f"line {n} holds more={more!r}; a journal record "
                                                "carries more=true or nothing")
            step.append(rec)
            step_bytes += len(raw) + terminated
            if more:
                continue                         # the step goes on
            box["good"] += step_bytes
            yield from step
            step, step_bytes = [], 0
        # A step without its last line (the crash came in the middle of it) is ignored; the
        # next append cuts it off with any torn line.

    # -- writing ------------------------------------------------------------------------
    def _line(self, rec: dict[str, Any]) -> bytes:
        """``rec`` as one journal line, checked against what the journal's readers accept."""
        if jsondoc.depth(rec, jsondoc.MAX_DEPTH) > jsondoc.MAX_DEPTH:
            raise CheckpointError(self.url, f"not written: a {rec.get('kind')!r} record nested more than "
                                            f"{jsondoc.MAX_DEPTH} levels deep (its readers refuse it)")
        try:
            text = _encode(_clean(rec))
            jsondoc.loads(text)                   # the reader's own parser, before writing
        except ValueError as exc:                 # jsondoc.Malformed too
            raise CheckpointError(self.url, f"not written: a {rec.get('kind')!r} record that "
                                            f"{exc} (its readers refuse it)") from None
        line = (text + "\n").encode("utf-8")
        if len(line) > self.max_line:
            raise CheckpointError(self.url, f"not written: a {rec.get('kind')!r} record of {len(line):,} bytes, "
                                            f"more than the {self.max_line:,} a journal line may have "
                                            "(research.experiments.journal-max-line-bytes); add fewer "
                                            "hypotheses at a time, or keep large data out of payloads")
        return line

    def open(self, settings: dict[str, Any] | None = None) -> None:
        """Open for appending; a new journal gets its header (with ``settings``).

        A file there that is not an experiments journal is refused, untouched; a torn tail is
        cut off and a whole last record without its newline is ended with one.
        """
        if self._fh is not None or self._lines is not None:
            return
        self._guard()
        header = self._line({"format": FORMAT, "version": VERSION, "settings": settings or {}})
        data = self._read()
        if not self.local:
            state, good = self._parse(data) if data else (None, 0)
            lines = [ln + b"\n" for ln in (data or b"")[:good].split(b"\n") if ln] if state else [header]
            self._lines = lines
            self._size = sum(map(len, lines))
            if state is None or good != len(data or b""):
                self._flush_remote()
            self._seen = self._size
            return
        if data is None and self.files.write_bytes(self.path, header, cap=self.max_bytes):
            data = header                         # created whole (or absent): never torn
        elif data is None:
            data = self._read() or b""            # created meanwhile
        state, good = self._parse(data) if data else (None, 0)
        fh = self.files.open_append(self.path, self.max_bytes)
        try:
            if fh.size != len(data):
                raise CheckpointError(self.url, f"changed while this driver opened it ({len(data)} bytes read, "
                                                f"{fh.size} now): is another program writing to it?")
            if state is None:                     # empty, or a torn header: nothing was journaled
                fh.truncate(0)
                fh.write(header)
            elif good < len(data):
                fh.truncate(good)                 # a torn tail
            elif not data.endswith(b"\n"):
                fh.write(b"\n")                   # a whole last record that lost its newline
        except BaseException:
            fh.close()
            raise
        self._fh = fh
        self._size = self._seen = fh.size

    def _flush_remote(self) -> None:
        self.files.write_bytes(self.path, b"".join(self._lines or []), cap=self.max_bytes, replace=True)

    def _write(self, lines: list[bytes]) -> None:
        """Append ``lines`` (one step) in one write; on an object store, one ``put`` of the whole journal."""
        data = b"".join(lines)
        self._guard()                             # still ours (a paused driver stops here)
        if self._size + len(data) > self.max_bytes:
            raise CheckpointError(self.url, f"not written: the journal would grow to {self._size + len(data):,} "
                                            f"bytes, more than the {self.max_bytes:,} its readers accept "
                                            "(research.experiments.journal-max-bytes); raise it and resume "
                                            "to go on")
        if self._lines is not None:
            self._lines.extend(lines)
            try:
                self._flush_remote()
            except BaseException:
                del self._lines[len(self._lines) - len(lines):]
                raise
            self._size += len(data)
        else:
            assert self._fh is not None
            self._size = self._fh.write(data)     # one write of the whole step
        self._seen = self._size

    def stage(self, rec: dict[str, Any]) -> None:
        """Add ``rec`` to the step being made: checked now (a record its readers would refuse
        is refused here, where it is made), written by the next :meth:`commit`."""
        self._staged.append((rec, self._line(rec)))

    def commit(self) -> None:
        """Write the staged records as one step (opening the journal if needed); nothing staged: nothing.

        The step's last line is the one :meth:`stage` checked; the others are written again
        with ``"more": true``.
        """
        if not self._staged:
            return
        staged, self._staged = self._staged, []
        if self._fh is None and self._lines is None:
            self.open()
        self._write([self._line({**rec, "more": True}) for rec, _ in staged[:-1]] + [staged[-1][1]])

    def discard(self) -> bool:
        """Drop the step being made, unwritten: an error cut it short (a result staged without
        the decisions that go with it must never be written; its experiment runs again on
        resume). Whether anything was dropped."""
        dropped, self._staged = bool(self._staged), []
        return dropped

    def append(self, rec: dict[str, Any]) -> None:
        """Append one record as a step of its own, with whatever was staged before it."""
        self.stage(rec)
        self.commit()

    def close(self) -> None:
        """Commit what is staged, flush to disk (``fsync``), close, and release the lease."""
        try:
            self.commit()
            fh, self._fh = self._fh, None
            self._lines = None
            if fh is not None:
                try:
                    fh.sync()
                except OSError as exc:
                    raise CheckpointError(self.url, f"could not be synced to disk ({oserror(exc)}); its last "
                                                    "records may not survive a power cut") from None
                finally:
                    fh.close()
        finally:
            self.release()


def _clean(x: Any) -> Any:
    """Non-finite floats as strings (JSON has none); numpy scalars as Python numbers."""
    from .decision_trace import _jsonable

    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, (str, int, bool, float)) or x is None:
        return x
    return _jsonable(x)
