"""Verification of a run: who produced each shard, the checks on other workers, the referee.

Which shards are checked is :mod:`.verify`'s choice; this module runs the checks. Each check
recomputes its shard on a worker other than its producer under a distinct key; a check that does
not finish within the check limit (or fails) moves to a worker not yet tried, and with no worker
left the client recomputes the shard itself. When a check disagrees, the client recomputes the
shard as the referee: whoever differs from the referee is at fault. A shard computed in this run
blames its worker (quarantined with every shard it produced); a shard reused from the store
blames its stored file, not the worker named in it (the file was edited or damaged after it was
written, or written by an older run): the file is quarantined and its shards recomputed.

>>> producers = Producers(8, {0: "w1", 1: "w1"})
>>> producers.record([2, 3], "w2")
>>> producers.among({0, 2, 5})
{0: 'w1', 2: 'w2'}
>>> producers.shards_of({"w2"})
[2, 3]
"""
from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from .._cluster import workers_info
from .._compat import heartbeat_interval
from .arrivals import Arrivals
from .failures import raise_if_cancelled
from .keys import verify_key
from .shard_compute import compute_shard
from .timing import Limits
from .verify import TOLERANCE, choose_shards, states_match

__all__ = ["Producers", "Checks", "verify_shard", "alive_workers", "responsive_workers"]


def verify_shard(job, reducer, shard: int) -> tuple[Any, str]:
    """Recompute one shard (a verification task); returns the state and the worker.

    >>> from dask_research.montecarlo import Job, Normal
    >>> job = Job(lambda a: a, {"a": Normal(0.0, 1.0)}, shards=4, samples_per_shard=64, seed=1, range=(-8, 8))
    >>> state, where = verify_shard(job, job.make_reducer(job.range), 2)
    >>> where, state == compute_shard(job, 2, reducer=job.make_reducer(job.range))
    ('local', True)
    """
    from .shard_compute import _worker_address

    return compute_shard(job, shard, reducer=reducer), _worker_address()


def alive_workers(client: Any) -> list[str]:
    """Every worker the scheduler lists, sorted.

    >>> from types import SimpleNamespace
    >>> info = {"workers": {"tcp://b:1": {"last_seen": 100.0}, "tcp://a:1": {"last_seen": 99.0}}}
    >>> client = SimpleNamespace(scheduler=SimpleNamespace(identity=None), sync=lambda f, **kw: info)
    >>> alive_workers(client)
    ['tcp://a:1', 'tcp://b:1']
    """
    return sorted(workers_info(client))


def responsive_workers(client: Any) -> list[str]:
    """Workers whose last heartbeat is recent, else every worker the scheduler lists.

    A frozen (SIGSTOP) worker stays in the scheduler's table until its TTL (minutes) but its
    heartbeats stop: a check moved away from a late worker should not land on it. "Recent"
    is within five heartbeat intervals (at least 5 s) of the freshest heartbeat, all read on
    the scheduler's clock.

    >>> from types import SimpleNamespace
    >>> info = {"workers": {"tcp://b:1": {"last_seen": 100.0}, "tcp://frozen:1": {"last_seen": 20.0}}}
    >>> client = SimpleNamespace(scheduler=SimpleNamespace(identity=None), sync=lambda f, **kw: info)
    >>> responsive_workers(client)
    ['tcp://b:1']
    """
    info = workers_info(client)
    seen = {w: float(i.get("last_seen") or 0.0) for w, i in info.items()}
    if not seen:
        return []
    beat = heartbeat_interval(len(seen))      # Dask's own, by cluster size
    freshest = max(seen.values())
    fresh = [w for w, t in seen.items() if freshest - t < max(5.0, 5 * beat)]
    return sorted(fresh or seen)


class Producers:
    """The worker that produced each shard, compactly (an index into ``names``; -1 unknown).

    >>> p = Producers(4)
    >>> p.record([1, 2], "tcp://10.0.0.5:4001")
    >>> p.names, p.of.tolist()
    (['tcp://10.0.0.5:4001'], [-1, 0, 0, -1])
    """

    def __init__(self, shards: int, known: Mapping[int, str] | None = None):
        self.names: list[str] = []
        self._ids: dict[str, int] = {}
        self.of = np.full(shards, -1, dtype=np.int32)
        for s, w in (known or {}).items():
            self.of[s] = self.wid(w)

    def wid(self, worker: str) -> int:
        """``worker``'s index in ``names`` (added if new)."""
        i = self._ids.get(worker)
        if i is None:
            i = self._ids[worker] = len(self.names)
            self.names.append(worker)
        return i

    def record(self, shards: list[int], worker: str) -> None:
        """``worker`` produced ``shards``."""
        if shards:
            self.of[np.asarray(shards, dtype=np.int64)] = self.wid(worker)

    def among(self, shards: Iterable[int]) -> dict[int, str]:
        """Shard -> producer, for those of ``shards`` whose producer is known (ascending)."""
        return {int(s): self.names[self.of[s]] for s in sorted(shards) if self.of[s] >= 0}

    def ids(self, workers: Iterable[str]) -> list[int]:
        """The indices of those of ``workers`` that produced anything."""
        return [self._ids[w] for w in workers if w in self._ids]

    def shards_of(self, workers: Iterable[str]) -> list[int]:
        """Every shard one of ``workers`` produced (ascending)."""
        return [int(s) for s in np.flatnonzero(np.isin(self.of, self.ids(workers)))]


class Checks:
    """The checks of one execution: submitted, moved when late, gathered and judged.

    ``emit(kind, **data)`` sends a run event.

    >>> from distributed import Client, LocalCluster
    >>> from dask_research.montecarlo import Job, Normal
    >>> job = Job(lambda a: a, {"a": Normal(0.0, 1.0)}, shards=4, samples_per_shard=64, seed=1, range=(-8, 8))
    >>> reducer = job.make_reducer(job.range)
    >>> with LocalCluster(n_workers=1, processes=False, dashboard_address=None) as cluster, \\
    ...         Client(cluster, set_as_default=False) as client:
    ...     checks = Checks(client, job, reducer, run_id=job.id, tag="t", emit=print, limits=Limits(block=1),
    ...                     poll=0.2)
    ...     checks.submit(2, "tcp://the-producer")
    ...     (state, where), = checks.gather().values()
    True
    >>> state == compute_shard(job, 2, reducer=reducer), where == checks.checks[2][0]["verifier"]
    (True, True)
    """

    def __init__(self, client: Any, job: Any, reducer: Any, *, run_id: str, tag: str, emit: Any,
                 limits: Limits, poll: float):
        self.client, self.job, self.reducer = client, job, reducer
        self.run_id, self.tag, self.emit, self.limits, self.poll = run_id, tag, emit, limits, poll
        self.arrivals = Arrivals(client, bound=limits.gather_bound)
        self.checks: dict[int, tuple[dict, Any]] = {}     # shard -> (its record, its current future)
        self._alive_read: tuple[float, set[str]] | None = None   # (when, the workers then): submit(), gather()
        self.attempts: dict[int, list] = {}               # shard -> [(future, target, submitted)]

    def futures(self) -> list:
        """Every check future (to cancel them)."""
        return ([f for _, f in self.checks.values() if f is not None]
                + [f for a in self.attempts.values() for f, _, _ in a])

    def submit(self, s: int, producer: str, exclude: set[str] | frozenset = frozenset()) -> bool:
        """Recompute shard ``s`` on a worker other than its producer (a distinct key).

        ``exclude``: workers already tried for this check. ``False`` if no worker is left.
        """
        if s in self.checks and not exclude:
            return True
        # A first attempt goes to a worker the scheduler listed within the last second (one
        # round trip for the run's checks, not one each: if that worker has left since, gather()
        # moves the check); a moved check asks which workers answer now.
        alive = [w for w in (responsive_workers(self.client) if exclude else sorted(self._alive(time.monotonic())))
                 if w not in exclude]
        if not alive:
            return False
        others = [w for w in alive if w != producer] or alive
        target = others[len(self.checks) % len(others)]
        attempts = self.attempts.setdefault(s, [])
        # A strict restriction: Dask's work stealing moves a loosely restricted task to any idle
        # worker, the producer included (on a busy machine it did, and the check proved nothing).
        # If the target leaves, gather() moves the check to another worker.
        fut = self.client.submit(verify_shard, self.job, self.reducer, s, pure=False,
                                 key=verify_key(self.tag, s, attempt=len(attempts)),
                                 workers=[target], allow_other_workers=False)
        self.arrivals.track([fut])
        attempts.append((fut, target, time.monotonic()))
        if s in self.checks:
            self.checks[s][0].setdefault("moved_from", []).append(self.checks[s][0]["verifier"])
            self.checks[s][0]["verifier"] = target
            self.checks[s] = (self.checks[s][0], fut)
        else:
            self.checks[s] = ({"shard": s, "producer": producer, "verifier": target}, fut)
        return True

    def gather(self, ready: Mapping[int, tuple[Any, str]] | None = None) -> dict[int, tuple[Any, str]]:
        """Each check's (state, worker that ran it); a check late or failing moves elsewhere.

        A check counts as late when it has not finished ``check_limit()`` seconds after it was
        submitted or after verification began waiting, whichever is later (a check submitted
        early may legitimately wait behind the run's blocks). A late check is submitted again on
        a worker not yet tried; the first attempt to finish wins. With no worker left, the
        client recomputes the shard itself. A check with an attempt that finished is not taken
        for gone while that result is fetched (a moved check's first attempt, pinned to a worker
        that left, stays pending for ever: it must not make the one that ran look lost); it can
        still be late, and a fetch that outlives its bound (a frozen holder) lets it move too.
        ``ready``: checks whose results are in already (they rode in a block).
        """
        results: dict[int, tuple[Any, str]] = dict(ready or {})
        began = time.monotonic()
        while True:
            open_ = [s for s in self.checks if s not in results]
            if not open_:
                return results
            owner = {f: s for s in open_ for f, _, _ in self.attempts[s] if f.status in ("pending", "finished")}
            done, values = self.arrivals.collect_sync(owner, self.poll) if owner else ([], {})
            raise_if_cancelled(self.client, self.run_id, done)
            for f, value in values.items():
                s = owner[f]
                if s not in results:
                    results[s] = value
                    self.checks[s][0]["verifier"] = value[1]
                    stale = [g for g, _, _ in self.attempts[s] if g is not f]
                    if stale:
                        self.client.cancel(stale)
            now = time.monotonic()
            limit = self.limits.check_limit()
            for s in open_:
                if s in results:
                    continue
                attempts = self.attempts[s]
                fut, target, submitted = attempts[-1]
                errored = [g for g, _, _ in attempts if g.status == "error"]
                late = limit is not None and now - max(submitted, began) > limit
                gone = False
                if not late and len(errored) < len(attempts):
                    if not all(self.arrivals.outstanding(g) for g, _, _ in attempts):
                        continue    # it ran: its result is on its way (lateness still applies)
                    waiting = [t for g, t, _ in attempts if g.status == "pending"]
                    alive = self._alive(now) if waiting else set()
                    gone = bool(waiting) and all(t not in alive for t in waiting)
                    if not gone:
                        continue
                tried = {t for _, t, _ in attempts}
                record = self.checks[s][0]
                reason = ("failed" if errored and len(errored) == len(attempts) else
                          "its worker left" if gone else f"late ({now - max(submitted, began):.1f} s)")
                self.emit("check-moved", shard=s, worker=target, reason=reason)
                if not self.submit(s, record["producer"], exclude=tried):
                    # Every worker was tried: the client recomputes the shard itself.
                    record.setdefault("moved_from", []).append(record["verifier"])
                    results[s] = (compute_shard(self.job, s, reducer=self.reducer), "client")
                    self.checks[s][0]["verifier"] = "client"
                    self.client.cancel([g for g, _, _ in attempts])

    def _alive(self, now: float) -> set[str]:
        """The workers the scheduler lists, asked at most once a second (a scheduler round trip
        whose answer grows with the cluster; the gather loop turns every ``poll``)."""
        if self._alive_read is None or now - self._alive_read[0] >= 1.0:
            self._alive_read = (now, set(alive_workers(self.client)))
        return self._alive_read[1]

    def verify(self, kept: Mapping[int, Any], producers: Producers, first_of_worker: Mapping[str, int],
               reused_picks: list[int], k: int, reused: set[int],
               rode: Mapping[int, tuple[Any, str]] | None = None) -> tuple[dict, set[str], set[int]]:
        """Check ``k`` hashed shards, one per producer and the ``reused_picks``; judge every check.

        ``kept`` holds the states the run kept for verification, ``reused`` the shards reused
        from the store, ``rode`` the checks that rode in a block on a one-worker cluster
        (shard -> (state, worker)): such a check counts as done unless it ran on its shard's
        producer while another worker is alive, which then checks it as a task of its own.
        Returns the verification record, the faulty workers and the reused shards whose stored
        state is faulty.
        """
        produced = producers.among(kept)
        picks = [s for s in choose_shards(self.run_id, self.job.shards, produced, k) if s in kept]
        picks += [s for s in reused_picks if s in kept and s not in picks]
        for w, s in first_of_worker.items():  # every producer covered, even outside the candidates
            if w not in {produced.get(p) for p in picks}:
                picks.append(s)
        ready: dict[int, tuple[Any, str]] = {}
        for s in picks:
            producer = produced.get(s, "?")
            ride = (rode or {}).get(s)
            if ride is not None and s not in self.checks and (
                    ride[1] != producer or not self._alive(time.monotonic()) - {producer}):
                self.checks[s] = ({"shard": s, "producer": producer, "verifier": ride[1], "in_block": True}, None)
                ready[s] = ride
            else:
                self.submit(s, producer)
        gathered = self.gather(ready)
        checks = [c for c, _ in self.checks.values()]
        bad: set[str] = set()
        bad_stored: set[int] = set()
        mismatches = []
        for check in checks:
            s = check["shard"]
            state, where = gathered[s]
            check["verifier"] = where
            check["same_worker"] = where == check["producer"]
            check["elsewhere"] = not check["same_worker"]
            diff = states_match(kept[s], state)
            check["match"] = diff is None
            if diff is None:
                continue
            referee = compute_shard(self.job, s, reducer=self.reducer)   # the client decides
            producer_ok = states_match(kept[s], referee) is None
            verifier_ok = states_match(state, referee) is None
            culprit = []
            if not producer_ok:
                if s in reused:          # the stored file is at fault, not the worker it names
                    bad_stored.add(s)
                    culprit.append(f"the stored shard file (producer {check['producer']})")
                else:
                    bad.add(check["producer"])
                    culprit.append(check["producer"])
            if not verifier_ok:
                bad.add(where)
                culprit.append(where)
            mismatches.append({"shard": s, "difference": diff, "faulty": culprit})
        elsewhere = sum(1 for c in checks if c["elsewhere"])
        record = {"tolerance": TOLERANCE, "checked": checks, "mismatches": mismatches,
                  "quarantined_workers": sorted(bad), "recomputed_shards": 0,
                  "checks": len(checks), "checks_elsewhere": elsewhere,
                  "elsewhere": f"{elsewhere} of {len(checks)}",
                  "moved": sum(1 for c in checks if c.get("moved_from")),
                  "reused_checked": [int(s) for s in reused_picks]}
        for c in checks:
            self.emit("check", shard=c["shard"], producer=c["producer"], verifier=c["verifier"], match=c["match"])
        return record, bad, bad_stored
