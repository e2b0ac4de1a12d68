"""Batch transforms for the delivery pipeline: n-step returns and normalisation.

A transform is any callable ``f(batch) -> Batch | dict | None`` run on host numpy arrays in the
delivery thread, after the gather and before the copy to the learner's device (``None`` means
it modified the batch in place). An object with a ``bind(plane)`` method is bound to the plane
when the iterator starts, so it can read neighbouring transitions.

Examples
--------
>>> import numpy as np
>>> from dask_research import replay
>>> plane = replay.ExperiencePlane({"reward": ((), "float32"), "done": ((), "bool"),
...                                 "next_obs": ((1,), "float32")}, capacity=10, seed=0)
>>> _ = plane.ingest({"reward": np.ones(4), "done": np.array([0, 0, 1, 0], bool),
...                   "next_obs": np.arange(4.0)[:, None]})
>>> ns = NStepReturn(n=3, gamma=0.5); ns.bind(plane)
>>> b = ns(replay.Batch({k: v for k, v in plane.contents().items()}, indices=np.arange(4)))
>>> b.reward.tolist(), b.done.tolist(), b.discount.tolist()
([1.75, 1.5, 1.0, 1.0], [True, True, True, False], [0.125, 0.25, 0.5, 0.5])
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..exceptions import InputError
from .batch import Batch

if TYPE_CHECKING:  # pragma: no cover
    from .experience_plane import ExperiencePlane


class NStepReturn:
    """Replace one-step transitions by n-step ones, with termination and truncation apart.

    For a sampled transition ``t``: ``reward = sum_{j<m} gamma^j r_{t+j}``, ``next_obs``,
    ``done`` (and ``truncated``) of step ``t+m-1``, and a new field ``discount = gamma^m``.
    The window ``m <= n`` stops at the end of an episode or at the newest stored transition.

    Two ends of an episode, as in gymnasium:

    - ``done`` names the *termination* flag (``terminated`` in gymnasium: a terminal state,
      nothing to bootstrap from). Pass ``done="terminated"`` for a spec with gymnasium's names.
    - ``truncated`` (optional) names the *truncation* flag (a time limit: the episode was cut,
      ``next_obs`` is a real state to bootstrap from). The window stops there too, but the
      returned ``done`` stays False, so the target still bootstraps from ``next_obs``.

    The learner's target is ``reward + discount * (1 - done) * V(next_obs)``. Without a
    ``truncated`` field, store ``done = terminated`` (not ``terminated or truncated``) for the
    same bootstrapping; a truncation then does not stop the window, so give the field when
    episodes are cut by time limits. The flag fields come back in their stored dtype (a float
    ``done`` stays float, a bool one bool).

    Transitions of one episode must be stored consecutively (one actor per plane, or actors
    that ingest whole episode chunks).
    """

    def __init__(self, n: int, gamma: float, reward: str = "reward", done: str = "done",
                 next_obs: str = "next_obs", discount: str = "discount",
                 truncated: str | None = None):
        if int(n) < 1:
            raise InputError("n", n, "an integer >= 1", where="NStepReturn")
        if not 0 <= gamma <= 1:
            raise InputError("gamma", gamma, "a number in [0, 1]", where="NStepReturn")
        self.n, self.gamma = int(n), float(gamma)
        self.reward, self.done, self.next_obs, self.discount = reward, done, next_obs, discount
        self.truncated = truncated
        self.plane: ExperiencePlane | None = None

    def bind(self, plane: ExperiencePlane) -> None:
        names = [self.reward, self.done, self.next_obs]
        if self.truncated is not None:
            names.append(self.truncated)
        for f in names:
            if f not in plane.spec.fields:
                raise InputError("field", f, f"a field of the spec ({', '.join(plane.spec.names)})",
                                 where="NStepReturn")
        self.plane = plane

    def __call__(self, batch: Batch) -> Batch:
        if self.plane is None:
            raise InputError("plane", None, "a bound plane: pass the transform to plane.batches()",
                             where="NStepReturn")
        keys = batch.indices
        r = np.array(batch[self.reward], dtype=np.float64)
        term = np.array(batch[self.done], dtype=bool)
        tr = self.truncated
        trunc = np.array(batch[tr], dtype=bool) if tr is not None else None
        nxt = np.array(batch[self.next_obs])
        steps = np.ones(len(keys), dtype=np.int64)
        alive = ~term if trunc is None else ~(term | trunc)
        if self.n > 1 and alive.any():
            ahead = keys[:, None] + np.arange(1, self.n)[None, :]
            rec, valid = self.plane.gather_keys(ahead)
            valid = valid.reshape(ahead.shape)
            rr = rec[self.reward].reshape(ahead.shape)
            dd = rec[self.done].reshape(ahead.shape).astype(bool)
            tt = rec[tr].reshape(ahead.shape).astype(bool) if tr is not None else None
            nn = rec[self.next_obs].reshape(ahead.shape + nxt.shape[1:])
            disc = self.gamma
            for j in range(self.n - 1):
                use = alive & valid[:, j]
                r += np.where(use, disc * rr[:, j], 0.0)
                nxt[use] = nn[use, j]
                term[use] = dd[use, j]
                steps += use
                alive = use & ~dd[:, j]
                if tt is not None and trunc is not None:
                    trunc[use] = tt[use, j]
                    alive &= ~tt[:, j]
                disc *= self.gamma
        data = dict(batch.data)
        data[self.reward] = r.astype(batch[self.reward].dtype)
        data[self.done] = term.astype(np.asarray(batch[self.done]).dtype, copy=False)
        if tr is not None and trunc is not None:
            data[tr] = trunc.astype(np.asarray(batch[tr]).dtype, copy=False)
        data[self.next_obs] = nxt
        data[self.discount] = (self.gamma ** steps).astype(np.float32)
        return Batch(data, keys, batch.weights, batch.info)


class Normalize:
    """``(x - mean) / std`` on one field (float32 out), with fixed statistics.

    >>> import numpy as np
    >>> b = Normalize("obs", mean=1.0, std=2.0)(Batch({"obs": np.array([3.0])}, np.arange(1)))
    >>> b.obs.tolist()
    [1.0]
    """

    def __init__(self, field: str, mean: Any, std: Any, eps: float = 1e-8):
        self.field = field
        self.mean = np.asarray(mean, dtype=np.float32)
        self.std = np.asarray(std, dtype=np.float32)
        self.eps = eps

    def __call__(self, batch: Batch) -> Batch:
        data = dict(batch.data)
        data[self.field] = ((batch[self.field] - self.mean) / (self.std + self.eps)).astype(np.float32)
        return Batch(data, batch.indices, batch.weights, batch.info)
