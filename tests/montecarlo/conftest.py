import numpy as np
import pytest
from distributed.utils_test import cleanup, client, cluster_fixture, loop, loop_in_thread  # noqa: F401

from dask_research import montecarlo as mc

MU = [1.0, 2.0, 0.5, 3.0, 0.8, 0.2, 0.0]
SD = [0.1, 0.3, 0.05, 0.4, 0.1, 0.3, 1.0]


def saturating(a, b, c, d, e, f, g):
    """The 7-input saturating pipeline of the benchmarks."""
    t1 = a * b / (c + 1)
    t3 = np.tanh(1.5 * t1)
    return (t3 + 0.1 * np.log1p(np.abs(d)) * e) / (1 + np.exp(-f)) + 0.01 * g


@pytest.fixture
def small_job():
    return mc.Job(saturating, {n: mc.Normal(m, s) for n, m, s in zip("abcdefg", MU, SD)},
                  shards=24, samples_per_shard=2048, seed=2026, bins=64)
