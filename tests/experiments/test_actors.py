"""``transport="actors"`` (issue 30): one long-lived Dask actor per slot, called directly.

Every promise of the tasks transport, each on what it is about: experiments run once each, in
their slots' actors on threads of their own, never more than a worker's threads at once, and
the scheduler never sees an experiment; a queued experiment starts in its actor before the
driver hears that the one before it ended; inside an experiment ``get_worker()``,
``get_client()`` and ``worker_client()`` work; events reach the Branches page; a worker killed
with a running and a queued experiment (SIGKILL) loses neither and counts each once; a frozen
worker (SIGSTOP) times out and the slot moves, and when it thaws it runs nothing it handed
back; timeouts count from an experiment's start; the run's deadline cancels; a driver killed
(SIGKILL) and resumed makes the uninterrupted run's decisions. The logic tests run on
``gen_cluster`` (workers in this process), the faults on real ``dask worker`` processes. No
assertion bounds a wall-clock time from above.
"""
import asyncio
import contextlib
import logging
import os
import pathlib
import signal
import tempfile
import textwrap
import threading
import time
import warnings

import crash_scenario as cs
import pytest
from distributed import Client
from distributed.utils_test import gen_cluster
from exp_scenarios import HAND_REWARDS, queued_hand_offs, summary

from dask_research.exceptions import InputError
from dask_research.experiments import Hypothesis, IterationScheduler, Result, make_deterministic_runner
from dask_research.experiments.lock import JournalLockWarning
from dask_research.testing.processes import WorkerSpec, process_cluster, subprocess_env, wait_for

HERE = pathlib.Path(__file__).resolve().parent
DIRECT = {"direct_to_workers": True}


@contextlib.contextmanager
def actor_cluster(where, n_workers=2, import_tests=False):
    """Real ``dask scheduler`` and ``dask worker`` processes (one thread each) and a client that
    reaches the workers directly, as a user of ``transport="actors"`` makes it;
    ``import_tests``: the workers can import this directory's modules (``crash_scenario``)."""
    env = {"PYTHONPATH": os.pathsep.join([str(HERE), subprocess_env()["PYTHONPATH"]])} if import_tests else {}
    with process_cluster(where, [WorkerSpec(env=env) for _ in range(n_workers)]) as cl:
        client = Client(cl.client.scheduler.address, direct_to_workers=True, set_as_default=False,
                        timeout=60)
        try:
            yield client, cl
        finally:
            client.close(timeout=5)


def _logging_runner(log, delay, hang=(), hang_for=30.0):
    """Logs ``start <id> <pid> <time>`` and ``end <id> <pid> <time>`` lines, sleeps ``delay``
    (``hang_for`` for the ids in ``hang``)."""
    def runner(h):
        import os
        import time

        with open(log, "a") as f:
            f.write(f"start {h.id} {os.getpid()} {time.time()}\n")
        time.sleep(hang_for if h.id in hang else delay)
        with open(log, "a") as f:
            f.write(f"end {h.id} {os.getpid()} {time.time()}\n")
        return 0.5
    return runner


def _scratch():
    """A fresh file path for a runner's log (a runner is pickled: it cannot append to a list
    of the test's, even on ``gen_cluster``'s workers in this process)."""
    fd, path = tempfile.mkstemp(prefix="actors-", suffix=".log")
    os.close(fd)
    return path


def _lines(log):
    return [ln.split() for ln in pathlib.Path(log).read_text().splitlines()] if os.path.exists(log) else []


def _starts(log):
    return [ln[1] for ln in _lines(log) if ln[0] == "start"]


# -- settings --------------------------------------------------------------------------------
def test_the_transport_is_checked_and_journaled(tmp_path):
    with pytest.raises(InputError, match=r'transport=\'task\' is invalid; expected "tasks" or "actors"'):
        IterationScheduler(None, transport="task")
    assert IterationScheduler(None, progress=False).transport == "actors"       # the default
    path = str(tmp_path / "loop.jsonl")
    sched = IterationScheduler(lambda h: 0.5, progress=False, checkpoint=path, transport="tasks")
    sched.add([Hypothesis("h0", "a")])
    assert sched.run().total_runs == 1            # without a client: in this process either way
    sched.close()
    assert IterationScheduler.resume(path, lambda h: 0.5).transport == "tasks"


# -- on gen_cluster: decisions, timeouts, the deadline, shared actors, proxied calls -----------------
def _hand(slots, **kw):
    sched = IterationScheduler(make_deterministic_runner(HAND_REWARDS, delay_ms=2), slots=slots,
                               c=0.5, prune_floor=0.0, paper_threshold=1.0, progress=False, **kw)
    sched.add([Hypothesis(f"{b}{k}", b) for b in "abc" for k in range(1, 5)])
    return sched


@gen_cluster(client=True, client_kwargs=DIRECT, nthreads=[("127.0.0.1", 1), ("127.0.0.1", 1)], timeout=60)
async def test_actor_decisions_equal_the_local_ones(c, s, a, b):
    """Deterministic decisions stay deterministic: one slot queueing one ahead, and two slots in
    dispatch order, decide on actors as they do in this process; the scheduler places one actor
    per slot and never sees an experiment."""
    one = await _hand(1, queue_ahead=1, client=c, transport="actors").run_async()
    assert summary(one) == summary(_hand(1, queue_ahead=1).run())
    two = await _hand(2, apply_order="dispatch", client=c, transport="actors").run_async()
    assert summary(two) == summary(_hand(2, apply_order="dispatch").run())
    assert "experiment" not in s.task_prefixes                 # no experiment was a Dask task
    assert s.task_prefixes["experiment-actor"].state_counts["memory"] == 3    # an actor per slot and run


@gen_cluster(client=True, client_kwargs=DIRECT, nthreads=[("127.0.0.1", 1), ("127.0.0.1", 1)], timeout=60)
async def test_the_paper_writer_and_the_budget_on_actors(c, s, a, b):
    runner = make_deterministic_runner({"x": 0.9, "y": 0.2}, delay_ms=2)
    sched = IterationScheduler(runner, slots=2, client=c, transport="actors", progress=False,
                               paper_writer=lambda branch, stats, best: f"{branch}:{stats.runs}",
                               max_experiments=6)
    sched.add([Hypothesis(f"{br}{k}", br) for k in range(10) for br in "xy"])
    report = await sched.run_async()
    assert report.stop_reason == "max_experiments" and report.total_runs == 6
    assert list(report.papers) == ["x"]


def test_the_holder_protocol_an_idle_holder_leaves_and_the_next_call_asks_for_one(monkeypatch):
    """The actor's side, without Dask (a stand-in worker, holder threads of the test's own): an
    experiment waits for a holder; a holder with nothing to run for ``HOLD_IDLE`` leaves; the
    next call answers ``"unheld"`` (again if repeated without ``held``: its answer may have been
    lost), the call repeated with ``held=True`` waits for the same experiment, a second holder
    while one runs starts nothing, and a holder that comes after its actor retired runs nothing."""
    import weakref
    from types import SimpleNamespace

    from dask_research.experiments import actors
    from dask_research.experiments.backends import PickledRunner

    monkeypatch.setattr(actors, "HOLD_IDLE", 0.2)
    log = _scratch()

    gate = pathlib.Path(log + ".go")

    def runner(h):
        with open(log, "a") as f:
            f.write(h.id + "\n")
        if h.id == "h1":
            wait_for(gate.exists, 30, "the test's gate")
        return 0.5

    def ran():
        return open(log).read().split()

    async def scenario():
        actor = actors.SlotActor(PickledRunner(runner), bounded=True, objectives=None, timeout=None)
        actor._worker = SimpleNamespace()        # on a worker: no thread of its own, a holder's
        first = asyncio.ensure_future(actor.run(0, Hypothesis("h0", "a")))
        await asyncio.sleep(0.3)
        assert not first.done() and ran() == []               # asked for a holder: it waits
        loop = asyncio.get_running_loop()
        holder = loop.run_in_executor(None, actors._hold, weakref.ref(actor))
        assert (await first)[0] == "done" and ran() == ["h0"]
        assert await holder == "idle" and actor._holding == "none"
        assert await actor.run(1, Hypothesis("h1", "a")) == ("unheld", None)
        # that answer lost on the way: the call repeated without a holder is told again
        assert await actor.run(1, Hypothesis("h1", "a")) == ("unheld", None)
        again = asyncio.ensure_future(actor.run(1, Hypothesis("h1", "a"), True))   # one submitted
        await asyncio.sleep(0.3)
        assert not again.done() and actor._holding == "asked"
        second = loop.run_in_executor(None, actors._hold, weakref.ref(actor))
        await loop.run_in_executor(None, lambda: wait_for(lambda: ran() == ["h0", "h1"], 30, "h1's start"))
        assert await loop.run_in_executor(None, actors._hold, weakref.ref(actor)) == "running"
        gate.write_text("go")
        assert (await again)[0] == "done" and ran() == ["h0", "h1"]          # once
        await actor.retire()
        assert await second in ("retired", "idle")      # (idle if HOLD_IDLE passed before retire)
        assert await actor.idle()

        # retired while its experiment waited for a thread (timed out, moved): a holder that
        # comes late runs nothing, and the call hears "moved"
        late = actors.SlotActor(PickledRunner(runner), bounded=True, objectives=None, timeout=None)
        late._worker = SimpleNamespace()
        waiting = asyncio.ensure_future(late.run(0, Hypothesis("h2", "a")))
        await asyncio.sleep(0.1)
        assert await late.retire() == []                 # started (taken): not handed back here
        assert await loop.run_in_executor(None, actors._hold, weakref.ref(late)) == "retired"
        assert await waiting == ("moved", None) and ran() == ["h0", "h1"]

    asyncio.run(scenario())


def _processing(s, worker):
    """The keys the scheduler counts as running or waiting for a thread on ``worker``."""
    return [ts.key for ts in s.workers[worker.address].processing]


@gen_cluster(client=True, client_kwargs=DIRECT, nthreads=[("127.0.0.1", 1)], timeout=60)
async def test_a_slot_holds_a_thread_dask_counts_and_gives_it_back_when_idle(c, s, a, monkeypatch):
    """While a slot's experiment runs, Dask sees its worker's only thread busy with the slot's
    holder task (a task of yours submitted then waits for it instead of running beside the
    experiment); once the slot has idled ``HOLD_IDLE`` seconds the holder ends and gives the thread
    back (the task runs), and the slot's next experiment brings a new holder."""
    from distributed import get_worker

    from dask_research.experiments import actors
    from dask_research.experiments.actors import ActorBackend

    monkeypatch.setattr(actors, "HOLD_IDLE", 0.3)
    gate = pathlib.Path(_scratch() + ".go")           # not there yet
    started = pathlib.Path(_scratch() + ".started")

    def runner(h):
        started.write_text(get_worker().get_current_task())
        wait_for(gate.exists, 30, "the test's gate")
        return 0.5

    backend = ActorBackend(c, runner, True, None, "t" * 12, slots=1)
    first = backend.submit(Hypothesis("h0", "a"), slot=0)
    await c.loop.run_in_executor(None, lambda: wait_for(started.exists, 30, "the experiment's start"))
    holder = started.read_text()                            # it runs inside its holder task
    assert holder.startswith("experiment-slot-") and holder in _processing(s, a)
    mine = c.submit(time.time, pure=False)                  # a task of the user's, meanwhile
    await asyncio.sleep(0.5)
    assert mine.status == "pending"                        # the experiment holds the only thread
    t_free = time.time()
    gate.write_text("go")
    [(token, result)] = await backend.wait(30)
    assert token is first and result.reward == 0.5
    assert await mine > t_free                             # it ran once the experiment ended
    await c.loop.run_in_executor(None, lambda: wait_for(
        lambda: not any(k.startswith("experiment-slot-") for k in _processing(s, a)), 20,
        "the idle holder to end"))
    second = backend.submit(Hypothesis("h1", "a"), slot=0)      # the slot's next: a new holder
    [(token, result)] = await backend.wait(30)
    assert token is second and result.reward == 0.5
    assert {k for k in s.tasks if k.startswith("experiment-slot-")} - {holder}
    await backend.close()


@gen_cluster(client=True, nthreads=[("127.0.0.1", 2)], timeout=60)
async def test_with_as_many_slots_as_threads_the_paper_writers_get_them_at_the_end(c, s, a, monkeypatch):
    """Two slots on a worker of two threads hold both; the paper writers (Dask futures)
    triggered meanwhile start once the run has nothing more to run: the run gives the slots'
    threads back then, not after ``HOLD_IDLE`` (here an hour: the run waited for it)."""
    from dask_research.experiments import actors

    monkeypatch.setattr(actors, "HOLD_IDLE", 3600.0)
    runner = make_deterministic_runner({"x": 0.9, "y": 0.8}, delay_ms=5)
    sched = IterationScheduler(runner, slots=2, client=c, progress=False, prune_floor=0.0,
                               paper_threshold=0.5, paper_writer=lambda branch, stats, best: branch,
                               max_experiments=12)
    sched.add([Hypothesis(f"{br}{k}", br) for k in range(10) for br in "xy"])
    report = await sched.run_async()
    assert report.total_runs == 12 and sorted(report.papers) == ["x", "y"]
    assert sorted(report.papers.values()) == ["x", "y"]


@gen_cluster(client=True, client_kwargs=DIRECT, nthreads=[("127.0.0.1", 1)], timeout=60)
async def test_an_actor_timeout_counts_from_the_start_and_the_slot_moves(c, s, a):
    """Three experiments queued behind a running one in the actor: the last starts about 0.9 s
    after it was dispatched and runs 0.3 s, inside a 1 s timeout counted from its start. A
    hanging one times out one timeout after it started; its actor retires (the hang keeps its
    thread) and the experiment queued behind it runs once, on the slot's next actor, which
    waits for the worker's only thread."""
    log = _scratch()

    def runner(h):
        with open(log, "a") as f:
            f.write(h.id + "\n")
        time.sleep(2.5 if h.id == "hang" else 0.3)
        return 0.5

    sched = IterationScheduler(runner, slots=1, client=c, queue_ahead=3, timeout=1.0, transport="actors",
                               prune_floor=0.0, progress=False)
    sched.add([Hypothesis(f"n{k}", "a") for k in range(4)] + [Hypothesis("hang", "a"), Hypothesis("n4", "a")])
    report = await sched.run_async()
    assert report.timed_out == ["hang"] and report.total_runs == 5
    ends = {e.hypothesis: e.t for e in report.events.of("result", "failure")}
    dispatched = {e.hypothesis: e.t for e in report.events.of("dispatch")}
    assert ends["n3"] - dispatched["n3"] > 1.0          # longer than the timeout since queued
    assert ends["hang"] - ends["n3"] > 0.9              # counted from its start, as n3 ended
    ran = open(log).read().split()
    assert sorted(ran) == sorted(["n0", "n1", "n2", "n3", "hang", "n4"])      # each once
    assert ran.index("n4") > ran.index("hang")
    assert s.task_prefixes["experiment-actor"].state_counts["memory"] == 2   # the slot moved once
    for _ in range(1000):                      # the actors' cancel reaches the scheduler a turn later
        if not s.tasks:
            break
        await asyncio.sleep(0.01)
    assert not s.tasks                                                       # all released


@gen_cluster(client=True, client_kwargs=DIRECT, nthreads=[("127.0.0.1", 1)], timeout=60)
async def test_the_run_deadline_cancels_what_runs_and_what_waits_in_an_actor(c, s, a):
    log = _scratch()

    def runner(h):
        with open(log, "a") as f:
            f.write(h.id + "\n")
        time.sleep(1.5)
        return 0.5

    sched = IterationScheduler(runner, slots=1, client=c, queue_ahead=1, transport="actors",
                               max_seconds=0.3, cancel_grace=0.3, prune_floor=0.0, progress=False)
    sched.add([Hypothesis(f"h{k}", "a") for k in range(4)])
    report = await sched.run_async()
    assert sorted(report.cancelled) == ["h0", "h1"] and report.total_runs == 0
    assert report.stop_reason == "max_seconds"
    await c.loop.run_in_executor(None, time.sleep, 1.5)    # h0 ends: h1, dropped, never starts
    assert open(log).read().split() == ["h0"]
    sched.max_seconds = None
    again = await sched.run_async()                     # the cancelled ones run first next time,
    assert [e.hypothesis for e in again.events.of("dispatch")][:2] == ["h0", "h1"]   # in dispatch order
    assert again.total_runs == 4


@gen_cluster(client=True, client_kwargs=DIRECT, nthreads=[("127.0.0.1", 1)], timeout=60)
async def test_slots_beyond_the_threads_share_an_actor(c, s, a):
    """Two slots on one one-thread worker: one actor, which the second slot shares (one
    experiment at a time), with one warning line; every experiment runs once."""
    log = _scratch()

    def runner(h):
        t0 = time.time()
        time.sleep(0.05)
        with open(log, "a") as f:
            f.write(f"{t0} {time.time()} {h.id}\n")
        return 0.5

    sched = IterationScheduler(runner, slots=2, client=c, transport="actors", prune_floor=0.0, progress=False)
    sched.add([Hypothesis(f"h{k}", "ab"[k % 2]) for k in range(8)])
    with pytest.warns(UserWarning, match=r"no worker has a thread to spare for slot 1's actor \(1 live "
                                         r"actors for 2 slots\); it shares another slot's actor"):
        report = await sched.run_async()
    spans = sorted((float(a), float(b), i) for a, b, i in (ln.split() for ln in open(log)))
    assert report.total_runs == 8 and sorted(i for _, _, i in spans) == sorted(f"h{k}" for k in range(8))
    assert all(x[1] <= y[0] for x, y in zip(spans, spans[1:]))       # one at a time
    assert s.task_prefixes["experiment-actor"].state_counts["memory"] == 1


@gen_cluster(client=True, client_kwargs={"direct_to_workers": False}, nthreads=[("127.0.0.1", 1)], timeout=60)
async def test_without_a_direct_route_calls_go_through_the_scheduler_and_say_so(c, s, a, caplog):
    """A client made with ``direct_to_workers=False``: every call is proxied by the scheduler (its
    ``proxy`` handler runs), the log says so once, the decisions are the same."""
    proxied = []
    real = s.handlers["proxy"]

    async def proxy(*args, **kwargs):
        proxied.append(kwargs.get("worker"))
        return await real(*args, **kwargs)

    s.handlers["proxy"] = proxy
    with caplog.at_level(logging.INFO, logger="dask_research.experiments.actors"):
        report = await _hand(1, client=c, transport="actors", queue_ahead=1).run_async()
    assert summary(report) == summary(_hand(1, queue_ahead=1).run())
    assert len(proxied) >= report.total_runs and set(proxied) == {a.address}
    said = [r.getMessage() for r in caplog.records if "through the scheduler" in r.getMessage()]
    assert len(said) == 1 and a.address in said[0] and "direct_to_workers=True" in said[0]


def test_the_driver_calls_directly_where_the_client_says_or_on_loopback():
    """``direct_to_workers`` decides; unset (Dask's default), an embedded cluster on this
    machine's loopback is called directly, a scheduler or worker elsewhere through the scheduler."""
    from types import SimpleNamespace

    from dask_research.experiments.actors import ActorBackend

    def route(flag, scheduler, worker):
        client = SimpleNamespace(status="running", direct_to_workers=flag,
                                 scheduler=SimpleNamespace(address=scheduler))
        return ActorBackend(client, len, True, None, "r" * 12)._calls_directly(worker)

    here, there = "tcp://127.0.0.1:8786", "tcp://10.1.2.3:8786"
    assert route(None, here, "tcp://127.0.0.1:4001") and route(None, "inproc://1.2.3/4/1", "inproc://1.2.3/4/2")
    assert not route(None, here, "tcp://10.1.2.4:4001") and not route(None, there, "tcp://127.0.0.1:4001")
    assert route(True, there, "tcp://10.1.2.4:4001") and not route(False, here, "tcp://127.0.0.1:4001")


@gen_cluster(client=True, client_kwargs=DIRECT, nthreads=[("127.0.0.1", 1)], timeout=60)
async def test_a_lost_answer_is_asked_again_and_a_worker_out_of_reach_is_called_through_the_scheduler(c, s, a):
    """Every direct call's answer is lost on the way back (an OSError after the worker ran it),
    while the worker stays in the scheduler's table: the driver says in one line that it calls
    that worker through the scheduler, asks again under the same numbers, and gets the answers
    of the experiments already run: each ran once."""
    from dask_research.experiments import actors

    log = _scratch()

    def runner(h):
        with open(log, "a") as f:
            f.write(h.id + "\n")
        return 0.5

    real = actors.actor_call

    async def lossy(client, address, key, method, *args, direct=True):
        out = await real(client, address, key, method, *args, direct=direct)
        if direct and method == "run":
            raise OSError("the answer was lost on the way back")
        return out

    actors.actor_call, judge = lossy, actors.ROUTE_JUDGE
    actors.ROUTE_JUDGE = 0.3
    try:
        sched = IterationScheduler(runner, slots=1, client=c, transport="actors", queue_ahead=1,
                                   prune_floor=0.0, progress=False)
        sched.add([Hypothesis(f"h{k}", "ab"[k % 2]) for k in range(6)])
        with pytest.warns(UserWarning, match=r"the driver could not reach worker .* directly \(OSError: "
                                             r"the answer was lost on the way back\); its calls go through "
                                             r"the scheduler"):
            report = await sched.run_async()
    finally:
        actors.actor_call, actors.ROUTE_JUDGE = real, judge
    assert report.total_runs == 6 and not report.failed
    assert sorted(open(log).read().split()) == sorted(f"h{k}" for k in range(6))     # each once


class _Echo:
    async def echo(self, x):
        return x

    async def boom(self):
        raise ValueError("boom")


@gen_cluster(client=True, client_kwargs=DIRECT, nthreads=[("127.0.0.1", 1)], timeout=60)
async def test_the_dask_internals_the_transport_uses(c, s, a):
    """``_compat``'s actor call (direct and proxied), worker table, actor lookup and released
    check: what breaks loudly there when Dask moves them."""
    from dask_research import _compat

    fut = c.submit(_Echo, actor=True, workers=[a.address], pure=False)
    await fut
    for direct in (True, False):
        assert await _compat.actor_call(c, a.address, fut.key, "echo", {"x": 1}, direct=direct) == {"x": 1}
        with pytest.raises(ValueError, match="boom"):
            await _compat.actor_call(c, a.address, fut.key, "boom", direct=direct)
    assert (await _compat.scheduler_workers(c))[a.address]["nthreads"] == 1
    assert not _compat.actor_released(a, fut.key)
    assert isinstance(_compat.worker_actor(a, fut.key), _Echo)
    assert _compat.worker_actor(a, "no-such-actor") is None
    await c.cancel([fut])
    await c.loop.run_in_executor(None, lambda: wait_for(lambda: _compat.actor_released(a, fut.key), 10, "release"))


# -- real processes --------------------------------------------------------------------------
def _probe():
    def runner(h):
        import os
        import threading
        import time

        from distributed import get_client, get_worker, worker_client

        t0 = time.time()
        time.sleep(0.1)
        task = get_worker().get_current_task()
        with worker_client() as wc:       # secedes from the holder task: the worker's one thread frees
            inner = wc.submit(len, "abc").result()
            total = get_client().submit(sum, [1, 2]).result()
        return Result(h, 0.5, {"pid": os.getpid(), "thread": threading.current_thread().name, "start": t0,
                               "end": time.time(), "worker": get_worker().address, "task": task,
                               "client": total, "inner": inner})
    return runner


def test_actors_on_real_workers(tmp_path):
    """Two one-thread ``dask worker`` processes, two slots queueing ahead: each experiment runs
    once, inside its slot's holder task (so on a thread Dask counts busy), one at a time per
    worker; every queued experiment starts before the driver has heard that the one before it on
    its worker ended; ``get_worker()``, ``get_client()`` and ``worker_client()`` (which secedes
    from the holder: the tasks it submits get the worker's only thread) work inside; the events
    reach the Branches page."""
    pytest.importorskip("bokeh")
    from dask_research.dashboard.folds import branch_view

    with actor_cluster(tmp_path, 2) as (client, _):
        sched = IterationScheduler(_probe(), slots=2, client=client, queue_ahead=1, transport="actors",
                                   prune_floor=0.0, progress=False)
        sched.add([Hypothesis(f"h{k}", "ab"[k % 2]) for k in range(12)])
        report = sched.run()
        view = branch_view(client.get_events("research.experiments"))
        prefixes = client.run_on_scheduler(lambda dask_scheduler: sorted(dask_scheduler.task_prefixes))
    assert report.total_runs == 12 and not report.failed
    assert all(r.metrics["task"].startswith("experiment-slot-") for r in report.results)
    assert all(r.metrics["client"] == 3 and r.metrics["inner"] == 3 for r in report.results)
    assert len({r.metrics["pid"] for r in report.results}) == len({r.metrics["worker"] for r in report.results}) == 2
    assert "experiment" not in prefixes and {"experiment-actor", "experiment-slot"} <= set(prefixes)
    assert view is not None
    assert {b: v["runs"] for b, v in view["branches"].items()} == {b: st.runs for b, st in report.branches.items()}
    assert len({e.hypothesis for e in report.events.of("dispatch") if e.data.get("ahead")}) >= 8
    # Each queued experiment waited in its actor before the driver heard the one before it, and
    # most started before that too (no round trip; under load the result can reach the driver a
    # millisecond or two before the actor's thread starts the next one: 1.75 ms once).
    checked, early = queued_hand_offs(report)
    assert checked >= 8 and early >= checked // 2, (early, checked)


@pytest.mark.slow
def test_a_worker_killed_with_a_running_and_a_queued_experiment(tmp_path):
    """Three one-thread workers, two slots queueing one ahead: the worker of one slot is killed
    (SIGKILL) while its experiment started under half a second ago (of 1 s) and one waits
    behind it in its actor. The slot's actor is created again on the spare worker; the one that
    was running runs once more, the queued one once, every other once, each counted once."""
    log = str(tmp_path / "runs.log")
    with actor_cluster(tmp_path, 3) as (client, cl):
        pids = client.run(os.getpid)
        sched = IterationScheduler(_logging_runner(log, 1.0), slots=2, client=client, queue_ahead=1,
                                   transport="actors", prune_floor=0.0, progress=False)
        sched.add([Hypothesis(f"h{k}", "ab"[k % 2]) for k in range(10)])
        box = {}
        thread = threading.Thread(target=lambda: box.setdefault("report", sched.run()))
        thread.start()

        def running_fresh():
            """A worker whose last line is a start under half a second ago, after the first
            round (so an experiment waits behind it in its actor)."""
            lines = _lines(log)
            if sum(1 for ln in lines if ln[0] == "end") < 2:
                return False
            last = {}
            for kind, hid, pid, t in lines:
                last[int(pid)] = (kind, hid, float(t))
            for pid, (kind, hid, t) in last.items():
                if kind == "start" and time.time() - t < 0.5:
                    box["victim"] = (pid, hid)
                    return True
            return False

        wait_for(running_fresh, 60, "a worker that just started an experiment", poll=0.02)
        pid, running = box["victim"]
        victim = next(p for p in cl.workers if p.pid == pid)
        victim.send_signal(signal.SIGKILL)
        before = _starts(log)
        thread.join(120)
        assert not thread.is_alive()
    report = box["report"]
    starts = _starts(log)
    assert sorted(r.hypothesis.id for r in report.results) == sorted(f"h{k}" for k in range(10))
    assert starts.count(running) == 2                                  # the running one: once more
    assert all(starts.count(h) == 1 for h in set(starts) - {running})   # everything else once
    spare = set(pids.values()) - {int(ln[2]) for ln in _lines(log)[:4]}
    assert spare and any(int(ln[2]) in spare for ln in _lines(log) if ln[0] == "start"
                         and ln[1] not in before)                     # the new actor: the spare worker
    assert victim.poll() is not None


@pytest.mark.slow
def test_a_frozen_worker_times_out_the_slot_moves_and_the_thawed_one_runs_nothing_more(tmp_path):
    """One slot queueing one ahead on two one-thread workers, a 2 s timeout. The actor's worker
    is frozen (SIGSTOP) as an experiment starts: it times out, the slot moves to the other
    worker, and the experiment queued behind it there runs once on the new actor. The frozen
    worker is thawed (SIGCONT) while the run goes on: its actor starts nothing more.

    The freeze waits until the driver has counted h2 (h3 runs 1.5 s, within the timeout): a
    worker frozen after h3 started but before h2's answer left it holds h2's answer too, and
    then h2 is the one that times out (the stress gate saw that once)."""
    log = str(tmp_path / "runs.log")
    with actor_cluster(tmp_path, 2) as (client, cl):
        sched = IterationScheduler(_logging_runner(log, 0.3, hang=("h3",), hang_for=1.5), slots=1, client=client,
                                   queue_ahead=1, timeout=2.0, transport="actors", prune_floor=0.0, progress=False)
        sched.add([Hypothesis(f"h{k}", "a") for k in range(16)])
        box = {}
        thread = threading.Thread(target=lambda: box.setdefault("report", sched.run()))
        thread.start()
        wait_for(lambda: "h3" in _starts(log) and sched.stats["a"].runs >= 3, 60, "h3 starts after h2 is counted",
                 poll=0.01)
        frozen_pid = next(int(ln[2]) for ln in _lines(log) if ln[:2] == ["start", "h3"])
        frozen = next(p for p in cl.workers if p.pid == frozen_pid)
        frozen.send_signal(signal.SIGSTOP)
        wait_for(lambda: "h4" in _starts(log), 60, "h4 starts elsewhere", poll=0.05)
        frozen.send_signal(signal.SIGCONT)                  # thawed while the run goes on
        thread.join(120)
        assert not thread.is_alive()
        time.sleep(1.0)                                     # anything the thawed actor would start
    report = box["report"]
    starts = _lines(log)
    assert report.timed_out == ["h3"] and report.total_runs == 15
    assert [ln[1] for ln in starts if ln[0] == "start"].count("h4") == 1       # queued behind: once
    after = [ln for ln in starts if ln[0] == "start" and ln[1] not in ("h0", "h1", "h2", "h3")]
    assert after and all(int(ln[2]) != frozen_pid for ln in after)           # all on the other one
    assert sorted(set(_starts(log))) == sorted(f"h{k}" for k in range(16))
    assert all(_starts(log).count(f"h{k}") == 1 for k in range(16))


DRIVER = """
import sys
sys.path.insert(0, {tests!r})
from distributed import Client
import crash_scenario as cs
client = Client({address!r}, direct_to_workers=True)
cs.scheduler(cs.LoggingRunner({log!r}, 0.05), {path!r}, queue_ahead=1, client=client,
             transport="actors").run()
"""


@pytest.mark.slow
def test_a_killed_driver_resumes_on_actors_into_the_uninterrupted_run(tmp_path):
    """The driver (a subprocess on a real cluster, one slot queueing ahead in its actor) is
    killed with SIGKILL after twelve results; resumed on actors it makes the uninterrupted
    run's decisions, and nothing that had not been in flight runs twice."""

    path, log = str(tmp_path / "loop.jsonl"), str(tmp_path / "done.log")
    with actor_cluster(tmp_path, 1, import_tests=True) as (client, _):
        script = tmp_path / "run.py"
        script.write_text(textwrap.dedent(DRIVER.format(tests=str(HERE), address=client.scheduler.address,
                                                        log=log, path=path)))
        cs.run_and_kill(script, path, results=12, timeout=120)
        sched = cs.resume_killed(path, log, client=client)
        assert sched.transport == "actors" and sched.queue_ahead == 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", JournalLockWarning)
            report = sched.run()
    twice = cs.run_twice(report, log, queue_ahead=1)
    assert len(twice) <= 2          # what was running or had just started at the kill, at most


# -- a lost scheduler ------------------------------------------------------------------------
def _steady_runner(delay):
    def runner(h):
        import time

        time.sleep(delay)
        return 0.5
    return runner


async def _stranded_backend():
    """An :class:`ActorBackend` of a client that loses its scheduler before any actor is placed
    (a stand-in client: no scheduler answers it, so every slot waits for a worker)."""
    from types import SimpleNamespace

    from dask_research.experiments.actors import ActorBackend
    from dask_research.experiments.backends import ClusterCancelled

    client = SimpleNamespace(status="running", direct_to_workers=True)
    backend = ActorBackend(client, _steady_runner(0.0), True, None, "r" * 12, slots=2)
    calls = [backend.submit(Hypothesis(f"h{k}", "a"), queued=k >= 2, slot=k % 2) for k in range(3)]
    before = await backend.wait(0.2)           # waiting for a worker: nothing yet
    client.status = "connecting"               # what Dask's client says once the scheduler is gone
    out = await backend.wait(60)
    await backend.close()
    assert before == []
    assert [tok for tok, _ in out] == calls                                  # every one, in order
    assert all(isinstance(o, ClusterCancelled) and o.reason == "scheduler-connection-lost" for _, o in out)
    assert await backend.wait(0.01) == []                                    # each once
    return True


def test_a_lost_scheduler_gives_every_experiment_in_flight_up_as_cancelled():
    """Without a scheduler no actor can be placed: the backend used to wait for a worker forever."""
    assert asyncio.run(_stranded_backend())


@pytest.mark.slow
@pytest.mark.timeout(300, method="thread")
@pytest.mark.parametrize("transport", ["actors", "tasks"])
def test_a_run_whose_scheduler_is_killed_stops_in_one_line_and_resumes(tmp_path, transport):
    """The ``dask scheduler`` process is killed (SIGKILL) mid-run; its workers close with it.
    The run on actors used to wait forever without a word (the driver looked for a worker to
    place the slots' actors on again). Now it stops as on the tasks transport: one line, the
    experiments in flight cancelled (not failed: no branch pruned), the journal intact, and the
    same command resumes on a new cluster, running them first."""
    path = str(tmp_path / "loop.jsonl")
    runner = _steady_runner(0.3)
    hyps = [Hypothesis(f"{b}{k}", b) for k in range(12) for b in "ab"]
    with actor_cluster(tmp_path, 2) as (client, cl):
        sched = IterationScheduler(runner, slots=2, client=client, queue_ahead=1, transport=transport,
                                   checkpoint=path, progress=False)
        sched.add(hyps)
        box = {}

        def go():
            try:
                box["report"] = sched.run()
            except BaseException as exc:  # noqa: BLE001 - what the test looks at
                box["error"] = exc

        thread = threading.Thread(target=go, daemon=True)
        thread.start()
        wait_for(lambda: "error" in box or "report" in box or sum(st.runs for st in sched.stats.values()) >= 3,
                 120, "three results")
        assert not box, box
        cl.scheduler.kill()
        cl.scheduler.wait(30)
        thread.join(180)                # the client tries to reconnect for 60 s; detected within a poll
        assert not thread.is_alive(), f"the run on {transport} hung after its scheduler died"
        sched.close()
    err = box.get("error")
    assert type(err).__name__ == "ExperimentError", box
    msg = str(err)
    assert "\n" not in msg and msg.startswith("the Dask client lost its scheduler (client status "), msg
    assert "experiment(s) in flight were not counted" in msg and "or a resume" in msg, msg
    trace = sched._recorder.trace
    assert trace is not None
    done = [e.hypothesis for e in trace.of("result")]
    cancelled = [e.hypothesis for e in trace.of("cancel")]
    assert len(done) >= 3 and cancelled and not trace.of("failure", "prune")
    assert all("lost its scheduler" in e.data["reason"] for e in trace.of("cancel"))

    resumed = IterationScheduler.resume(path, runner)
    assert resumed.transport == transport
    assert all(st.failures == 0 and st.pruned is None for st in resumed.stats.values())
    resumed.close()
    (tmp_path / "again").mkdir()
    with actor_cluster(tmp_path / "again", 2) as (client, _):
        resumed = IterationScheduler.resume(path, runner, client=client)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", JournalLockWarning)
            report = resumed.run()
    assert report.stop_reason == "queue_empty" and report.failures == 0 and not report.failed
    again = [e.hypothesis for e in report.events.of("dispatch")][len(trace.of("dispatch")):]
    assert again[:len(cancelled)] == cancelled                 # what was in flight runs first
    # the report of a resumed run counts the journaled results too: every one once, none again
    assert sorted(r.hypothesis.id for r in report.results) == sorted(h.id for h in hyps)
