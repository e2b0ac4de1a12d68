"""Where a run's verification checks go (issue 28, throughput at a moderate job).

A check recomputes one shard. Submitted as soon as its shard existed (the first blocks), a check
ran ahead of every block the scheduler still queued, so each pushed the run's last blocks back by
its time. The engine now submits the early checks once no block of the run waits for a thread:
they fill the threads that the last blocks leave idle. What is asserted is the order of the run's
own tasks (when each started computing, from Dask's task stream), never a duration; the bits are
those of a run without checks.
"""
from __future__ import annotations

import functools

import pytest
from distributed import Client, LocalCluster, get_task_stream

from dask_research import montecarlo as mc
from dask_research.testing.pipelines import slow_tanh
from dask_research.testing.processes import process_cluster

from .conftest import MU, SD, saturating


def _starts(stream: list[dict], prefix: str) -> list[float]:
    """When each task of ``stream`` whose key starts with ``prefix`` began computing."""
    return [s["start"] for t in stream if str(t["key"]).startswith(prefix)
            for s in t["startstops"] if s["action"] == "compute"]


def _run_and_order(client, job, **settings):
    with get_task_stream(client) as ts:
        result = mc.run(job, client=client, progress=False, **settings)
    return result, _starts(ts.data, "mc-block-"), _starts(ts.data, "mc-verify-")


@pytest.mark.timeout(180, method="thread")
def test_checks_start_after_every_block_started_on_the_embedded_shape(loop):
    """One worker with two threads (the cluster ``mc.run(job)`` starts): 16 blocks, 4 checks."""
    job = mc.Job(saturating, {n: mc.Normal(m, s) for n, m, s in zip("abcdefg", MU, SD)}, shards=64,
                 samples_per_shard=4096, seed=2026, bins=64)
    with LocalCluster(loop=loop, n_workers=1, threads_per_worker=2, processes=False,
                      dashboard_address=None) as cluster, Client(cluster, set_as_default=False) as client:
        result, blocks, checks = _run_and_order(client, job, shards_per_task=4, verify=4)
        bare = mc.run(job, client=client, shards_per_task=16, verify=0, speculate=0, progress=False)
    assert len(blocks) == 16 and len(checks) == result.verification["checks"] >= 4
    assert min(checks) >= max(blocks), "a check ran while a block of the run still waited for a thread"
    assert result.verification["mismatches"] == [] and result.state == bare.state


@pytest.mark.timeout(240, method="thread")
def test_checks_start_after_every_block_started_on_a_real_worker_process(tmp_path):
    """The same on a real ``dask scheduler`` and one ``dask worker --nthreads 2`` process."""
    job = mc.Job(functools.partial(slow_tanh, delay=0.01), {"a": mc.Normal(1, 0.1), "b": mc.Normal(2, 0.2)},
                 shards=48, samples_per_shard=1024, seed=28, bins=32, range=(0.0, 1.0))
    with process_cluster(tmp_path, 1, nthreads=2) as cluster:
        result, blocks, checks = _run_and_order(cluster.client, job, shards_per_task=4, verify=4)
    assert len(blocks) == 12 and len(checks) == result.verification["checks"] >= 4
    assert min(checks) >= max(blocks), "a check ran while a block of the run still waited for a thread"
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cl, \
            Client(cl, set_as_default=False) as c:
        assert mc.run(job, client=c, verify=0, progress=False).state == result.state
