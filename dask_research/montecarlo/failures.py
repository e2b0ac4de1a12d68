"""How a run's failures read: a lost scheduler, a cancellation from outside, one-line reasons.

Dask cancels every future of a client that loses its scheduler (reason
``scheduler-connection-lost``); the run turns that into a :class:`ResearchError` saying what is
stored and that the same command resumes. Any other cancellation of a run's task (another client,
the dashboard) fails the run saying so.

>>> one_line(ValueError("two\\n   lines"))
'two lines'
>>> lost_scheduler(None, KeyboardInterrupt())
False
"""
from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any

from .._compat import (
    SCHEDULER_LOST,
    CommClosedError,
    FutureCancelledError,
    FuturesCancelledError,
    cancellation_of,
    client_status,
)
from ..exceptions import ResearchError

__all__ = ["LOST", "one_line", "lost_scheduler", "raise_if_cancelled", "lost_scheduler_error", "killed_workers_error"]

#: The reason Dask gives the futures it cancels when a client loses its scheduler
#: (:data:`dask_research._compat.SCHEDULER_LOST`).
LOST = SCHEDULER_LOST


def one_line(exc: BaseException) -> str:
    """``exc``'s message on one line (its type's name if it has none).

    >>> one_line(KeyError())
    'KeyError'
    """
    text = " ".join(str(exc).split())
    return text if text else type(exc).__name__


def lost_scheduler(client: Any, exc: BaseException) -> bool:
    """Whether ``exc`` (raised while a run waited on ``client``) means the scheduler is gone.

    >>> lost_scheduler(None, CommClosedError("in <TCP (closed)>"))
    True
    """
    if isinstance(exc, (ResearchError, KeyboardInterrupt)):
        return False
    if isinstance(exc, FutureCancelledError) and getattr(exc, "reason", None) == LOST:
        return True
    if isinstance(exc, FuturesCancelledError) and any(getattr(g, "reason", None) == LOST
                                                      for g in getattr(exc, "error_groups", [])):
        return True
    if isinstance(exc, CommClosedError):
        return True
    return client_status(client) != "running" and isinstance(exc, (OSError, TimeoutError, asyncio.CancelledError,
                                                    concurrent.futures.CancelledError, RuntimeError))


def raise_if_cancelled(client: Any, run_id: str, done: list) -> None:
    """A future of the run was cancelled, not by the run: the scheduler is gone, or someone.

    The lost scheduler re-raises Dask's own cancellation (the run turns it into
    :func:`lost_scheduler_error`); any other cancellation fails the run saying so, with the
    first reason that one of the cancelled futures carries. (A future whose result was being
    gathered when it was cancelled is reset and re-reported by Dask without the reason, as
    ``"unknown"``; its siblings cancelled in the same call keep it, so all are read.)

    >>> raise_if_cancelled(None, "ab" * 32, [])      # nothing cancelled: nothing to say
    """
    cancelled = [f for f in done if f.status == "cancelled"]
    if not cancelled:
        return
    errors = [cancellation_of(f) for f in cancelled]
    lost = next((e for e in errors if getattr(e, "reason", None) == LOST), None)
    if lost is not None or client_status(client) != "running":
        raise lost or next((e for e in errors if e is not None), None) or \
            FutureCancelledError(cancelled[0].key, reason=LOST)  # type: ignore[call-arg]
    reason = next((r for r in (getattr(e, "reason", None) for e in errors) if r not in _NO_REASON), None)
    keys = ", ".join(str(f.key) for f in cancelled[:3])
    raise ResearchError(f"run {run_id[:12]}: task {keys} was cancelled from outside the run "
                        f"(reason: {reason or 'not given'}); stored shards are kept and the same "
                        "command resumes")


#: What Dask says for a cancellation whose reason it did not pass on.
_NO_REASON = (None, "", "unknown", "already forgotten")


def lost_scheduler_error(exc: BaseException, *, address: str | None, run_id: str, shards: int, have: int,
                         where: str | None) -> ResearchError:
    """The error of a run that lost its scheduler: what is kept (``where``: the store) and how to resume.

    >>> str(lost_scheduler_error(OSError("gone"), address=None, run_id="ab" * 32, shards=8, have=3,
    ...                          where=None))[:60]
    'run abababababab lost the connection to the scheduler (OSErr'
    """
    missing = shards - have
    if where is not None:
        kept = (f"the {have:,} of {shards:,} shards stored in {where} are kept; run the same "
                f"command again (on a running scheduler) to resume: it computes only the missing {missing:,}")
    else:
        kept = (f"{have:,} of {shards:,} shards were computed but no store= was given, so they "
                "are lost; pass store= (--store) to make a run resumable")
    return ResearchError(f"run {run_id[:12]} lost the connection to {address or 'the scheduler'} "
                         f"({type(exc).__name__}: {one_line(exc)[:200]}): {kept}")


def _size(n: float) -> str:
    """Bytes for a message.

    >>> _size(3 * 2**20), _size(1536)
    ('3.0 MiB', '1.5 KiB')
    """
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def killed_workers_error(exc: BaseException, *, shards: str, block: int, samples_per_shard: int,
                         shard_bytes: int | None, workers: dict) -> Exception:
    """Dask's ``KilledWorker`` (the task's workers died, one after another) as one line a user can act on.

    A worker process that dies while it runs a block is, on a cluster with nannies, almost
    always one its nanny restarted for passing the memory limit: the message says which
    shards, the workers' memory limit, what a shard needed in the pilot, and what to change.
    ``workers``: the scheduler's information on each worker (``memory_limit``, ``nthreads``).

    >>> str(killed_workers_error(RuntimeError("x"), shards="0-3", block=4, samples_per_shard=65_536,
    ...                          shard_bytes=2**20, workers={"w": {"memory_limit": 2**28, "nthreads": 2}}))[:95]
    "pipeline output of shard 0-3: killed every worker it ran on (Dask's KilledWorker: x): the shard"
    """
    from ..exceptions import PipelineError

    limits = sorted({int(i.get("memory_limit") or 0) for i in workers.values()} - {0})
    threads = max([int(i.get("nthreads") or 1) for i in workers.values()] or [1])
    limit = (f"the workers' memory limit is {' to '.join(_size(x) for x in (limits[0], limits[-1])[:len(limits)])} "
             f"for {threads} thread(s) each" if limits else "the workers have no memory limit set")
    pilot = (f"the pilot measured {_size(shard_bytes)} per shard of {samples_per_shard:,} samples "
             f"({_size(shard_bytes * block)} for a task of {block} shards)" if shard_bytes else
             "the pilot measured no memory for a shard")
    return PipelineError(shards, (
        f"killed every worker it ran on (Dask's KilledWorker: {one_line(exc)[:160]}): the shards' pipeline most likely "
        f"exceeded the workers' memory limit (a nanny restarts a worker past 95 % of it); {limit}, {pilot}. Use fewer "
        "samples_per_shard (more shards), shards_per_task=1, fewer threads per worker, or workers with more memory "
        "(dask worker --memory-limit); stored shards are kept and the same command resumes"))
