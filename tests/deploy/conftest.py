"""Real ``dask scheduler`` / ``dask worker`` processes for the deployment tests."""
from __future__ import annotations

import os

import pytest

from dask_research.testing.processes import process_cluster

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def dask_processes(tmp_path_factory):
    """A scheduler and two one-thread workers as separate processes, started in an empty
    directory of their own: they cannot see a job file through their working directory or
    ``sys.path``. Yields the scheduler's address; every process is stopped by its pid."""
    where = tmp_path_factory.mktemp("cluster-cwd")
    with process_cluster(where, 2, cwd=where) as cluster:
        cwds = cluster.client.run(os.getcwd)
        assert set(cwds.values()) == {str(where)}
        yield cluster.client.scheduler.address


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A single-node SLURM of this machine (skips, saying why, where it cannot run)."""
    from dask_research.testing.slurm import slurm_fixture

    yield from slurm_fixture(tmp_path_factory)
