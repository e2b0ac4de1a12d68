"""Handing many block tasks to Dask at once.

Every key the engine gives Dask is written by :mod:`dask_research.montecarlo.keys` (the
dashboard's Shards page parses them back with the same module).

>>> submit_many(None, print, [], [])
[]
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["submit_many"]


def submit_many(client: Any, func: Callable, argsets: Sequence[tuple], keys: Sequence[str],
                workers: list[str] | None = None, **kwargs: Any) -> list:
    """Submit ``func(*args, **kwargs)`` for every ``args`` of ``argsets`` in one graph; the futures.

    Several tasks are one :meth:`distributed.Client.map` call: one graph message to the
    scheduler however many blocks, and objects shared by every task (the job, the reducer)
    serialized once (about a quarter of the client's CPU per task of one submit each, at four
    tasks). One task is one :meth:`~distributed.Client.submit`, which costs the client less
    than a map of one. ``workers`` restricts the tasks to those workers (no others allowed).

    >>> submit_many(None, print, [], [])
    []
    """
    if not argsets:
        return []
    kw: dict[str, Any] = {"workers": list(workers), "allow_other_workers": False} if workers else {}
    if len(argsets) == 1:
        return [client.submit(func, *argsets[0], key=keys[0], pure=False, **kw, **kwargs)]
    return client.map(func, *(list(column) for column in zip(*argsets)), key=list(keys), pure=False, **kw,
                      **kwargs)
