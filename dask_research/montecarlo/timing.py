"""How long a run's blocks and checks may take: the settings, the pilot's figure, what blocks took.

``research.montecarlo.block-timeout`` and ``check-timeout`` are ``None`` (no limit), ``"auto"``
(a multiple, ``timeout-factor``, of the expected time, never below ``block-timeout-min`` /
``check-timeout-min``) or seconds (the run's :class:`~.run_settings.RunSettings` checked them).
The expected time per shard is the larger of the pilot's and the median finished block's.

>>> limits = Limits(block=4)
>>> limits.block_limit() is None            # auto, and nothing known yet: no limit
True
>>> limits.shard_times.append(0.001)
>>> limits.block_limit()                    # fast blocks: the floor
60.0
"""
from __future__ import annotations

import bisect
from collections.abc import Iterable

from .run_settings import RunSettings

__all__ = ["Limits", "RunningMedian"]


class RunningMedian:
    """The median of a growing collection of numbers, kept sorted as they arrive.

    The driver reads the median of what finished blocks took at every turn; sorting every
    finished block's figure each time cost the client a sort per turn, growing with the run.

    >>> m = RunningMedian()
    >>> m.median() is None
    True
    >>> m.extend([3.0, 1.0, 2.0, 10.0])
    >>> m.median(), len(m)                  # statistics.median's value: the mean of the middle two
    (2.5, 4)
    """

    def __init__(self) -> None:
        self.sorted: list[float] = []

    def append(self, value: float) -> None:
        """Add one number."""
        bisect.insort(self.sorted, value)

    def extend(self, values: Iterable[float]) -> None:
        """Add numbers."""
        for v in values:
            self.append(v)

    def __len__(self) -> int:
        return len(self.sorted)

    def median(self) -> float | None:
        """The median (``None`` if empty), as :func:`statistics.median` computes it."""
        n = len(self.sorted)
        if not n:
            return None
        mid = n // 2
        return self.sorted[mid] if n % 2 else (self.sorted[mid - 1] + self.sorted[mid]) / 2


class Limits:
    """A run's time limits, from its settings, the pilot's seconds per shard and the finished blocks.

    ``shard_times`` holds the seconds per computed shard of every finished block (the driver
    appends to it). ``settings``: the run's (default: :meth:`RunSettings.parse`, from the config).

    >>> Limits(block=4, shard_seconds=2.0).block_limit()   # 20 x 2 s x 4 shards
    160.0
    >>> Limits(block=4, settings=RunSettings.parse(block_timeout="90s")).block_limit()
    90.0
    """

    def __init__(self, block: int, shard_seconds: float | None = None, settings: RunSettings | None = None):
        s = settings if settings is not None else RunSettings.parse()
        self.block = block
        self.pilot_shard_seconds = float(shard_seconds) if shard_seconds else None
        self.shard_times = RunningMedian()
        self.block_timeout = s.block_timeout
        self.check_timeout = s.check_timeout
        self.factor = s.timeout_factor
        self.block_floor = s.block_timeout_min
        self.check_floor = s.check_timeout_min

    def expected_shard_seconds(self) -> float | None:
        """Seconds one shard is expected to take: the pilot's, or the median finished block's."""
        seen = self.shard_times.median()
        known = [t for t in (self.pilot_shard_seconds, seen) if t]
        return max(known) if known else None

    def block_limit(self) -> float | None:
        """Seconds a block may run before the run fails (``research.montecarlo.block-timeout``).

        ``auto`` with nothing to expect yet (no pilot timing passed, no block finished) is no
        limit: a run must not fail a block that is merely the first of a slow job.
        """
        if self.block_timeout != "auto":
            return self.block_timeout  # type: ignore[return-value]
        per_shard = self.expected_shard_seconds()
        if per_shard is None:
            return None
        return max(self.block_floor, self.factor * per_shard * self.block)

    def check_limit(self) -> float | None:
        """Seconds a check may take before it moves to another worker.

        >>> Limits(block=4).check_limit()             # the floor, check-timeout-min
        5.0
        """
        if self.check_timeout != "auto":
            return self.check_timeout  # type: ignore[return-value]
        per_shard = self.expected_shard_seconds() or 0.0
        return max(self.check_floor, self.factor * per_shard)

    def gather_bound(self) -> float:
        """Seconds a gather of finished results may take before it is retried later.

        >>> Limits(block=4).gather_bound()
        5.0
        """
        return self.check_limit() or 30.0

    def expected_text(self) -> str:
        """What a block is expected to take, for messages.

        >>> Limits(block=4, shard_seconds=0.5).expected_text()
        '2 s per block of 4'
        """
        per = self.expected_shard_seconds()
        return "unknown (no block finished yet, no pilot timing)" if per is None else \
            f"{per * self.block:.3g} s per block of {self.block}"
