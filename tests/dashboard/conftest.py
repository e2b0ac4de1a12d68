import pytest
from distributed import Client, LocalCluster
from distributed.utils_test import cleanup, loop, loop_in_thread  # noqa: F401


@pytest.fixture
def small_cluster(loop):
    """One in-process worker with three threads, no dashboard: (cluster, client)."""
    with LocalCluster(loop=loop, n_workers=1, threads_per_worker=3, processes=False,
                      dashboard_address=None) as cl, Client(cl, set_as_default=False) as c:
        yield cl, c
