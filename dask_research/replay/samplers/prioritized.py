"""Proportional prioritized replay (Schaul et al., 2016) on a vectorised sum-tree.

Transition ``i`` is sampled with probability ``P(i) = p_i^alpha / sum_k p_k^alpha``; its
importance weight is ``w_i = (N P(i))^-beta / max_k (N P(k))^-beta = (p_i^alpha /
min_k p_k^alpha)^-beta``, so the largest weight is 1 (the min-tree gives ``min_k``). New
transitions get the largest priority seen so far, so each is likely to be replayed at least
once. Priorities are ``|td_error| + eps`` style non-negative numbers; ``eps`` keeps a zero
priority from removing a transition from the distribution.

What is refused, up front and with nothing applied (an :class:`~dask_research.exceptions.InputError`
naming the value): a priority that is negative, ``NaN`` or infinite; one whose leaf
``(p + eps) ** alpha`` exceeds :data:`~._sumtree.MAX_LEAF` (``1e280``: the sum over any ring
then stays a finite float64, where ``[1e308, 1e308]`` would make it ``inf`` and every draw land
on the last slot); and an update that would leave every stored transition with leaf 0 (nothing
could be sampled any more). Priorities are never clipped: what is stored is what was given.

Examples
--------
>>> import numpy as np
>>> from dask_research.replay import PrioritizedSampler
>>> s = PrioritizedSampler(alpha=1.0, beta=1.0, eps=0.0); s.attach(4)
>>> s.on_insert(0, 4)
>>> s.update(np.array([0, 1, 2, 3]), np.array([1.0, 1.0, 1.0, 5.0]))
>>> s.probabilities(cursor=0, size=4).round(3).tolist()
[0.125, 0.125, 0.125, 0.625]
>>> slots, w = s.sample(cursor=0, size=4, batch_size=4, rng=np.random.default_rng(0))
>>> float(w.max()) <= 1.0
True
>>> s.update(np.array([1, 2]), np.array([1e308, 1e308]))
Traceback (most recent call last):
...
dask_research.exceptions.InputError: update_priorities: priorities=1e+308 is invalid; expected finite numbers >= 0 whose leaf (p + eps) ** alpha (eps=0.0, alpha=1.0) is at most 1e+280, so that the sum over the ring stays finite
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ... import config
from ...durable import schema
from ...exceptions import InputError
from ._sumtree import MAX_LEAF, SumTree
from .base import Sampler


def leaf_of(p: np.ndarray | float, eps: float, alpha: float) -> np.ndarray:
    """The leaves ``(p + eps) ** alpha`` as float64 (``inf`` where they overflow, never a warning)."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        return np.power(np.asarray(p, dtype=np.float64) + eps, alpha)


def _parameter(name: str, value: Any, configured: bool = True) -> float:
    """``value`` (or, if ``configured`` and None, ``research.replay.<name>``) as a finite float >= 0."""
    v = config.resolve(f"replay.{name}", value) if configured else value
    try:
        f = float(v)
    except (TypeError, ValueError):
        f = math.nan
    if isinstance(v, bool) or not (f >= 0 and math.isfinite(f)):
        raise InputError(name, v, "a finite number >= 0", where="PrioritizedSampler")
    return f


class _StateSchema(schema.Checker):
    """The JSON part of a prioritized sampler's state: its parameters, and a ``max_priority``
    whose leaf (what new transitions get) is within :data:`MAX_LEAF`."""

    expected = "a prioritized sampler's state"
    _obj = schema.Obj({"alpha": schema.Float(0), "beta": schema.Float(0), "eps": schema.Float(0)},
                      optional={"shuffle": schema.Bool(), "max_priority": schema.Float(0)})

    def check(self, value: Any, where: str) -> Any:
        self._obj.check(value, where)
        top = max(value.get("max_priority", 1.0), 1.0)     # new transitions get its leaf (1.0 at first)
        leaf = float(leaf_of(top, value["eps"], value["alpha"]))
        if not leaf <= MAX_LEAF:
            key = "max_priority" if "max_priority" in value else "eps"
            raise schema.Invalid(f"{where}.{key}" if where else key,
                                 f"is {value[key]!r}; the leaf (p + eps) ** alpha of new transitions would be "
                                 f"{leaf:g}, more than {MAX_LEAF:g}, the most a priority leaf may be")
        return value


class PrioritizedSampler(Sampler):
    """Proportional prioritized sampling with importance weights.

    Parameters
    ----------
    alpha : float, optional
        Priority exponent (0 = uniform). Default ``research.replay.alpha``.
    beta : float, optional
        Importance-sampling exponent (1 = full correction); may be annealed by assigning
        ``sampler.beta``. Default ``research.replay.beta``.
    eps : float
        Added to every priority before the exponent.
    shuffle : bool
        Batch order (default True: the order of the draws, i.e. random). The tree is searched
        with the draws sorted, which keeps the descent local; with ``shuffle=True`` the slots
        are put back in draw order (an ``argsort`` and a scatter, no extra random numbers, so
        the batches under a seed are as reproducible as before); ``False`` returns them
        sorted by slot, which a learner that splits a batch into minibatches must not rely on.
    """

    policy = "priority"
    prioritized = True
    tree: SumTree                         # built by attach()

    def __init__(self, alpha: float | None = None, beta: float | None = None, eps: float = 1e-6,
                 shuffle: bool = True):
        self.shuffle = bool(shuffle)
        self.alpha = _parameter("alpha", alpha)
        self.beta = _parameter("beta", beta)
        self.eps = _parameter("eps", eps, configured=False)
        if not float(leaf_of(1.0, self.eps, self.alpha)) <= MAX_LEAF:
            raise InputError("eps", eps, f"a value whose leaf (1 + eps) ** alpha (alpha={self.alpha:g}) is at most "
                             f"{MAX_LEAF:g}", where="PrioritizedSampler")
        self.max_priority = 1.0

    def attach(self, capacity: int) -> None:
        super().attach(capacity)
        self.tree = SumTree(capacity)

    def _leaf(self, p: np.ndarray | float) -> np.ndarray:
        return leaf_of(p, self.eps, self.alpha)

    @classmethod
    def state_schema(cls) -> schema.Checker:
        return _StateSchema()

    def on_insert(self, start: int, n: int) -> None:
        self.tree.set_range(start, start + n, float(self._leaf(self.max_priority)))

    def sample(self, cursor: int, size: int, batch_size: int,
               rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        tree = self.tree
        cum = np.cumsum(tree._roots)
        total = cum[-1]
        if not total > 0:
            raise InputError("priorities", 0.0, "at least one positive priority among the stored "
                             "transitions (all are 0; use eps > 0)", where="PrioritizedSampler")
        u = rng.random(batch_size)
        u *= total
        if self.shuffle:                  # search sorted (local descent), return in draw order
            order = np.argsort(u)
            found = tree.find(u[order], cum)
            slots = np.empty_like(found)
            slots[order] = found
        else:
            u.sort()                      # monotone slots: the descent and the gather stay local
            slots = tree.find(u, cum)
        p = tree.sum[slots + tree.L]
        # w = (p / p_min) ** -beta, largest weight 1
        w = np.divide(tree.min, p)
        if self.beta != 1.0:
            np.power(w, self.beta, out=w)
        return slots, w.astype(np.float32)

    def update(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        priorities = np.asarray(priorities, dtype=np.float64).reshape(-1)
        if len(priorities) != len(slots):
            raise InputError("priorities", f"{len(priorities)} values",
                             f"one priority per index ({len(slots)})", where="update_priorities")
        if len(priorities) == 0:
            return
        if not np.isfinite(priorities).all() or (priorities < 0).any():
            bad = priorities[~(np.isfinite(priorities) & (priorities >= 0))][0]
            raise InputError("priorities", float(bad), "finite numbers >= 0", where="update_priorities")
        leaf = self._leaf(priorities)
        over = ~(leaf <= MAX_LEAF)
        if over.any():
            raise InputError("priorities", float(priorities[over][0]), "finite numbers >= 0 whose leaf "
                             f"(p + eps) ** alpha (eps={self.eps}, alpha={self.alpha}) is at most {MAX_LEAF:g}, "
                             "so that the sum over the ring stays finite", where="update_priorities")
        if not leaf.any() and not self._positive_besides(slots):
            raise InputError("priorities", f"0 for all {len(slots)} of them", "at least one positive priority "
                             f"among the stored transitions once applied (with eps={self.eps} every stored "
                             "transition would have priority 0 and nothing could be sampled; use eps > 0)",
                             where="update_priorities")
        self.max_priority = max(self.max_priority, float(priorities.max()))
        self.tree.set(slots, leaf, np.where(leaf > 0, leaf, np.inf))

    def _positive_besides(self, slots: np.ndarray) -> bool:
        """Whether a leaf other than those of ``slots`` is positive (only the slots of stored
        transitions have positive leaves)."""
        leaves = self.tree.leaves()
        return int(np.count_nonzero(leaves)) > int(np.count_nonzero(leaves[np.unique(slots)]))

    def leaves(self, slots: np.ndarray) -> np.ndarray:
        return self.tree.sum[slots + self.tree.L]

    def min_leaf(self) -> float:
        return self.tree.min

    def mass(self, size: int) -> float:
        return self.tree.total if size else 0.0

    def priorities(self, slots: np.ndarray) -> np.ndarray | None:
        """The priorities whose leaves ``slots`` hold: ``leaf ** (1 / alpha) - eps``, >= 0
        (None with ``alpha == 0``: every leaf is 1)."""
        if not self.alpha > 0:
            return None
        leaf = self.tree.sum[slots + self.tree.L]
        return np.maximum(np.maximum(leaf, 0.0) ** (1.0 / self.alpha) - self.eps, 0.0)

    def reset(self) -> None:
        self.tree.load(np.zeros(self.capacity), np.full(self.capacity, np.inf))

    def load_leaves(self, slots: np.ndarray, leaves: np.ndarray) -> None:
        self.tree.set(slots, leaves, np.where(leaves > 0, leaves, np.inf))

    def resume(self, state: Mapping[str, Any]) -> None:
        self.max_priority = float(state.get("max_priority", 1.0))

    def heat(self, slots: np.ndarray, keys: np.ndarray) -> np.ndarray:
        return self.leaves(slots)

    def probabilities(self, cursor: int, size: int) -> np.ndarray:
        leaves = self.tree.leaves().copy()
        return leaves / leaves.sum()

    def clear(self, slots: np.ndarray) -> None:
        """Remove ``slots`` from the distribution (no transition there any more)."""
        self.tree.set(slots, 0.0, np.inf)

    def state_dict(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "beta": self.beta, "eps": self.eps, "shuffle": self.shuffle,
                "max_priority": self.max_priority, "leaves": self.tree.leaves().copy()}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> PrioritizedSampler:
        return cls(alpha=state["alpha"], beta=state["beta"], eps=state["eps"],
                   shuffle=state.get("shuffle", True))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.alpha = float(state["alpha"])
        self.beta = float(state["beta"])
        self.eps = float(state["eps"])
        self.shuffle = bool(state.get("shuffle", self.shuffle))
        self.max_priority = float(state["max_priority"])
        leaves = np.asarray(state["leaves"], dtype=np.float64)
        bad = ~((leaves >= 0) & (leaves <= MAX_LEAF))
        if leaves.shape != (self.capacity,) or bad.any():
            shown = leaves.shape if leaves.shape != (self.capacity,) else float(leaves[bad][0])
            raise InputError("leaves", shown, f"{self.capacity} finite leaves in [0, {MAX_LEAF:g}]",
                             where="PrioritizedSampler.load_state_dict")
        self.tree.load(leaves, np.where(leaves > 0, leaves, np.inf))

    def __repr__(self) -> str:
        return (f"PrioritizedSampler(alpha={self.alpha}, beta={self.beta}, eps={self.eps}, "
                f"shuffle={self.shuffle})")
