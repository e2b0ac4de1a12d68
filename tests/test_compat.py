"""The Dask internals dask-research relies on, each checked against the installed distributed.

A Dask release that moves one of them fails here (and in ``dask_research._compat``), by name.
"""
from __future__ import annotations

import time
from types import SimpleNamespace

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


def test_run_each_answers_per_worker_and_a_closed_client_is_not_a_moved_internal():
    """run_each asks each worker on its own; events shipped after Client.close() failed with
    "distributed ... does not provide Client.scheduler", blaming the Dask release."""
    import asyncio
    import os

    from distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as cl, \
            Client(cl) as c:
        c.wait_for_workers(2)
        asked: dict = {}
        answers, waiting = _compat.run_each(c, os.getpid, within=30, asked=asked)
        assert set(answers) == set(cl.scheduler.workers) and waiting == set() and asked == {}
    assert c.status == "closed"
    with pytest.raises(RuntimeError, match="the client is closed") as e:
        asyncio.run(_compat.scheduler_call(c, "log_event", topic="t", msg={}))
    assert not isinstance(e.value, DaskCompatError)


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


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)], worker_kwargs={"memory_limit": "1 GiB"})
async def test_worker_and_scheduler_internals(c, s, a):
    assert _compat.worker_memory_limit(a) == 2**30
    assert _compat.heartbeat_interval(1) > 0
    assert _compat.heartbeat_interval(10_000) >= _compat.heartbeat_interval(1)
    ev = __import__("distributed").Event()
    fut = c.submit(lambda e: e.wait(30), ev, key="compat-processing", pure=False)
    while "compat-processing" not in _compat.processing_keys(s):
        await __import__("asyncio").sleep(0.01)
    await ev.set()
    await fut
    assert "compat-processing" not in _compat.processing_keys(s)
    assert _compat.client_asynchronous(c) is True
    with pytest.raises(DaskCompatError, match="Scheduler.tasks"):
        _compat.processing_keys(object())
    # a worker's status: running now, closing once it closes (a slot actor stops taking work)
    assert not _compat.worker_closing(a)
    assert _compat.worker_closing(SimpleNamespace(status=SimpleNamespace(name="closing_gracefully")))
    with pytest.raises(DaskCompatError, match="Worker.state.actors"):
        _compat.worker_actor(object(), "key")


def test_client_asynchronous_of_a_synchronous_client():
    from distributed import LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0") as cl, \
            Client(cl) as c:
        assert _compat.client_asynchronous(c) is False
    assert _compat.client_asynchronous(None) is False


def test_forget_unsubmitted_jobs_drops_only_those_without_a_job_id():
    from distributed import Status

    class Job:
        def __init__(self, job_id):
            self.job_id, self.status = job_id, Status.created

    class Cluster:
        def __init__(self):
            self.workers = {"a": Job("1"), "b": Job(None)}
            self.worker_spec = {"a": {}, "b": {}}

    cl = Cluster()
    b = cl.workers["b"]
    assert _compat.forget_unsubmitted_jobs(cl, lambda w: bool(w.job_id)) == 1
    assert list(cl.workers) == ["a"] and list(cl.worker_spec) == ["a"] and b.status == Status.failed
    with pytest.raises(DaskCompatError, match="SpecCluster.workers"):
        _compat.forget_unsubmitted_jobs(object(), lambda w: True)


#: Attributes of Dask's own objects that are not public API: reading them anywhere but
#: dask_research/_compat.py couples the package to one Dask release in silence.
DASK_INTERNALS = {"memory_manager", "worker_spec", "batched_stream", "handlers", "_asynchronous",
                  "bandwidth_workers", "bandwidth", "tasks", "task_prefixes", "stream_handlers",
                  "_maybe_pause_or_unpause", "scheduler_comm", "rpc", "_scheduler_identity"}


def _internal_uses(path):
    """``(line, what)`` for each use of a Dask internal in ``path``: an import from a private
    module of distributed, an attribute in DASK_INTERNALS, or a getattr/setattr/hasattr/vars
    lookup of such a name or of any private name by string."""
    import ast

    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("distributed."):
            out.append((node.lineno, f"from {node.module} import ..."))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, f"import {a.name}") for a in node.names if a.name.startswith("distributed.")]
        elif isinstance(node, ast.Attribute) and node.attr in DASK_INTERNALS:
            out.append((node.lineno, f".{node.attr}"))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            name = node.args[1].value
            if name in DASK_INTERNALS or (name.startswith("_") and not name.startswith("__")):
                out.append((node.lineno, f"{node.func.id}(..., {name!r})"))
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and \
                node.slice.value in DASK_INTERNALS and isinstance(node.value, ast.Call) and \
                isinstance(node.value.func, ast.Name) and node.value.func.id == "vars":
            out.append((node.lineno, f"vars(...)[{node.slice.value!r}]"))
    return out


#: Uses that are the package's own objects, not Dask's (file, attribute): each checked by hand.
OWN = {("dask_research/experiments/execute.py", ".tasks"), ("dask_research/experiments/driver.py", ".tasks"),
       ("dask_research/replay/cluster/table.py", ".bandwidth"), ("dask_research/replay/tier_placement.py", ".bandwidth"),
       ("dask_research/replay/storages/base.py", ".bandwidth"),
       ("dask_research/replay/storages/tiered.py", ".bandwidth"),
       ("dask_research/replay/cluster/cluster_delivery.py", ".bandwidth"),      # the shard table's own estimate
       ("dask_research/replay/cluster/cluster_plane.py", ".bandwidth"),
       ("dask_research/replay/storages/tiered.py", "getattr(..., '_on_gpu')")}   # storages/device.py's own flag


def test_dask_worker_command_parses_as_dask_worker_does():
    import click

    from dask_research import _compat

    params = _compat.dask_worker_command().make_context(
        "dask worker", ["tcp://127.0.0.1:8786", "--nthreads", "3", "--memory-limit", "2GiB"]).params
    assert params["nthreads"] == 3 and params["memory_limit"] == "2GiB"
    with pytest.raises(click.UsageError):
        _compat.dask_worker_command().make_context("dask worker", ["tcp://127.0.0.1:8786", "--nthreads", "x"])


def test_no_dask_internal_is_touched_outside_the_compat_module():
    from pathlib import Path

    import dask_research

    root = Path(dask_research.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        if rel == "dask_research/_compat.py":
            continue
        for line, what in _internal_uses(path):
            if (rel, what) not in OWN and not (what.startswith("getattr") and "'_" in what and _own_private(path, what)):
                found.append(f"{rel}:{line}: {what}")
    assert not found, "Dask internals outside dask_research/_compat.py:\n" + "\n".join(found)


def _own_private(path, what):
    """A getattr of a private name this file itself defines (its own object, not Dask's)."""
    name = what.split("'")[1]
    text = path.read_text()
    return f"self.{name} =" in text or f"def {name}(" in text or f"{name}:" in text


def test_the_scan_finds_what_it_looks_for(tmp_path):
    sample = tmp_path / "x.py"
    sample.write_text("from distributed.scheduler import heartbeat_interval\n"
                      "a = worker.memory_manager\n"
                      "b = getattr(client, '_asynchronous')\n"
                      "c = [ts.state for ts in scheduler.tasks.values()]\n"
                      "d = vars(client)['_asynchronous']\n")
    assert sorted(line for line, _ in _internal_uses(sample)) == [1, 2, 3, 4, 5]
