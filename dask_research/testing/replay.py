"""Hypothesis strategies and a model-based state machine for the experience plane.

- :func:`specs`: small :class:`~dask_research.replay.ExperienceSpec` objects.
- :func:`batches`: ingest batches (dicts of numpy arrays) that match a spec.
- :func:`make_plane_machine`: a ``RuleBasedStateMachine`` class that runs ingest, sample,
  priority updates, rebalancing and snapshots against a plane and checks every step against a
  trivially correct model (a list of the newest transitions and a dict of priorities).

Examples
--------
>>> from hypothesis import given, settings
>>> from dask_research.testing.replay import specs, batches
>>> from hypothesis import strategies as st
>>> @settings(max_examples=5)
... @given(st.data())
... def test_validates(data):
...     spec = data.draw(specs())
...     batch = data.draw(batches(spec))
...     fields, n = spec.validate(batch)
...     assert all(len(v) == n for v in fields.values())
>>> test_validates()
"""
from __future__ import annotations

import tempfile
from typing import Any, Literal

import numpy as np
from hypothesis import note
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ..exceptions import CapacityError

__all__ = ["DTYPES", "specs", "batches", "make_plane_machine", "MACHINE_SPEC"]

#: dtypes the strategies draw field dtypes from
DTYPES = ("float32", "float64", "int64", "int32", "uint8", "bool")

_names = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8).filter(
    lambda s: s not in {"indices", "weights", "info", "keys", "items", "values", "get", "data"})


@st.composite
def specs(draw: Any, max_fields: int = 4) -> Any:
    """A small ExperienceSpec: 1..max_fields fields, scalar or up to 2-d shapes."""
    from ..replay import ExperienceSpec

    names = draw(st.lists(_names, min_size=1, max_size=max_fields, unique=True))
    fields = {}
    for n in names:
        shape = draw(st.sampled_from([(), (1,), (3,), (2, 2)]))
        fields[n] = (shape, draw(st.sampled_from(DTYPES)))
    return ExperienceSpec(fields)


_FLOAT_WIDTHS: dict[int, Literal[16, 32, 64]] = {2: 16, 4: 32, 8: 64}


def _elements(dtype: np.dtype) -> st.SearchStrategy:
    if dtype.kind == "f":
        return st.floats(-1e6, 1e6, allow_nan=False, width=_FLOAT_WIDTHS[dtype.itemsize])
    if dtype.kind == "b":
        return st.booleans()
    info = np.iinfo(dtype)
    return st.integers(max(info.min, -10**6), min(info.max, 10**6))


@st.composite
def batches(draw: Any, spec: Any, min_size: int = 1, max_size: int = 32) -> dict[str, np.ndarray]:
    """A batch of ``n`` transitions matching ``spec`` (leading axis ``n``)."""
    n = draw(st.integers(min_size, max_size))
    return {name: draw(hnp.arrays(f.dtype, (n, *f.shape), elements=_elements(f.dtype)))
            for name, f in spec.fields.items()}


#: spec used by the state machine: ``id`` is the transition's key, so samples can be checked
MACHINE_SPEC = {"id": ((), "int64"), "obs": ((3,), "float32"), "done": ((), "bool")}


def make_plane_machine(storage: str = "host", sampler: str = "uniform",
                       capacity: int = 24) -> type[RuleBasedStateMachine]:
    """A state machine class for one plane configuration.

    Parameters
    ----------
    storage : {"host", "tiered"}
        ``tiered``: three tiers (host ``fast``, host ``mid``, disk) with declared bandwidths.
    sampler : {"uniform", "prioritized", "recent"}
    capacity : int
        Plane capacity (small, so that the ring wraps often).
    """
    from ..replay import (
        DiskTier,
        ExperiencePlane,
        HostTier,
        PrioritizedSampler,
        RecentSampler,
        TieredStorage,
        UniformSampler,
    )

    class PlaneMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.tmp = tempfile.TemporaryDirectory()
            samp = {"uniform": UniformSampler, "recent": lambda: RecentSampler(window=7),
                    "prioritized": lambda: PrioritizedSampler(alpha=0.7, beta=0.5, eps=0.0)}[sampler]()
            tiers = None
            if storage == "tiered":
                item = 24  # aligned record: 8 (id) + 12 (obs) + 1 (done) -> 24
                tiers = [DiskTier(self.tmp.name, bandwidth=1e9),
                         HostTier(5 * item, bandwidth=1e10, name="fast"),
                         HostTier(7 * item, bandwidth=5e9, name="mid")]
            self.plane = ExperiencePlane(MACHINE_SPEC, capacity, tiers=tiers, sampler=samp,
                                         seed=0, migrate="manual")
            self.model: list[tuple[int, tuple[float, ...], bool]] = []   # newest last
            self.prio: dict[int, float] = {}
            self.max_p = 1.0
            self.total = 0

        def teardown(self) -> None:
            self.plane.close()
            self.tmp.cleanup()

        def _first_key(self) -> int:
            return self.total - len(self.model)

        @rule(n=st.integers(1, 40), seed=st.integers(0, 2**16))
        def ingest(self, n: int, seed: int) -> None:
            r = np.random.default_rng(seed)
            ids = np.arange(self.total, self.total + n)
            obs = r.standard_normal((n, 3)).astype(np.float32)
            done = r.random(n) < 0.3
            note(f"ingest {n} (keys {ids[0]}..{ids[-1]})")
            if n > capacity:                    # refused up front; nothing written
                try:
                    self.plane.ingest({"id": ids, "obs": obs, "done": done})
                except CapacityError:
                    return
                raise AssertionError(f"a batch of {n} > capacity {capacity} was accepted")
            assert self.plane.ingest({"id": ids, "obs": obs, "done": done}) == n
            for i in range(n):
                self.model.append((int(ids[i]), tuple(obs[i].tolist()), bool(done[i])))
                self.prio[int(ids[i])] = self.max_p       # new transitions: max priority so far
            self.total += n
            self.model = self.model[-capacity:]

        @precondition(lambda self: len(self.model) > 0)
        @rule(b=st.integers(1, 16))
        def sample(self, b: int) -> None:
            batch = self.plane.sample(b)
            keys = batch.indices
            note(f"sample {b}: keys {keys.tolist()}")
            lo = self._first_key()
            assert ((keys >= lo) & (keys < self.total)).all(), "sampled a stale or future key"
            assert (batch["id"] == keys).all(), "record does not belong to its key"
            for k, obs, done in zip(keys.tolist(), batch["obs"].tolist(), batch["done"].tolist()):
                mk, mobs, mdone = self.model[k - lo]
                assert mk == k and tuple(obs) == mobs and done == mdone
            if sampler == "recent":
                assert (keys >= self.total - 7).all()
            if sampler == "prioritized":
                assert batch.weights is not None and (batch.weights <= 1.0 + 1e-6).all()

        @precondition(lambda self: sampler == "prioritized" and len(self.model) > 0)
        @rule(data=st.data())
        def update_priorities(self, data: Any) -> None:
            lo = self._first_key()
            keys = data.draw(st.lists(st.integers(max(0, lo - 5), self.total - 1),
                                      min_size=1, max_size=8))
            pr = data.draw(st.lists(st.floats(0.01, 100.0), min_size=len(keys), max_size=len(keys)))
            note(f"update_priorities {keys} {pr}")
            applied = self.plane.update_priorities(np.array(keys), np.array(pr))
            assert applied == sum(k >= lo for k in keys)
            for k, p in zip(keys, pr):
                if k >= lo:
                    self.prio[k] = p
                    self.max_p = max(self.max_p, p)

        @precondition(lambda self: storage == "tiered")
        @rule()
        def rebalance(self) -> None:
            moved = self.plane.rebalance()
            report = self.plane.placement()
            note(f"rebalance moved {moved}; misplaced {report.misplaced}")
            assert report.misplaced == 0
            assert self.plane.rebalance() == 0, "a second rebalance must not move anything"

        @precondition(lambda self: len(self.model) > 0)
        @rule()
        def snapshot_roundtrip(self) -> None:
            meta, arrays = self.plane.snapshot(chunk=5)
            assert arrays["field.id"].tolist() == [m[0] for m in self.model]

        @invariant()
        def sizes_agree(self) -> None:
            assert len(self.plane) == len(self.model)
            assert self.plane.total == self.total

        @invariant()
        def tiers_within_capacity(self) -> None:
            st_ = self.plane.storage
            if storage == "tiered":
                assert isinstance(st_, TieredStorage)
                occ = st_.occupancy()
                assert all(u <= s.rows for u, s in zip(occ, st_.storages))
                assert all(s.rows * 24 <= (t.capacity or s.rows * 24)
                           for s, t in zip(st_.storages, st_.tiers))
                assert sum(occ) == len(self.model)

        @invariant()
        def priorities_agree(self) -> None:
            if sampler != "prioritized" or not self.model:
                return
            s = self.plane.sampler
            assert isinstance(s, PrioritizedSampler) and s.tree is not None
            lo = self._first_key()
            keys = np.arange(lo, self.total)
            leaves = s.tree.leaves(keys % capacity)
            for k, leaf in zip(keys.tolist(), leaves.tolist()):
                p = self.prio[k]
                assert np.isclose(leaf, (p + s.eps) ** s.alpha), (k, leaf, p)

    PlaneMachine.__name__ = f"PlaneMachine_{storage}_{sampler}"
    return PlaneMachine
