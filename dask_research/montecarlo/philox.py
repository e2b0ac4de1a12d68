"""Counter-based random streams: one Philox key per job, one counter range per shard.

Shard ``i`` owns the Philox4x64 counter range that starts at ``i << 64`` (counter word 1 holds
the shard index, word 0 counts blocks within the shard). A shard would have to draw 2**64
blocks of four 64-bit words to reach its neighbour's range, so shards are disjoint by
construction, and shard 317 draws the same numbers on every machine and every day. The pilot
uses counter word 2 (``1 << 128``), which no shard index below 2**64 can reach.

Examples
--------
>>> from dask_research.montecarlo.philox import root_key, shard_generator
>>> key = root_key(2026)
>>> a = shard_generator(key, 317).standard_normal(3)
>>> b = shard_generator(key, 317).standard_normal(3)
>>> bool((a == b).all())
True
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..exceptions import InputError
from ..seeds import seed_int

#: The bit generator and its round count, recorded in every content address.
ALGORITHM = "Philox4x64-10"
#: First counter of the pilot stream (counter word 2 = 1).
PILOT_COUNTER = 1 << 128
#: Largest number of shards a job may have (shard index must fit counter word 1).
MAX_SHARDS = 1 << 64


def check_seed(seed: Any) -> int:
    """Return ``seed`` as the ``int`` a job records, or raise :class:`InputError`.

    A seed is what NumPy's ``default_rng`` takes (:mod:`dask_research.seeds`): an int in
    ``[0, 2**128)``, a list of ints or a ``SeedSequence`` (its entropy when it has no spawn key,
    so ``SeedSequence(7)`` is the job of ``seed=7``), a ``Generator`` (one number drawn from it)
    or ``None`` (fresh entropy). The job records the int, so whichever form was given, the job
    replays from its record.

    >>> import numpy as np
    >>> check_seed(7), check_seed(np.random.SeedSequence(7))
    (7, 7)
    >>> check_seed(np.random.default_rng(1)) == check_seed(np.random.default_rng(1))
    True
    """
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, (bool, np.bool_)) and seed >= 0:
        if int(seed) >= 2**128:
            raise InputError("seed", seed, "an integer in [0, 2**128)", where="Job")
        return int(seed)
    if seed is None:
        return int(np.random.SeedSequence().entropy) % 2**128     # type: ignore[arg-type]
    value = seed_int(seed, where="Job")
    assert value is not None
    return value % 2**128


def root_key(seed: int) -> np.ndarray:
    """The job's 128-bit Philox key, derived from the root seed by ``SeedSequence``."""
    return np.random.SeedSequence(check_seed(seed)).generate_state(2, np.uint64)


def key_hex(key: np.ndarray) -> str:
    """A printable form of the key (word 1 then word 0, as one 128-bit hex number)."""
    return f"{int(key[1]):016x}{int(key[0]):016x}"


def shard_counter(shard: int) -> int:
    """First Philox counter of ``shard``'s range."""
    if not 0 <= shard < MAX_SHARDS:
        raise InputError("shard", shard, "an index in [0, 2**64)")
    return int(shard) << 64


def shard_generator(key: np.ndarray, shard: int) -> np.random.Generator:
    """A ``Generator`` positioned at the start of ``shard``'s counter range."""
    return np.random.Generator(np.random.Philox(key=key, counter=shard_counter(shard)))


def pilot_generator(key: np.ndarray) -> np.random.Generator:
    """A ``Generator`` on the pilot's counter range, disjoint from every shard."""
    return np.random.Generator(np.random.Philox(key=key, counter=PILOT_COUNTER))
