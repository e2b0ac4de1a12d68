"""Paired statistics of two search methods over the same seeds (``bench_search.py``).

A method's figure is its mean best score over seeds; against a peer on the same seeds the
honest summary is the paired difference: its mean, a seeded bootstrap 95 % interval, the seed
counts better / tied / worse, and an exact two-sided sign test over the untied seeds.

>>> s = paired([0.9, 0.8, 0.7, 0.95], [0.85, 0.8, 0.75, 0.9])
>>> s["better_tied_worse"], round(s["mean_diff"], 4)
([2, 1, 1], 0.0125)
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["paired", "sign_test"]


def sign_test(better: int, worse: int) -> float:
    """Exact two-sided sign-test p-value of ``better`` against ``worse`` untied seeds.

    >>> round(sign_test(8, 2), 4)
    0.1094
    """
    n = better + worse
    if n == 0:
        return 1.0
    k = min(better, worse)
    tail = sum(math.comb(n, j) for j in range(k + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def paired(ours: Sequence[float], peer: Sequence[float], resamples: int = 10_000,
           seed: int = 0) -> dict[str, Any]:
    """Paired comparison of ``ours`` against ``peer`` (same seeds, same order)."""
    a, b = np.asarray(ours, float), np.asarray(peer, float)
    d = a - b
    rng = np.random.default_rng(seed)
    boot = d[rng.integers(len(d), size=(resamples, len(d)))].mean(axis=1)
    better, tied, worse = int((d > 0).sum()), int((d == 0).sum()), int((d < 0).sum())
    return {"mean": float(a.mean()), "peer_mean": float(b.mean()), "mean_diff": float(d.mean()),
            "ci95": [float(np.quantile(boot, 0.025)), float(np.quantile(boot, 0.975))],
            "better_tied_worse": [better, tied, worse], "sign_p": sign_test(better, worse)}
