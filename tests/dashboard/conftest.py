import pytest
from distributed import Client, LocalCluster
from distributed.utils_test import cleanup, loop, loop_in_thread  # noqa: F401


@pytest.fixture
def small_cluster(loop):
    """One in-process worker with three threads, no dashboard: (cluster, client)."""
    with LocalCluster(loop=loop, n_workers=1, threads_per_worker=3, processes=False,
                      dashboard_address=None) as cl, Client(cl, set_as_default=False) as c:
        yield cl, c


@pytest.fixture
def dashboard_cluster(loop):
    """Two in-process one-thread workers, the research pages installed and a dashboard on a free
    port: (cluster, client)."""
    import dask_research.dashboard  # noqa: F401

    with LocalCluster(loop=loop, n_workers=2, threads_per_worker=1, processes=False,
                      dashboard_address=":0") as cl, Client(cl, set_as_default=False) as c:
        yield cl, c
