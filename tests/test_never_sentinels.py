"""Clocks that count from boot: a machine up a few seconds must not hold back a first action.

``time.monotonic()`` and ``time.perf_counter()`` count from boot on Linux (from the sandbox's
start on some), so on a fresh CI VM they can be smaller than any interval. Every "when did this
last happen" in the package starts at ``None`` (never), not at ``0.0``: each test here runs the
first action with the clock at a few seconds after boot and would fail with a ``0.0`` start.
"""
from __future__ import annotations

import numpy as np
import pytest

from dask_research.replay.cluster import router as router_mod
from dask_research.replay.cluster import table as table_mod
from dask_research.replay.cluster.indices import encode
from dask_research.replay.cluster.table import ShardRef


class Clock:
    """A stand-in for a module's ``time``: ``monotonic``/``perf_counter`` read ``self.now``
    (seconds since boot), the rest is the real module's."""

    def __init__(self, now: float):
        import time

        self.now, self._time = now, time

    def monotonic(self) -> float:
        return self.now

    perf_counter = monotonic

    def __getattr__(self, name):
        return getattr(self._time, name)


# --- replay: the priority router's first shipment -----------------------------------------------

class _Future:
    status = "pending"


class _UpdateClient:
    def __init__(self):
        self.shipped = []

    def submit(self, fn, plane, uid, keys, prios, **kw):
        self.shipped.append(keys.tolist())
        return _Future()


class _Table:
    def get(self, sid):
        return ShardRef(sid, f"tcp://w{sid}:1", f"u{sid}")

    def is_local(self, ref):
        return False


@pytest.mark.parametrize("uptime", [0.5, 5.0, 59.0])
def test_the_first_priority_shipment_goes_out_on_a_machine_up_less_than_the_interval(monkeypatch, uptime):
    clock = Clock(uptime)
    monkeypatch.setattr(router_mod, "time", clock)
    client = _UpdateClient()
    router = router_mod.PriorityRouter(client, "p", _Table(), interval=60.0)
    router.queue(encode(0, [1, 2]), np.ones(2))
    router.ship(force=False)
    assert client.shipped == [[1, 2]]                  # never shipped before: it goes now
    router.queue(encode(0, [3]), np.ones(1))
    clock.now += 30.0
    router.ship(force=False)                           # 30 s later: within the interval, kept
    assert client.shipped == [[1, 2]]
    clock.now += 31.0
    router.ship(force=False)                           # the interval is over
    assert client.shipped == [[1, 2], [3]]


# --- replay: the shard table's first refresh ---------------------------------------------------

@pytest.mark.parametrize("uptime", [0.5, 5.0])
def test_the_first_shard_table_refresh_happens_on_a_machine_up_less_than_the_interval(monkeypatch, uptime):
    from dask_research.replay import UniformSampler
    from dask_research.replay.cluster import WorkerShard
    from dask_research.replay.cluster.eventlog import PlaneEvents
    from dask_research.testing.fake_cluster import FakeClient

    clock = Clock(uptime)
    monkeypatch.setattr(table_mod, "time", clock)
    client = FakeClient("p")
    client.add("tcp://w:1", WorkerShard("p", {"x": ((2,), "float32")}, 100, UniformSampler(), seed=0,
                                        address="tcp://w:1")).ingest({"x": np.zeros((30, 2), np.float32)})
    table = table_mod.ShardTable(client, "p", {"x": ((2,), "float32")}, UniformSampler(),
                                 PlaneEvents(client, "p", "research.replay"), seed=0,
                                 refresh_interval=10.0, worker=None)
    assert table.maybe_refresh() is True and client.runs == 1      # never refreshed: now
    assert [r.size for r in table.refs()] == [30]
    clock.now += 5.0
    assert table.maybe_refresh() is False and client.runs == 1     # within the interval
    clock.now += 5.0
    assert table.maybe_refresh() is True and client.runs == 2


# --- montecarlo: the first look at what runs where, and at overdue groups ------------------------

def test_the_first_look_at_the_blocks_in_flight_happens_on_a_machine_up_half_a_second():
    from dask_research.montecarlo.stragglers import Stragglers
    from dask_research.montecarlo.timing import Limits

    class Client:
        def processing(self):
            return {"tcp://w:1": ["mc-block-x-0-1"]}

    class Future:
        key = "mc-block-x-0-1"

    fut = Future()
    s = Stragglers(Client(), Limits(block=1, shard_seconds=1.0), speculate=0.0, poll=0.2,
                   bounds=[(0, 1)], emit=print)
    assert s.watch(0.5, {fut: 0}) == {"mc-block-x-0-1": "tcp://w:1"}   # read at once, not after 1 s
    assert s.running["mc-block-x-0-1"] == (0.5, "tcp://w:1")           # its clock starts here
    assert s.watch(0.9, {fut: 0}) is None                               # then at most once a second
    assert s.watch(1.6, {fut: 0}) is not None


def test_overdue_groups_are_looked_for_on_the_first_turn_on_a_machine_up_half_a_second(monkeypatch):
    from dask_research import montecarlo as mc
    from dask_research.montecarlo import block_watch, engine
    from dask_research.montecarlo.run_settings import RunSettings
    from dask_research.testing.faults import broken_here

    job = mc.Job(broken_here, {"a": mc.Normal(1, 0.1), "b": mc.Normal(2, 0.2)}, shards=16,
                 samples_per_shard=512, seed=3, bins=32, range=(0.0, 1.0))
    ex = engine.Execution(None, job, job.make_reducer(job.range), 4, settings=RunSettings.parse(speculate=0))
    looked = []

    class Collector:
        def done(self):
            return False

    class Member:
        status, key = "finished", "mc-block-x-0-4"

    ex.window.groups.add(Collector(), [Member()])
    monkeypatch.setattr(ex.window.groups, "overdue", lambda now, bound, *rest: looked.append(now) or [])
    monkeypatch.setattr(block_watch, "time", Clock(0.5))
    ex.watch.after_turn(ending=True, finished={})
    assert looked == [0.5]


# --- experiments: the run's clock before it begins -------------------------------------------------

def test_the_experiment_clock_reads_zero_before_the_run_begins_not_the_machines_uptime(monkeypatch):
    from dask_research.experiments import Hypothesis
    from dask_research.experiments import recorder as recorder_mod
    from dask_research.experiments.ledger import BranchLedger

    clock = Clock(5.0)
    monkeypatch.setattr(recorder_mod, "time", clock)
    led = BranchLedger(c=1.0)
    led.add([Hypothesis("a1", "a")])
    rec = recorder_mod.Recorder(slots=1, trace_scores=None, ledger=led)
    assert rec.now() == 0.0                          # not begun: 0, not 5 s of uptime
    trace = rec.begin([], elapsed=2.0)               # a resumed run: 2 s already elapsed
    clock.now = 6.5
    assert rec.now() == pytest.approx(3.5)
    rec.emit("dispatch", "a", "a1", 0)
    assert [e.t for e in trace] == [pytest.approx(3.5)]


# --- replay: the ingest rate of a plane's first calls ------------------------------------------------

def test_the_ingest_rate_is_measured_from_the_first_ingest_on_a_machine_up_a_second(monkeypatch):
    from dask_research.replay import stats as stats_mod

    clock = Clock(1.0)
    monkeypatch.setattr(stats_mod, "time", clock)
    c = stats_mod.PlaneCounters()
    assert np.isnan(c.figures(inserted=0)["ingest_rate"])      # nothing ingested: no rate
    c.ingested(t0=0.5)                                          # 0.5 s to 1.0 s after boot
    clock.now = 1.5
    c.ingested(t0=1.25)
    f = c.figures(inserted=100)
    assert f["ingest_calls"] == 2 and f["ingest_rate"] == pytest.approx(100 / 1.0)
