"""The embedded cluster: its Dask settings, and reading the worker table without a race."""
import dask
import pytest
from distributed import Client, LocalCluster
from distributed.utils_test import cleanup, loop, loop_in_thread  # noqa: F401

from dask_research._cluster import embedded_dask_config, get_client, workers_info
from dask_research.exceptions import ConfigError


def test_settings_are_flattened_from_nested_or_dotted_keys():
    assert embedded_dask_config() == {"distributed.worker.profile.interval": "100ms",
                                      "distributed.worker.memory.monitor-interval": "500ms",
                                      "distributed.admin.tick.interval": "100ms"}
    with dask.config.set({"research.cluster.distributed.worker.profile.interval": "10ms"}):
        assert embedded_dask_config()["distributed.worker.profile.interval"] == "10ms"
    with dask.config.set({"research.cluster.distributed": {"scheduler.work-stealing": False}}):
        assert embedded_dask_config() == {"distributed.scheduler.work-stealing": False}
    for empty in ({}, None):
        with dask.config.set({"research.cluster.distributed": empty}):
            assert embedded_dask_config() == {}


def test_bad_settings_are_refused_naming_the_key():
    with dask.config.set({"research.cluster.distributed": {"worker": {"profile": {"intervall": "1s"}}}}):
        with pytest.raises(ConfigError, match=r"research.cluster.distributed.worker.profile.intervall='1s' "
                                              r"is invalid; expected a setting Dask has"):
            embedded_dask_config()
    with dask.config.set({"research.cluster.distributed": "fast"}):
        with pytest.raises(ConfigError, match=r"research.cluster.distributed='fast' is invalid; expected a mapping"):
            embedded_dask_config()


def test_the_embedded_cluster_runs_with_them_and_puts_dask_back():
    before = dask.config.get("distributed.worker.profile.interval")
    # This test needs the profiler, which tests/conftest.py turns off for every other test.
    with dask.config.set({"research.cluster.dashboard-address": None,
                          "distributed.worker.profile.enabled": True}), get_client(None) as c:
        periods = c.run(lambda dask_worker: {k: dask_worker.periodic_callbacks[k].callback_time
                                             for k in ("profile", "memory_monitor")})
        assert list(periods.values()) == [{"profile": 100, "memory_monitor": 500}]
        assert c.run_on_scheduler(lambda dask_scheduler: dask_scheduler._tick_interval) == 0.1
    assert dask.config.get("distributed.worker.profile.interval") == before == "10ms"


def test_workers_info_asks_the_scheduler_itself(loop):
    with LocalCluster(loop=loop, n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cl, \
            Client(cl, set_as_default=False) as c:
        # The client's periodic refresh stores an identity without the worker table; a read of
        # the cache right after it sees no workers. workers_info neither reads nor writes it.
        c.sync(c._update_scheduler_info, n_workers=0)
        assert c._scheduler_identity["workers"] == {}
        assert sorted(workers_info(c)) == sorted(cl.scheduler.workers)
        assert c._scheduler_identity["workers"] == {}


def _fails_on_workers(a):
    from distributed import get_worker

    try:
        get_worker()
    except ValueError:
        return a            # the pilot, on the client
    raise ValueError("boom on a worker")


def test_an_error_inside_a_run_on_the_default_client_is_the_callers(loop):
    """get_client used to catch the run's own ValueError as 'no default client', start an
    embedded cluster and fail with contextlib's 'generator didn't stop after throw()'."""
    from dask_research import montecarlo as mc

    job = mc.Job(_fails_on_workers, {"a": mc.Normal(0, 1)}, shards=2, samples_per_shard=64, seed=1,
                 range=(-5, 5))
    with LocalCluster(loop=loop, n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cl, \
            Client(cl):         # the default client
        with pytest.raises(ValueError, match="boom on a worker"):
            mc.run(job, progress=False)


@pytest.mark.slow
@pytest.mark.timeout(180, method="thread")
@pytest.mark.parametrize("processes", [False, True])
def test_the_embedded_dashboard_serves_the_research_pages_in_a_fresh_process(tmp_path, processes):
    """The pages are registered by the scheduler's preload, not by an import the caller made."""
    pytest.importorskip("bokeh")
    from dask_research.testing.processes import run_python

    out = run_python(f"""
        import sys, urllib.request
        import dask
        from dask_research._cluster import embedded_cluster
        assert "dask_research.dashboard" not in sys.modules
        settings = {{"research.cluster.dashboard-address": "127.0.0.1:0", "research.cluster.n-workers": 1,
                     "research.cluster.processes": {processes}}}
        with dask.config.set(settings), embedded_cluster() as client:
            port = client.scheduler_info()["services"]["dashboard"]
            page = urllib.request.urlopen(f"http://127.0.0.1:{{port}}/individual-research-shards", timeout=30)
            print(page.status, "Research Shards" in page.read().decode())
    """, tmp_path, timeout=150)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-2:] == ["200", "True"], out.stdout


@pytest.mark.timeout(120, method="thread")
def test_the_embedded_cluster_keeps_the_users_configured_scheduler_preload(tmp_path):
    """Dask reads ``distributed.scheduler.preload`` only without an explicit ``preload=``;
    the research hooks are added to the user's, never instead of them."""
    from dask_research.testing.processes import run_python

    (tmp_path / "mine.py").write_text("def dask_setup(scheduler):\n    scheduler.mine_loaded = True\n")
    out = run_python("""
        import dask
        from dask_research import events
        from dask_research._cluster import embedded_cluster
        settings = {"distributed.scheduler.preload": ["mine"], "research.cluster.dashboard-address": None}
        with dask.config.set(settings), embedded_cluster() as client:
            print(client.run_on_scheduler(lambda dask_scheduler: (getattr(dask_scheduler, "mine_loaded", False),
                                                                  events.HANDLER in dask_scheduler.handlers)))
    """, tmp_path, timeout=100)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "(True, True)", out.stdout
