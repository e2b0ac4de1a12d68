"""A batch of hypotheses that would not fit the declared memory is refused up front.

Examples
--------
>>> import numpy as np
>>> payload_bytes({"lr": 0.1, "weights": np.zeros(1000)}) >= 8000
True
"""
from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

from dask.utils import parse_bytes

from .. import config
from ..exceptions import CapacityError

__all__ = ["payload_bytes", "check_batch_memory"]


def payload_bytes(obj: Any, _depth: int = 0) -> int:
    """An estimate of the memory a payload holds (arrays by ``nbytes``, containers recursively)."""
    if _depth > 32:
        return 64
    nbytes = getattr(obj, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes + 112
    if isinstance(obj, dict):
        return 64 + sum(payload_bytes(k, _depth + 1) + payload_bytes(v, _depth + 1) for k, v in obj.items())
    if isinstance(obj, (list, tuple, set, frozenset)):
        return 56 + sum(payload_bytes(v, _depth + 1) for v in obj)
    return sys.getsizeof(obj, 64)


def check_batch_memory(hypotheses: Iterable[Any], limit: Any = None) -> int:
    """Raise :class:`CapacityError` if the batch's payloads exceed ``research.experiments.max-batch-bytes``."""
    limit = config.resolve("experiments.max-batch-bytes", limit)
    if limit is None:
        return 0
    limit = parse_bytes(limit) if isinstance(limit, str) else int(limit)
    hyps = list(hypotheses)
    needed = sum(200 + payload_bytes(getattr(h, "payload", None)) + payload_bytes(getattr(h, "features", None))
                 for h in hyps)
    if needed > limit:
        raise CapacityError(f"queueing {len(hyps):,} hypotheses (research.experiments.max-batch-bytes)",
                            needed, limit)
    return needed
