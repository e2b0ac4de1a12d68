"""The Dask internals dask-research relies on, each checked against the installed distributed.

A Dask release that moves one of them fails here (and in ``dask_research._compat``), by name.
"""
from __future__ import annotations

import time

import pytest
from distributed import Client, Worker
from distributed.utils_test import gen_cluster

from dask_research import _compat
from dask_research._compat import DaskCompatError

pytestmark = pytest.mark.timeout(60, method="thread")


def test_moved_internal_fails_loudly_with_the_version():
    with pytest.raises(DaskCompatError) as info:
        _compat._attr("distributed.client", "no_such_internal")
    message = str(info.value)
    assert "distributed.client.no_such_internal" in message
    assert _compat.DISTRIBUTED_VERSION in message


def test_exceptions_are_the_ones_distributed_raises():
    from distributed.client import FutureCancelledError, FuturesCancelledError
    from distributed.comm.core import CommClosedError

    assert _compat.FutureCancelledError is FutureCancelledError
    assert _compat.FuturesCancelledError is FuturesCancelledError
    assert _compat.CommClosedError is CommClosedError


def test_addresses():
    assert _compat.address_host_port("tcp://10.0.0.5:8786") == ("10.0.0.5", 8786)
    assert _compat.comm_backend("tcp") is not None
    with pytest.raises(ValueError):
        _compat.comm_backend("carrier-pigeon")


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)] * 2)
async def test_client_side_internals(c: Client, s, a: Worker, b: Worker):
    assert _compat.in_async_call(c.loop)
    futures = [c.submit(lambda x: x + 1, i, pure=False) for i in range(3)]
    done, not_done = await _compat.wait_futures(futures, timeout=10)
    assert len(done) == 3 and not not_done
    slow = c.submit(time.sleep, 5, pure=False)
    with pytest.raises(TimeoutError):
        await _compat.wait_futures([slow], timeout=0.05, return_when="FIRST_COMPLETED")

    await _compat.scheduler_log_event(c, "compat-topic", {"n": 1})
    events = s.get_events("compat-topic")
    assert [msg for _, msg in events] == [{"n": 1}]

    _compat.add_scheduler_handler(s, "compat_echo", lambda x: x * 2)
    assert await _compat.scheduler_call(c, "compat_echo", x=21) == 42
    assert await _compat.scheduler_call(c, "compat_no_such_handler", x=1) is None   # no handler
    with pytest.raises(DaskCompatError, match="Scheduler.handlers"):
        _compat.add_scheduler_handler(object(), "x", print)

    assert _compat.worker_stream_open(a) and _compat.worker_stream_open(b)
    assert _compat.worker_stream_open(object()) is False
    assert isinstance(_compat.bandwidth_workers(s), dict)
    assert _compat.total_bandwidth(s) > 0
    with pytest.raises(DaskCompatError, match="Scheduler.bandwidth"):
        _compat.total_bandwidth(object())


def test_scheduler_identity_lists_every_worker():
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as cl, \
            Client(cl) as c:
        c.wait_for_workers(2)
        assert not _compat.in_async_call(c.loop)   # called from this (non-loop) thread
        info = _compat.scheduler_identity(c)
        assert set(info["workers"]) == set(cl.scheduler.workers)


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)],
             worker_kwargs={"memory_limit": "1 GiB"})
async def test_memory_pause_guard_holds_a_paused_worker_then_restores(c, s, a):
    from distributed import Status

    mm = a.memory_manager
    hold = {"on": True}
    restore = _compat.guard_memory_pause(a, lambda w: hold["on"] and w.status == Status.paused)
    a.status = Status.paused
    mm._maybe_pause_or_unpause(a, 0)     # memory is fine, but the guard holds the pause
    assert a.status == Status.paused
    hold["on"] = False
    mm._maybe_pause_or_unpause(a, 0)     # released: Dask's own step resumes the worker
    assert a.status == Status.running
    restore()
    assert "_maybe_pause_or_unpause" not in vars(mm)
    restore()                            # idempotent


def test_memory_pause_guard_refuses_a_moved_method():
    class MovedManager:   # a memory manager of a Dask that renamed the step
        pass

    class FakeWorker:
        memory_manager = MovedManager()

    with pytest.raises(DaskCompatError, match="_maybe_pause_or_unpause"):
        _compat.guard_memory_pause(FakeWorker(), lambda w: True)

    class NoMonitor:
        memory_manager = None

    _compat.guard_memory_pause(NoMonitor(), lambda w: True)()   # nothing to guard, nothing raised


def test_dashboard_internals():
    pytest.importorskip("bokeh")
    apps = _compat.dashboard_applications()
    assert "/status" in apps or "/individual-progress" in apps
    assert _compat.dashboard_theme() is not None
    assert _compat.dashboard_template("simple.html") is not None
    assert callable(_compat.add_periodic_callback)
    wrapped = _compat.log_errors(lambda: 3)
    assert wrapped() == 3
