"""Seeds as NumPy takes them, checked the same way by every capability.

Every ``seed=`` of the package accepts what NumPy's own ``default_rng`` does where that can be
honoured: an int ``>= 0`` (or a list of them), a :class:`numpy.random.SeedSequence`, a
:class:`numpy.random.Generator`, or ``None``. :func:`seed_sequence` turns any of them into a
``SeedSequence`` (a Generator is *spawned from*, as ``Generator.spawn`` does: the child stream
is independent of the caller's, and a second call gives another child); :func:`seed_int` into
one whole number, for the settings a journal or a content address records (a SeedSequence
without a spawn key gives its entropy; anything else draws one number from it). Anything else is
one :class:`~dask_research.exceptions.InputError` naming the value and what would be valid.

Examples
--------
>>> import numpy as np
>>> seed_sequence(7).entropy, seed_int(np.random.SeedSequence(7))
(7, 7)
>>> isinstance(seed_sequence(np.random.default_rng(0)), np.random.SeedSequence)
True
>>> seed_int(-1, where="ExperiencePlane")
Traceback (most recent call last):
...
dask_research.exceptions.InputError: ExperiencePlane: seed=-1 is invalid; expected an int >= 0 (or a list of them), a numpy SeedSequence or Generator, or None
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .exceptions import InputError

__all__ = ["seed_sequence", "seed_int", "EXPECTED"]

#: What a ``seed=`` may be, in words.
EXPECTED = "an int >= 0 (or a list of them), a numpy SeedSequence or Generator, or None"


def _whole(x: Any) -> bool:
    return bool(isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)) and x >= 0)


def _check(seed: Any, where: str | None) -> None:
    if seed is None or isinstance(seed, (np.random.SeedSequence, np.random.Generator)) or _whole(seed):
        return
    if isinstance(seed, (list, tuple)) and seed and all(_whole(x) for x in seed):
        return                                   # NumPy's array_like of ints: a SeedSequence's entropy
    raise InputError("seed", seed, EXPECTED, where=where)


def seed_sequence(seed: Any, where: str | None = None) -> np.random.SeedSequence | None:
    """``seed`` as a :class:`numpy.random.SeedSequence` (``None`` stays ``None``: fresh entropy)."""
    _check(seed, where)
    if seed is None or isinstance(seed, np.random.SeedSequence):
        return seed
    if isinstance(seed, np.random.Generator):
        parent = getattr(seed.bit_generator, "seed_seq", None)
        if isinstance(parent, np.random.SeedSequence):
            return parent.spawn(1)[0]
        return np.random.SeedSequence(int(seed.integers(2**63)))     # a generator seeded otherwise
    if isinstance(seed, (list, tuple)):
        return np.random.SeedSequence([int(x) for x in seed])
    return np.random.SeedSequence(int(seed))


def seed_int(seed: Any, where: str | None = None) -> int | None:
    """``seed`` as one whole number ``>= 0`` to record (``None`` stays ``None``)."""
    _check(seed, where)
    if seed is None:
        return None
    if isinstance(seed, np.random.SeedSequence):
        if not seed.spawn_key and isinstance(seed.entropy, int):
            return int(seed.entropy)
        return int(seed.generate_state(2, np.uint32).astype(np.uint64) @ np.array([1, 2**32], np.uint64))
    if isinstance(seed, np.random.Generator):
        return int(seed.integers(2**63))
    if isinstance(seed, (list, tuple)):
        return seed_int(np.random.SeedSequence([int(x) for x in seed]))
    return int(seed)
