"""A worker on a slow, lossy link for a whole run (issue 28): 200 ms round trip, 5 % loss.

This machine's kernel has no ``sch_netem``, so ``tc netem`` cannot slow a link; the worker is put
behind :mod:`dask_research.testing.latency` instead, a proxy process on each of its two
addresses (the scheduler's, which it dials, and its own, which the scheduler, the client and the
other worker dial): 100 ms each way, and one chunk in twenty held back a retransmission timeout
(head-of-line blocking, as TCP loss looks to Dask). The run must give the clean run's bits,
store every shard once, and use the slow worker (it is slow, not gone).
"""
from __future__ import annotations

import pytest
from distributed import Client, LocalCluster

from dask_research import montecarlo as mc
from dask_research.testing.latency import slow_link_cluster
from dask_research.testing.pipelines import slow_tanh

ONE_WAY, LOSS = 0.1, 0.05


@pytest.mark.slow
@pytest.mark.timeout(300, method="thread")
def test_a_worker_with_200_ms_round_trips_and_5_percent_loss_changes_no_bit(tmp_path):
    import functools

    job = mc.Job(functools.partial(slow_tanh, delay=0.002), {"a": mc.Normal(1, 0.1), "b": mc.Normal(2, 0.2)},
                 shards=512, samples_per_shard=256, seed=31, bins=32, range=(0.0, 1.0))
    store = tmp_path / "store"
    with slow_link_cluster(tmp_path, ONE_WAY, LOSS) as (cluster, slow):
        assert slow in cluster.client.scheduler_info()["workers"]
        result = mc.run(job, client=cluster.client, store=str(store), verify=4, progress=False)
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cl, \
            Client(cl, set_as_default=False) as c:
        clean = mc.run(job, client=c, verify=0, progress=False)
    assert result.state == clean.state
    assert result.verification["mismatches"] == []
    assert result.workers.get(slow, 0) > 0, result.workers
    assert sorted(mc.RunStore(str(store)).read_shards(job.id)) == list(range(512))
    leftovers = [p for p in store.rglob("*") if p.is_file() and (p.name.startswith(".") or p.suffix == ".tmp")
                 and p.name not in (".reason.json",)]
    assert not leftovers, leftovers
