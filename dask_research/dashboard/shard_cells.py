"""The Shards page's grid, kept per cell: its cost follows the cells and the new events, never the shards.

A run of ``n`` shards is drawn as at most :data:`MAX_CELLS` cells of ``group = ceil(n / MAX_CELLS)``
consecutive shards. :class:`ShardCells` keeps, per cell, how many of its shards were accepted
and whether any was verified, quarantined or sent to re-run; an event costs the cells it
touches, so a 10^8-shard run costs what a 4,096-shard run does (the page read a per-shard array
of the whole run on every update before: 1.5 s of the scheduler's event loop at 10^7 shards).
A cell shows the most notable state among its shards (quarantined > re-run > verified > running
> accepted > queued); with ``group == 1`` that is each shard's own state.

Events come from other processes (any client of the scheduler): :func:`check_start` and
:meth:`ShardCells.apply` validate the fields they read, and the page skips a bad event with one
warning instead of failing for everyone.

Examples
--------
>>> cells = ShardCells(n=10**8)
>>> cells.group, cells.cells
(24415, 4096)
>>> cells.apply({"event": "accepted", "start": 0, "stop": 50_000_000})
>>> cells.shard_counts()["accepted"]
50000000
>>> check_start({"event": "start", "run": "r", "shards": "abc"})
"shards 'abc' is not a whole number of shards from 1 to 2**64 - 1"
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["ShardCells", "check_start", "MAX_CELLS", "STATE_NAMES"]

#: Shard states, in the order of their codes.
STATE_NAMES = ["queued", "running", "accepted", "verified", "quarantined", "re-run"]
#: The most cells the page draws (one cell per shard below that).
MAX_CELLS = 4096
_MAX_SHARDS = (1 << 64) - 1


def _whole(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_start(msg: Mapping) -> str | None:
    """Why a ``start`` event cannot be drawn (``None`` if it can)."""
    shards: Any = msg.get("shards")
    if not (_whole(shards) and 1 <= shards <= _MAX_SHARDS):
        return f"shards {shards!r} is not a whole number of shards from 1 to 2**64 - 1"
    if not isinstance(msg.get("run"), str):
        return f"run {msg.get('run')!r} is not a run id"
    return None


class ShardCells:
    """Per-cell aggregates of one run's shard events (see the module docstring)."""

    def __init__(self, n: int):
        self.n = int(n)
        self.group = max(1, math.ceil(self.n / MAX_CELLS))
        self.cells = math.ceil(self.n / self.group)
        self.size = np.full(self.cells, self.group, dtype=np.int64)
        self.size[-1] = self.n - self.group * (self.cells - 1)
        self.accepted = np.zeros(self.cells, dtype=np.int64)
        self.verified = np.zeros(self.cells, dtype=bool)
        self.quarantined = np.zeros(self.cells, dtype=bool)
        self.rerun = np.zeros(self.cells, dtype=bool)
        self.n_verified: set[int] = set()
        self.n_quarantined: set[int] = set()

    def _range(self, msg: Mapping) -> tuple[int, int]:
        a: Any = msg.get("start")
        b: Any = msg.get("stop")
        if not (_whole(a) and _whole(b) and 0 <= a < b <= self.n):
            raise ValueError(f"shards [{a!r}, {b!r}) are not a range within the run's {self.n:,} shards")
        return int(a), int(b)

    def _shard(self, s: Any) -> int:
        if not (_whole(s) and 0 <= s < self.n):
            raise ValueError(f"shard {s!r} is not one of the run's {self.n:,} shards")
        return int(s)

    def _add(self, a: int, b: int) -> None:
        """Add the shards ``[a, b)`` to the accepted counts of the cells they lie in."""
        g = self.group
        c0, c1 = a // g, (b - 1) // g
        if c0 == c1:
            self.accepted[c0] += b - a
            return
        self.accepted[c0] += (c0 + 1) * g - a
        self.accepted[c0 + 1:c1] += self.size[c0 + 1:c1]
        self.accepted[c1] += b - c1 * g
        np.minimum(self.accepted, self.size, out=self.accepted)

    def apply(self, msg: Mapping) -> None:
        """Fold one event of the run in (``ValueError`` naming the field if it is malformed)."""
        kind = msg.get("event")
        if kind == "accepted":
            a, b = self._range(msg)
            self._add(a, b)
        elif kind in ("speculate", "rescue", "retry"):
            a, b = self._range(msg)
            self.rerun[a // self.group:(b - 1) // self.group + 1] = True
        elif kind == "check":
            s = self._shard(msg.get("shard"))
            if msg.get("match"):
                self.verified[s // self.group] = True
                self.n_verified.add(s)
            else:
                self.quarantined[s // self.group] = True
                self.n_quarantined.add(s)
        elif kind == "quarantine":
            shards = msg.get("shards", [])
            if not isinstance(shards, Sequence) or isinstance(shards, (str, bytes)):
                raise ValueError(f"shards {shards!r} is not a list of shards")
            for s in [self._shard(s) for s in shards]:
                self.quarantined[s // self.group] = True
                self.n_quarantined.add(s)

    def states(self, running: Sequence[tuple[int, int]] = ()) -> np.ndarray:
        """The state code shown per cell (see :data:`STATE_NAMES`)."""
        busy = np.zeros(self.cells, dtype=bool)
        for a, b in running:
            if 0 <= a < b <= self.n:
                busy[a // self.group:(b - 1) // self.group + 1] = True
        out = np.zeros(self.cells, dtype=np.int8)
        out[self.accepted > 0] = 2
        out[busy] = 1
        out[self.verified] = 3
        out[self.rerun & (self.accepted < self.size)] = 5
        out[self.quarantined] = 4
        return out

    def labels(self) -> list[str]:
        """The shards each cell holds, as the hover text shows them."""
        g, n = self.group, self.n
        if g == 1:
            return [str(i) for i in range(self.cells)]
        return [f"{i * g}-{min(n, (i + 1) * g) - 1}" for i in range(self.cells)]

    def shard_counts(self, running: Sequence[tuple[int, int]] = ()) -> dict[str, int]:
        """How many shards are in each state (re-run shards are counted as queued)."""
        accepted = int(self.accepted.sum())
        run = sum(b - a for a, b in running if 0 <= a < b <= self.n)
        quarantined = len(self.n_quarantined)
        verified = len(self.n_verified - self.n_quarantined)
        return {"queued": max(0, self.n - accepted - run), "running": run,
                "accepted": max(0, accepted - verified - quarantined), "verified": verified,
                "quarantined": quarantined}
