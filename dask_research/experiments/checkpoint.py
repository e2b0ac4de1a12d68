"""Crash-safe resume: an append-only journal of finished experiments.

With ``IterationScheduler(..., checkpoint="runs/loop.jsonl")`` every finished experiment (and
every finished paper) is appended to a JSON-lines file and flushed before the loop goes on, so a
crash of the process loses at most the experiments that were in flight. Running a scheduler
again with the same checkpoint and the same hypotheses *replays* the journal: whenever the
policy picks a hypothesis whose result is in the journal, the recorded result is counted at once
(a ``result`` or ``failure`` event with ``replayed=True``, no slot, no budget) instead of running
it again; papers already written are not written again. Hypotheses themselves are not stored:
payloads need not be serialisable, and the expander, being pure, regenerates its follow-ups from
the replayed results.

File format: a header line ``{"format": "dask-research.experiments.journal", "version": 1}``,
then one JSON object per line (``kind`` = ``"result"``, ``"failure"`` or ``"paper"``). A partial
last line (the process died while writing it) is ignored; anything else unreadable raises
:class:`~dask_research.exceptions.CheckpointError`.

Examples
--------
>>> import os, tempfile
>>> from dask_research.experiments import Hypothesis, Result
>>> from dask_research.experiments.checkpoint import Journal
>>> path = os.path.join(tempfile.mkdtemp(), "loop.jsonl")
>>> with Journal(path) as j:
...     j.record(Result(Hypothesis("h1", "a"), 0.5, {"loss": 1.0}, 0.01))
>>> Journal(path).load().results["h1"]["reward"]
0.5
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from ..exceptions import CheckpointError
from .events import _jsonable
from .types import Hypothesis, Result

__all__ = ["Journal", "JournalState"]

FORMAT = "dask-research.experiments.journal"
VERSION = 1


@dataclass
class JournalState:
    """What a journal holds: ``results`` and ``papers`` keyed by hypothesis id / branch."""

    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    papers: dict[str, Any] = field(default_factory=dict)

    def outcome(self, h: Hypothesis) -> Result | None:
        """The recorded outcome of ``h`` (``None`` if not recorded or recorded for another
        branch)."""
        rec = self.results.get(h.id)
        if rec is None or rec.get("branch") != h.branch:
            return None
        if rec["kind"] == "failure":
            return Result.failure(h, rec["error"], rec.get("duration"))
        return Result(h, float(rec["reward"]), dict(rec.get("metrics") or {}),
                      rec.get("duration"))


class Journal:
    """Append-only JSON-lines journal at ``path`` (a local file; its folder is created)."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = os.fspath(path)
        self._fh: Any = None

    def __repr__(self) -> str:
        return f"Journal({self.path!r})"

    # -- reading ------------------------------------------------------------------------
    def load(self) -> JournalState:
        """Read the journal (an absent or empty file is an empty journal)."""
        state = JournalState()
        if not os.path.exists(self.path):
            return state
        with open(self.path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        complete_last = lines[-1] == ""          # every complete record ends with "\n"
        if complete_last:
            lines.pop()
        if not lines:
            return state
        for n, line in enumerate(lines, start=1):
            last = n == len(lines)
            try:
                rec = json.loads(line)
                if not isinstance(rec, dict):
                    raise ValueError("not an object")
            except ValueError:
                if last and not complete_last:
                    break                        # torn write at a crash: ignore
                raise CheckpointError(self.path, f"line {n} is not a JSON object: "
                                                 f"{line[:60]!r}") from None
            if n == 1:
                if rec.get("format") != FORMAT:
                    raise CheckpointError(self.path, "not an experiments journal (the first "
                                                     f"line must carry format={FORMAT!r})")
                if rec.get("version") != VERSION:
                    raise CheckpointError(self.path, f"journal version {rec.get('version')!r} "
                                                     f"is not supported (expected {VERSION})")
                continue
            kind = rec.get("kind")
            if kind in ("result", "failure") and isinstance(rec.get("id"), str):
                state.results[rec["id"]] = rec
            elif kind == "paper" and isinstance(rec.get("branch"), str):
                state.papers[rec["branch"]] = rec.get("output")
            else:
                raise CheckpointError(self.path, f"line {n} is not a journal record: "
                                                 f"{line[:60]!r}")
        return state

    # -- writing ------------------------------------------------------------------------
    def open(self) -> Journal:
        """Open for appending (writing the header into a new file)."""
        if self._fh is None:
            folder = os.path.dirname(self.path)
            if folder:
                os.makedirs(folder, exist_ok=True)
            fresh = not os.path.exists(self.path) or os.path.getsize(self.path) == 0
            if not fresh:
                self._repair_torn_tail()
            self._fh = open(self.path, "a", encoding="utf-8")
            if fresh:
                self._write({"format": FORMAT, "version": VERSION})
        return self

    def _repair_torn_tail(self) -> None:
        with open(self.path, "rb+") as f:
            data = f.read()
            if data and not data.endswith(b"\n"):
                f.truncate(data.rfind(b"\n") + 1)

    def _write(self, rec: dict[str, Any]) -> None:
        self._fh.write(json.dumps(rec) + "\n")
        self._fh.flush()                  # in the OS before the loop goes on

    def record(self, result: Result) -> None:
        """Append a finished experiment."""
        self.open()
        h = result.hypothesis
        if result.ok:
            rec = {"kind": "result", "id": h.id, "branch": h.branch,
                   "reward": result.reward, "metrics": _jsonable(result.metrics),
                   "duration": result.duration}
        else:
            rec = {"kind": "failure", "id": h.id, "branch": h.branch, "error": result.error,
                   "duration": result.duration}
        self._write(rec)

    def record_paper(self, branch: str, output: Any) -> None:
        """Append a finished paper (its output as JSON, or its repr)."""
        self.open()
        self._write({"kind": "paper", "branch": branch, "output": _jsonable(output)})

    def close(self) -> None:
        """Flush to disk (``fsync``) and close."""
        if self._fh is not None:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()
            self._fh = None

    def __enter__(self) -> Journal:
        return self.open()

    def __exit__(self, *exc: Any) -> None:
        self.close()
