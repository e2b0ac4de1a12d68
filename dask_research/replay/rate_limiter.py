"""Samples-per-insert rate limiting, after Reverb's ``SampleToInsertRatio``.

The limiter keeps ``diff = inserts * samples_per_insert - samples`` (counted in transitions)
inside ``[min_diff, max_diff]`` where ``min_diff = samples_per_insert * min_size_to_sample -
tolerance`` and ``max_diff = samples_per_insert * min_size_to_sample + tolerance``:

- an insert waits while ``diff > max_diff`` (the learner is behind: it must sample first);
- a sample waits while fewer than ``min_size_to_sample`` transitions were inserted or
  ``diff < min_diff`` (the actors are behind: they must insert first).

Both checks are made before the call, so a call may overshoot the band by its own size and the
two sides can never deadlock. A wait longer than ``timeout`` raises
:class:`~dask_research.exceptions.RateLimitTimeout` naming the blocked side and the counts.

Examples
--------
>>> from dask_research.replay import RateLimiter
>>> rl = RateLimiter(samples_per_insert=2.0, tolerance=4, min_size_to_sample=5, timeout=0.01)
>>> rl.min_diff, rl.max_diff
(6.0, 14.0)
>>> rl.await_insert(5); rl.inserted(5)      # diff = 5 * 2 - 0 = 10
>>> rl.await_sample(8); rl.sampled(8)       # allowed (10 >= 6); diff = 2
>>> rl.await_sample(8)                      # doctest: +IGNORE_EXCEPTION_DETAIL
Traceback (most recent call last):
dask_research.exceptions.RateLimitTimeout: sample blocked for 0.01 s waiting for inserting: ...
"""
from __future__ import annotations

import threading
import time
from typing import Any

from .. import config
from ..exceptions import InputError, RateLimitTimeout


class RateLimiter:
    """Keep sampling and inserting at ``samples_per_insert`` within ``tolerance`` samples.

    Parameters
    ----------
    samples_per_insert : float
        Target number of sampled transitions per inserted transition (e.g. 8 for a learner
        that replays each transition 8 times on average).
    tolerance : float
        Half-width of the allowed band of ``diff``, in sampled transitions. Make it larger than
        a batch on each side (``>= max(batch_size, samples_per_insert * insert_batch)``).
    min_size_to_sample : int
        Inserted transitions before the first sample.
    timeout : float, optional
        Seconds a call may wait; default ``research.replay.rate-timeout``.
    """

    def __init__(self, samples_per_insert: float, tolerance: float, min_size_to_sample: int = 1,
                 timeout: float | None = None):
        if not samples_per_insert > 0:
            raise InputError("samples_per_insert", samples_per_insert, "a positive number",
                             where="RateLimiter")
        if not tolerance >= 0:
            raise InputError("tolerance", tolerance, "a number >= 0", where="RateLimiter")
        if int(min_size_to_sample) < 1:
            raise InputError("min_size_to_sample", min_size_to_sample, "an integer >= 1",
                             where="RateLimiter")
        self.samples_per_insert = float(samples_per_insert)
        self.tolerance = float(tolerance)
        self.min_size_to_sample = int(min_size_to_sample)
        self.timeout = float(config.resolve("replay.rate-timeout", timeout))
        if not self.timeout > 0:
            raise InputError("timeout", timeout, "a number of seconds > 0", where="RateLimiter")
        centre = self.samples_per_insert * self.min_size_to_sample
        self.min_diff = centre - self.tolerance
        self.max_diff = centre + self.tolerance
        self.inserts = 0
        self.samples = 0
        self._cond = threading.Condition()
        self.waited = {"insert": 0.0, "sample": 0.0}

    @property
    def diff(self) -> float:
        return self.inserts * self.samples_per_insert - self.samples

    def can_insert(self) -> bool:
        return self.diff <= self.max_diff

    def can_sample(self) -> bool:
        return self.inserts >= self.min_size_to_sample and self.diff >= self.min_diff

    def _wait(self, side: str, ok, timeout: float | None) -> None:
        timeout = self.timeout if timeout is None else float(timeout)
        with self._cond:
            if ok():
                return
            t0 = time.perf_counter()
            done = self._cond.wait_for(ok, timeout)
            self.waited[side] += time.perf_counter() - t0
            if not done:
                raise RateLimitTimeout(side, self.inserts, self.samples, self.samples_per_insert,
                                       timeout)

    def await_insert(self, n: int = 1, timeout: float | None = None) -> None:
        """Block until inserting is allowed (the learner has sampled enough)."""
        self._wait("insert", self.can_insert, timeout)

    def await_sample(self, n: int = 1, timeout: float | None = None) -> None:
        """Block until sampling is allowed (the actors have inserted enough)."""
        self._wait("sample", self.can_sample, timeout)

    def inserted(self, n: int) -> None:
        with self._cond:
            self.inserts += int(n)
            self._cond.notify_all()

    def sampled(self, n: int) -> None:
        with self._cond:
            self.samples += int(n)
            self._cond.notify_all()

    def stats(self) -> dict[str, float]:
        """The ``rate_limiter`` entry of ``plane.stats()``: counts, ``diff`` and the seconds
        inserts and samples waited."""
        return {"inserts": self.inserts, "samples": self.samples, "diff": self.diff,
                "waited_insert_s": self.waited["insert"], "waited_sample_s": self.waited["sample"]}

    def state_dict(self) -> dict[str, Any]:
        return {"samples_per_insert": self.samples_per_insert, "tolerance": self.tolerance,
                "min_size_to_sample": self.min_size_to_sample, "timeout": self.timeout,
                "inserts": self.inserts, "samples": self.samples}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self._cond:
            self.inserts = int(state["inserts"])
            self.samples = int(state["samples"])
            self._cond.notify_all()

    def __repr__(self) -> str:
        return (f"RateLimiter(samples_per_insert={self.samples_per_insert:g}, "
                f"tolerance={self.tolerance:g}, min_size_to_sample={self.min_size_to_sample}, "
                f"inserts={self.inserts}, samples={self.samples})")
