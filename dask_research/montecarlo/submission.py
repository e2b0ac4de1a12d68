"""A run's task keys, and handing many block tasks to Dask at once.

Every key the engine gives Dask is written by :func:`task_key` (the dashboard's Shards page
parses them back). Duplicates and recomputations get distinct keys, or Dask would hand back a
cached value: ``mc-block`` (a first attempt), ``mc-spec`` (a speculative copy), ``mc-redo`` (a
recomputation after a quarantine), ``mc-retry<n>`` (the n-th retry after a failure),
``mc-verify`` (a check; ``-m<n>``: its n-th move to another worker).

>>> task_key("block", "0a1b2c3d4e5f-9f8e7d", 0, 256)
'mc-block-0a1b2c3d4e5f-9f8e7d-0-256'
>>> task_key("verify", "0a1b2c3d4e5f-9f8e7d", 17, moved=2)
'mc-verify-0a1b2c3d4e5f-9f8e7d-17-m2'
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["task_key", "block_kind", "submit_many"]


def task_key(kind: str, tag: str, start: int, stop: int | None = None, moved: int = 0) -> str:
    """The Dask key of a run's task: a block ``start..stop-1``, or (``stop=None``) a check of shard ``start``.

    ``tag`` names the run's execution (its run id's first 12 characters and 6 random ones).

    >>> task_key(block_kind(retry=1), "ab-cd", 4, 8), task_key("verify", "ab-cd", 5)
    ('mc-retry1-ab-cd-4-8', 'mc-verify-ab-cd-5')
    """
    if stop is None:
        return f"mc-{kind}-{tag}-{start}" + (f"-m{moved}" if moved else "")
    return f"mc-{kind}-{tag}-{start}-{stop}"


def block_kind(*, speculative: bool = False, redo: bool = False, retry: int = 0) -> str:
    """The kind of block task, for :func:`task_key`.

    >>> block_kind(), block_kind(speculative=True), block_kind(redo=True), block_kind(retry=2)
    ('block', 'spec', 'redo', 'retry2')
    """
    if retry:
        return f"retry{retry}"
    return "spec" if speculative else ("redo" if redo else "block")


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
