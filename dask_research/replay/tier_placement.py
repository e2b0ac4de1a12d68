"""Placement: which transitions live in which tier, and why.

The policy is capacity-constrained and bandwidth-aware. Tiers are ordered by read bandwidth
(declared, or measured once when built); each transition has a *heat*, the sampler's estimate
of how likely it is to be read next:

- ``recency`` (uniform and most-recent samplers): newer is hotter. Under uniform sampling every
  stored transition is equally likely per batch, but a newer one stays longer and so will be
  read more often before it is overwritten; under most-recent sampling only the newest are read.
- ``priority`` (prioritized sampler): the sampling mass ``p^alpha`` itself.

The target placement fills the fastest tier with the hottest transitions up to its capacity,
the next tier with the next hottest, and so on (ties keep their current tier, so equal heats
never cause moves). :meth:`Placement.rebalance` moves only the misplaced transitions; the plane
runs it in a background thread when ingest or priority updates made placement stale, or on
demand (``plane.rebalance()``). New transitions overwrite the slot they replace in place (or
take a free row in the fastest tier), so ingest never waits for a migration.

Examples
--------
>>> import numpy as np
>>> desired_tiers(np.array([5.0, 1.0, 3.0, 4.0]), np.array([1, 0, 0, 1]), [2, 2]).tolist()
[0, 1, 1, 0]
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from dask.utils import format_bytes

from .samplers.base import Sampler
from .storages.base import Storage
from .storages.tiered import TieredStorage


def desired_tiers(heat: np.ndarray, current: np.ndarray, rows: list[int]) -> np.ndarray:
    """Target tier of each item: hottest first into tier 0 up to ``rows[0]``, and so on.

    Ties at a tier boundary are broken in favour of items already in that tier (then items in
    faster tiers), so that equal heats never move data. O(n) per boundary (``np.partition``).
    """
    n = len(heat)
    out = np.full(n, len(rows) - 1, dtype=np.int8)
    remaining = np.arange(n)
    for k, cap in enumerate(rows[:-1]):
        m = len(remaining)
        if m == 0:
            break
        if m <= cap:
            out[remaining] = k
            remaining = remaining[:0]
            break
        h = heat[remaining]
        v = np.partition(h, m - cap)[m - cap]            # the cap-th largest heat
        above = h > v
        tie = np.flatnonzero(h == v)
        need = cap - int(above.sum())
        cur = current[remaining[tie]]
        # prefer ties already in tier k, then faster tiers, then slower ones
        pref = np.where(cur == k, 0, np.where(cur < k, 1, 2))
        chosen = tie[np.argsort(pref, kind="stable")[:need]]
        sel = above
        sel[chosen] = True
        out[remaining[sel]] = k
        remaining = remaining[~sel]
    return out


@dataclass
class TierPlacement:
    """One tier in a :class:`PlacementReport`."""

    name: str
    kind: str
    bandwidth: float
    bandwidth_declared: bool
    capacity_bytes: int
    rows: int
    used: int
    heat_min: float
    heat_max: float
    sample_share: float      # expected fraction of sampled transitions read from this tier


@dataclass
class PlacementReport:
    """What lives where and why: returned by ``plane.placement()``; ``print`` it."""

    policy: str
    reason: str
    tiers: list[TierPlacement] = field(default_factory=list)
    misplaced: int = 0
    moved_total: int = 0

    def __str__(self) -> str:
        lines = [f"placement policy: {self.policy} - {self.reason}",
                 f"{'tier':<10} {'kind':<7} {'read bw':>12} {'holds (transitions, bytes)':>44} "
                 f"{'heat range':>23} {'share of reads':>15}"]
        starred = False
        for t in self.tiers:
            if t.bandwidth != t.bandwidth:          # nan: a single tier, never measured
                bw = "-"
            else:
                bw = f"{t.bandwidth / 1e9:.2f} GB/s" + ("" if t.bandwidth_declared else "*")
                starred = starred or not t.bandwidth_declared
            heat = "-" if t.used == 0 else f"{t.heat_min:.4g} .. {t.heat_max:.4g}"
            used_bytes = t.capacity_bytes * t.used // t.rows if t.rows else 0
            holds = f"{t.used:,} of {t.rows:,} ({format_bytes(used_bytes)} of {format_bytes(t.capacity_bytes)})"
            lines.append(f"{t.name:<10} {t.kind:<7} {bw:>12} {holds:>44} {heat:>23} {t.sample_share:>15.1%}")
        lines.append(f"misplaced now: {self.misplaced:,}; moved so far: {self.moved_total:,}"
                     + (" (* = measured bandwidth)" if starred else ""))
        return "\n".join(lines)


_REASONS = {
    "recency": "newest transitions in the fastest tier: under uniform or most-recent sampling a "
               "newer transition will be read more often before it is overwritten",
    "priority": "highest-priority transitions in the fastest tier: the sampling probability is "
                "proportional to priority^alpha",
}


def single_tier_report(storage: Storage, keys: np.ndarray, policy: str) -> PlacementReport:
    """The report of a plane with one host storage holding the transitions ``keys``.

    >>> import numpy as np
    >>> from dask_research.replay import ExperienceSpec, HostStorage
    >>> r = single_tier_report(HostStorage(ExperienceSpec({"x": ((), "int8")}), 4),
    ...                        np.arange(3), "recency")
    >>> r.tiers[0].used, r.tiers[0].heat_max
    (3, 2.0)
    """
    n = len(keys)
    tier = TierPlacement(name=storage.name, kind=storage.kind, bandwidth=float("nan"),
                         bandwidth_declared=False, capacity_bytes=storage.nbytes,
                         rows=storage.rows, used=n,
                         heat_min=float(keys[0]) if n else float("nan"),
                         heat_max=float(keys[-1]) if n else float("nan"),
                         sample_share=1.0 if n else 0.0)
    return PlacementReport(policy=policy,
                           reason="one host tier: every transition lives in host memory",
                           tiers=[tier])


class Placement:
    """Apply the heat policy of ``sampler`` to a :class:`TieredStorage`.

    The caller (the plane) holds its lock around every call and passes the valid slots and
    their keys (insertion numbers).
    """

    def __init__(self, storage: TieredStorage, sampler: Sampler):
        self.storage = storage
        self.sampler = sampler
        self.policy = sampler.policy
        self.rounds = 0
        self.last_left = 0        # misplaced transitions the last round did not move

    def plan(self, slots: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(heat, current tier, desired tier)`` of each valid slot."""
        heat = self.sampler.heat(slots, keys)
        current = self.storage.tier_of[slots]
        rows = [s.rows for s in self.storage.storages]
        return heat, current, desired_tiers(heat, current, rows)

    def rebalance(self, slots: np.ndarray, keys: np.ndarray, heat: np.ndarray,
                  current: np.ndarray, lock: Any, is_valid: Callable[[np.ndarray], np.ndarray],
                  max_moves: int | None = None) -> int:
        """Move misplaced transitions to their target tiers; returns how many moved.

        The plan (``desired_tiers``, O(n)) is computed from a snapshot without holding
        ``lock``; only the moves run under it, after dropping those whose transition was
        overwritten or moved meanwhile, about ``max_moves`` (promotions hottest first and
        demotions coldest first, interleaved; the prefix grows if it cannot make progress
        alone), trimmed so that every tier stays within its capacity.
        """
        self.rounds += 1
        if len(slots) == 0 or len(self.storage.storages) == 1:
            return 0
        rows = [s.rows for s in self.storage.storages]
        desired = desired_tiers(heat, current, rows)
        wrong = np.flatnonzero(current != desired)
        self.last_left = len(wrong)
        if len(wrong) == 0:
            return 0
        # promotions hottest first, demotions coldest first, interleaved: a prefix of this
        # order frees roughly as many rows in each tier as it fills
        up = wrong[desired[wrong] < current[wrong]]
        down = wrong[desired[wrong] > current[wrong]]
        up = up[np.argsort(-heat[up], kind="stable")]
        down = down[np.argsort(heat[down], kind="stable")]
        order = np.empty(len(wrong), dtype=np.int64)
        m = min(len(up), len(down))
        order[0:2 * m:2], order[1:2 * m:2] = up[:m], down[:m]
        order[2 * m:] = up[m:] if len(up) > m else down[m:]
        s, k, f, t = slots[order], keys[order], current[order], desired[order]
        with lock:
            ok = is_valid(k) & (self.storage.tier_of[s] == f)
            s, f, t = s[ok], f[ok], t[ok]
            # the first prefix of at least max_moves moves (doubled until one is feasible:
            # moves among three or more full tiers only fit as whole cycles)
            n = len(s) if max_moves is None else min(len(s), max(1, int(max_moves)))
            while True:
                keep = self._feasible(f[:n], t[:n])
                if keep.any() or n == len(s):
                    break
                n = min(len(s), 2 * n)
            moved = self.storage.move(s[:n][keep], t[:n][keep])
        self.last_left = len(wrong) - moved
        return moved

    def _feasible(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Mask of moves to keep so that no tier receives more than it frees plus has free."""
        n_t = len(self.storage.storages)
        free = np.array(self.storage._nfree)
        keep = np.ones(len(src), dtype=bool)
        while True:
            incoming = np.bincount(dst[keep], minlength=n_t)
            outgoing = np.bincount(src[keep], minlength=n_t)
            over = incoming - outgoing - free
            if (over <= 0).all():
                return keep
            for tier in np.flatnonzero(over > 0):
                idx = np.flatnonzero(keep & (dst == tier))       # drop the coldest moves into it
                keep[idx[len(idx) - over[tier]:]] = False

    def report(self, slots: np.ndarray, keys: np.ndarray) -> PlacementReport:
        """Explain the current placement (per tier: heat range and share of sampled reads)."""
        st = self.storage
        heat, current, desired = (self.plan(slots, keys) if len(slots)
                                  else (np.zeros(0), np.zeros(0, np.int8), np.zeros(0, np.int8)))
        # expected share of reads per tier: uniform -> share of items (recent: within its window)
        if self.sampler.prioritized:
            mass = heat
        else:
            probs = getattr(self.sampler, "window", None)
            mass = np.ones(len(slots))
            if probs is not None and len(slots) > probs:
                mass = (keys >= keys.max() - probs + 1).astype(float)
        total = mass.sum() or 1.0
        tiers = []
        for k, (t, s) in enumerate(zip(st.tiers, st.storages)):
            m = current == k
            tiers.append(TierPlacement(
                name=t.name, kind=s.kind, bandwidth=st.bandwidths[k],
                bandwidth_declared=st.bandwidth_declared[k], capacity_bytes=s.nbytes,
                rows=s.rows, used=int(m.sum()),
                heat_min=float(heat[m].min()) if m.any() else float("nan"),
                heat_max=float(heat[m].max()) if m.any() else float("nan"),
                sample_share=float(mass[m].sum() / total)))
        return PlacementReport(policy=self.policy, reason=_REASONS[self.policy], tiers=tiers,
                               misplaced=int((current != desired).sum()), moved_total=st.moves)
