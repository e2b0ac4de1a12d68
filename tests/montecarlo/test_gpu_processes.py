"""GPU placement with real processes: `dask worker --resources GPU=1` takes the device shards."""
import os
import subprocess
import sys

import numpy as np
import pytest
from distributed import Client

from dask_research import montecarlo as mc
from dask_research.montecarlo.gpu import (
    compute_block_portable,
    recompute_shard,
    states_match,
    submit_kwargs,
    tolerance_of,
)
from dask_research.montecarlo.tree import tree_fold
from dask_research.testing.processes import wait_for


@pytest.fixture
def gpu_and_cpu_workers(tmp_path):
    """A `dask scheduler`, a worker advertising ``GPU=1`` and a plain one (real processes)."""
    sfile = tmp_path / "scheduler.json"
    env = dict(os.environ)                      # PYTHONPATH and all: the workers import this copy
    procs = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host",
                               "127.0.0.1", "--port", "0", "--no-dashboard", "--scheduler-file",
                               str(sfile)], env=env, stdout=subprocess.DEVNULL,
                              stderr=open(tmp_path / "scheduler.log", "w"))]
    try:
        wait_for(sfile.exists, 30, "the scheduler file")
        for name, extra in (("gpu", ["--resources", "GPU=1"]), ("cpu", [])):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file", str(sfile),
                 "--nthreads", "1", "--no-nanny", "--no-dashboard", "--name", name, *extra],
                env=env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"{name}.log", "w")))
        with Client(scheduler_file=str(sfile), set_as_default=False) as client:
            client.wait_for_workers(2, timeout=60)
            names = {w["name"]: a for a, w in client.scheduler_info()["workers"].items()}
            yield client, names
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)


@pytest.mark.timeout(180, method="thread")
def test_device_shards_go_to_the_gpu_worker_and_verify_on_the_cpu_worker(gpu_and_cpu_workers):
    client, names = gpu_and_cpu_workers

    def pipeline(a, b, xp):                     # a local function travels by value
        return xp.tanh(a * b) + 0.1 * b

    job = mc.Job(pipeline, {"a": mc.Normal(1.0, 0.2), "b": mc.LogNormal(0.0, 0.3)}, shards=9,
                 samples_per_shard=4096, seed=19, bins=32, range=(-1.0, 3.0), device="gpu")
    red = job.make_reducer()
    # xp=numpy stands in for CuPy: this worker advertises a GPU it does not have
    futs = [client.submit(compute_block_portable, job, red, a, a + 3, xp=np, pure=False,
                          **submit_kwargs(job)) for a in range(0, 9, 3)]
    blocks = client.gather(futs)
    assert {b.worker for b in blocks} == {names["gpu"]}
    states = {s: st for b in blocks for s, st in b.shard_states.items()}
    checks = client.gather([client.submit(recompute_shard, job, s, red, pure=False,
                                          workers=[names["cpu"]], allow_other_workers=False)
                            for s in range(9)])
    for s, chk in enumerate(checks):
        assert states_match(states[s], chk, tolerance_of(job)) is None, s
    assert tree_fold(red.merge, [states[s] for s in range(9)]) == tree_fold(red.merge, checks)
