"""Which shards to re-check before a result is accepted, and how to judge a mismatch.

``k`` shards are chosen from a hash of the run id (so anyone can say which shards a run
checked), plus, for every worker that produced shards and has none among them, its first shard
by the same hash order: a faulty worker cannot hide behind the luck of the draw. Each check
recomputes the shard on a *different* worker (a distinct Dask key, so Dask cannot hand back the
cached value) and compares within the tolerance class: ``exact`` on CPU.

When a check disagrees, the client recomputes the shard itself as the referee; the worker
whose state differs from the referee's is quarantined and every shard it produced is
recomputed on the others.

Shards a run reuses from its store were computed by an earlier run and could have been edited
by anyone who can write the store. Every stored state is checked against the accumulator's
invariants when it is read, but an edit that keeps them all is caught only by recomputing the
shard: :func:`choose_reused` draws ``n`` of the ``N`` reused shards unpredictably, so one
edited shard is caught with probability ``n/N``, and
``research.montecarlo.verify-reused: all`` recomputes every one. A result says which ("k of N
reused shards re-run", :func:`~dask_research.montecarlo.result.reused_sentence`).

Examples
--------
>>> from dask_research.montecarlo.verify import choose_shards
>>> picks = choose_shards("ab" * 32, 640, {s: "w1" if s < 600 else "w2" for s in range(640)}, k=4)
>>> len(picks) >= 4 and any(s >= 600 for s in picks)
True
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from .mergers import compare_states

__all__ = ["choose_shards", "choose_reused", "reused_count", "reused_setting", "REUSED_EXPECTED", "hash_order", "states_match", "TOLERANCE"]

#: Tolerance class of CPU results.
TOLERANCE = "exact"


def hash_order(run_id: str, shards: int, limit: int | None = None) -> list[int]:
    """Shard indices in a pseudo-random order fixed by the run id (first ``limit`` of them)."""
    limit = shards if limit is None else min(limit, shards)
    out: list[int] = []
    seen: set[int] = set()
    counter = 0
    while len(out) < limit:
        digest = hashlib.sha256(f"{run_id}:verify:{counter}".encode()).digest()
        counter += 1
        s = int.from_bytes(digest[:8], "little") % shards
        if s not in seen:
            seen.add(s)
            out.append(s)
        if counter > 64 * shards + 64:  # tiny jobs: fill in index order
            out.extend(i for i in range(shards) if i not in seen)
            out = out[:limit]
            break
    return out


def choose_shards(run_id: str, shards: int, producers: Mapping[int, str], k: int) -> list[int]:
    """``k`` hashed shards plus one per producing worker not yet covered."""
    if k <= 0:
        return []
    picks = hash_order(run_id, shards, k)
    covered = {producers.get(s) for s in picks}
    missing = {w for w in producers.values() if w not in covered}
    if missing:
        for s in hash_order(run_id, shards):
            w = producers.get(s)
            if w in missing:
                picks.append(s)
                missing.discard(w)
                if not missing:
                    break
    return picks


#: What ``research.montecarlo.verify-reused`` may be.
REUSED_EXPECTED = 'null (as many as verify), "all", or a whole number >= 0'


def reused_setting(setting: Any) -> int | str | None:
    """``research.montecarlo.verify-reused`` as kept: ``None``, ``"all"`` or a whole number >= 0.

    Anything else is a ``ValueError`` (its caller names the setting).

    >>> reused_setting(" ALL "), reused_setting(3), reused_setting(None)
    ('all', 3, None)
    """
    if setting is None:
        return None
    if isinstance(setting, str) and setting.strip().lower() == "all":
        return "all"
    if isinstance(setting, int) and not isinstance(setting, bool) and setting >= 0:
        return int(setting)
    raise ValueError(f"verify-reused {setting!r}")


def reused_count(setting: Any, k: int, reused: int) -> int:
    """How many of ``reused`` shards to check: ``research.montecarlo.verify-reused`` resolved.

    ``None``: as many as the run's ``verify`` (``k``); ``"all"``: every reused shard; an integer
    >= 0: that many (at most ``reused``). Anything else is an :class:`InputError`.

    >>> reused_count(None, 4, 100), reused_count("all", 4, 100), reused_count(9, 4, 5)
    (4, 100, 5)
    """
    from ..exceptions import InputError

    try:
        kept = reused_setting(setting)
    except ValueError:
        raise InputError("research.montecarlo.verify-reused", setting, REUSED_EXPECTED, where="verify") from None
    n = k if kept is None else reused if kept == "all" else kept
    return max(0, min(int(n), reused))


def choose_reused(reused: Iterable[int], n: int, rng: Any = None) -> list[int]:
    """``n`` of the shards reused from a store, drawn with an unpredictable random source.

    The run's own picks (:func:`hash_order`) are a public function of the run id, so whoever
    can edit a store knows which stored shards a resumed run would recompute and can edit the
    others. Reused shards are therefore sampled with :class:`secrets.SystemRandom` (the
    operating system's CSPRNG) unless ``rng`` (anything with ``sample``) is given, for tests.
    """
    import secrets

    pool = sorted(set(int(s) for s in reused))
    n = max(0, min(int(n), len(pool)))
    if n == 0:
        return []
    if n == len(pool):
        return pool
    return sorted((rng or secrets.SystemRandom()).sample(pool, n))


def states_match(a: Any, b: Any, tolerance: str | float = TOLERANCE) -> str | None:
    """``None`` if the two states agree in the tolerance class, else what differs."""
    if tolerance == "exact":
        return compare_states(a, b, rtol=0.0, exact=True)
    return compare_states(a, b, rtol=float(tolerance))
