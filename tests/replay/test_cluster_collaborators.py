"""The cluster plane's collaborators without a cluster: delivery and the priority router driven
against a fake shard table, the real shard table against a fake client of fake workers.

Fault handling (a shard lost while its request waits, a worker replaced by a new shard, a
failed sample task, every shard lost, an empty plane, stale and lost priority updates) is
checked on the recorded trace of what delivery asked of the table, not on timings.
"""
from types import SimpleNamespace

import dask
import numpy as np
import pytest
from replay_helpers import CARTPOLE, make_batch

from dask_research import replay
from dask_research.replay.cluster import (
    ClusterBatchIterator,
    PriorityRouter,
    ShardRef,
    ShardsLostError,
    ShardTable,
    WorkerShard,
    decode,
    encode,
    shard_ops,
)
from dask_research.replay.cluster.eventlog import PlaneEvents
from dask_research.replay.cluster.table import assemble
from dask_research.replay.experience_plane import EmptyPlaneError
from dask_research.testing.fake_cluster import FakeClient, FakeFuture

SPEC = {"x": ((), "int64")}
FAST = {"research.replay.cluster.stall": 0.05, "research.replay.cluster.max-group": 1,
        "research.replay.rate-timeout": 3600.0}


class FakeTable:
    """What ClusterBatchIterator asks of a ShardTable; each shard answers as ``mode`` says:
    "ok", "hang" (its task never finishes), "error" (its task fails) or "replaced" (a new
    shard answers on its address). ``trace`` records every call in order."""

    def __init__(self, n_shards=2, local=None, mass=100.0):
        self.spec = replay.ExperienceSpec(SPEC)
        self.refs = {i: ShardRef(i, f"tcp://w{i}:1", f"u{i}", size=100, capacity=100, mass=mass)
                     for i in range(n_shards)}
        self.mode = dict.fromkeys(self.refs, "ok")
        self.local = local
        self.trace: list[tuple] = []
        self.futures: list[tuple[int, FakeFuture]] = []
        self.on_refresh = None            # what a refresh finds out (a worker left, data came)

    def __getitem__(self, sid):
        return self.refs[sid]

    def lose(self, sid, reason):
        ref = self.refs[sid]
        ref.lost, ref.lost_reason, ref.mass, ref.size = True, reason, 0.0, 0

    def allocate(self, n):
        live = [r for r in self.refs.values() if not r.lost and r.mass > 0]
        self.trace.append(("allocate", tuple(r.id for r in live)))
        if not live:
            if all(r.lost for r in self.refs.values()):
                raise ShardsLostError("fake", [{"id": r.id, "worker": r.address, "size": 100,
                                                "checkpointed": 0, "reason": r.lost_reason}
                                               for r in self.refs.values()])
            raise EmptyPlaneError()
        share = n // len(live)
        counts = {r.id: share for r in live}
        counts[live[0].id] += n - share * len(live)
        return counts

    def is_local(self, ref):
        return ref.id == self.local

    def _reply(self, sid, n):
        rec = self.spec.empty(n)
        rec["x"] = sid
        return {"records": rec, "keys": np.arange(n), "leaf": None, "info": {}, "sample_s": 0.0}

    def sample_future(self, ref, n):
        self.trace.append(("submit", ref.id, n))
        mode = self.mode[ref.id]
        if mode == "hang":
            fut = FakeFuture(status="pending")
        elif mode == "error":
            fut = FakeFuture(status="error", exc=RuntimeError(f"shard {ref.id} task failed"))
        elif mode == "replaced":
            fut = FakeFuture({**self._reply(ref.id, n), "records": None})
        else:
            fut = FakeFuture(self._reply(ref.id, n))
        self.futures.append((ref.id, fut))
        return fut

    def sample_local(self, n):
        self.trace.append(("local", self.local, n))
        return self._reply(self.local, n)

    def check_failure(self, sid, fut):        # as ShardTable: refresh, raise unless lost
        self.trace.append(("check_failure", sid))
        self.refresh()
        if not self.refs[sid].lost:
            raise fut.exception()

    def assemble(self, parts, batch_size):    # as ShardTable: a replaced shard is lost
        for sid, r in parts:
            if r["records"] is None:
                self.trace.append(("replaced", sid))
                self.lose(sid, "replaced")
                return None
        return assemble(self.spec, parts, None, 1.0)

    def refresh(self):
        self.trace.append(("refresh",))
        if self.on_refresh is not None:
            self.on_refresh(self)

    def maybe_refresh(self):
        self.trace.append(("maybe_refresh",))
        return False

    def remote_share(self):
        return 1.0

    def bandwidth(self):
        return 1e9


class FakeRouter:
    def __init__(self):
        self.ships: list[bool] = []

    def ship(self, force=True):
        self.ships.append(force)


def _deliver(table, n, router=None, **kw):
    router = router or FakeRouter()
    with dask.config.set(FAST):
        it = ClusterBatchIterator(table, router, batch_size=8, prefetch=2, max_batches=n, **kw)
        with it:
            batches = list(it)
    return batches, it, router


def _shards_of(batch):
    sids = decode(batch.indices)[0]
    assert (batch.x == sids).all()                     # each row came from the shard it names
    return set(sids.tolist())


def _submitted_after(trace, event):
    """Shard ids of the sample tasks submitted after the first ``event`` in ``trace``."""
    first = next(i for i, t in enumerate(trace) if t[0] == event)
    return {t[1] for t in trace[first + 1:] if t[0] == "submit"}


# --- delivery against a fake table ----------------------------------------------------------

@pytest.mark.timeout(60, method="thread")
def test_batches_are_drawn_from_every_live_shard_and_the_router_ships_from_the_thread():
    table = FakeTable()
    batches, it, router = _deliver(table, 5)
    assert len(batches) == 5 and all(_shards_of(b) == {0, 1} for b in batches)
    assert [len(b.indices) for b in batches] == [8] * 5
    s = it.summary()
    assert s["batches"] == 5 and s["discarded_batches"] == 0 and s["local_draws"] == 0
    assert s["remote_tasks"] == 2 * sum(t[0] == "allocate" for t in table.trace)
    assert router.ships and not any(router.ships)       # never forced by delivery
    assert ("maybe_refresh",) in table.trace            # the default upkeep


@pytest.mark.timeout(60, method="thread")
def test_upkeep_replaces_the_tables_periodic_refresh():
    calls = []
    _, it, _ = _deliver(FakeTable(), 3, upkeep=lambda: calls.append(1))
    assert calls and ("maybe_refresh",) not in it.table.trace


@pytest.mark.timeout(60, method="thread")
def test_a_shard_lost_while_its_request_waits_is_dropped_and_the_batch_drawn_again():
    table = FakeTable()
    table.mode[1] = "hang"                             # its worker died: the task never ends
    table.on_refresh = lambda t: t.lose(1, "worker left")
    batches, it, _ = _deliver(table, 4)
    assert all(_shards_of(b) == {0} for b in batches)
    assert it.summary()["discarded_batches"] >= 1
    assert _submitted_after(table.trace, "refresh") == {0}    # after the refresh: shard 0 only
    assert all(f.cancelled for sid, f in table.futures if sid == 1)


@pytest.mark.timeout(60, method="thread")
def test_a_replaced_shard_discards_the_request_and_is_never_drawn_again():
    table = FakeTable()
    table.mode[1] = "replaced"
    batches, it, _ = _deliver(table, 4)
    assert all(_shards_of(b) == {0} for b in batches)
    assert table.refs[1].lost_reason == "replaced"
    assert _submitted_after(table.trace, "replaced") == {0}
    assert sum(t[0] == "replaced" for t in table.trace) == 1       # lost once; the requests
    assert it.summary()["discarded_batches"] == sum(                # in flight with it: dropped
        t[:2] == ("submit", 1) for t in table.trace)


@pytest.mark.timeout(60, method="thread")
def test_a_failed_sample_task_asks_the_table_and_a_lost_shard_is_drawn_again():
    table = FakeTable()
    table.mode[1] = "error"
    table.on_refresh = lambda t: t.lose(1, "worker left")
    batches, _, _ = _deliver(table, 3)
    assert all(_shards_of(b) == {0} for b in batches)
    i = table.trace.index(("check_failure", 1))
    assert table.trace[i + 1] == ("refresh",)
    assert _submitted_after(table.trace, "check_failure") == {0}


@pytest.mark.timeout(60, method="thread")
def test_a_failed_task_of_a_live_shard_reaches_the_learner():
    table = FakeTable()
    table.mode[1] = "error"                            # the shard is alive: a real error
    with dask.config.set(FAST):
        it = ClusterBatchIterator(table, FakeRouter(), batch_size=8, prefetch=2)
        with pytest.raises(RuntimeError, match="shard 1 task failed"):
            next(it)
    assert it.closed


@pytest.mark.timeout(60, method="thread")
def test_every_shard_lost_is_raised_at_once_not_waited_for():
    table = FakeTable()
    with dask.config.set(FAST):
        it = ClusterBatchIterator(table, FakeRouter(), batch_size=8, prefetch=2)
        assert _shards_of(next(it)) == {0, 1}
        for sid in table.mode:
            table.mode[sid] = "hang"
        table.on_refresh = lambda t: [t.lose(s, "worker left") for s in t.refs]
        with pytest.raises(ShardsLostError) as e:        # rate-timeout is an hour
            for _ in range(1000):
                next(it)
    assert sorted(s["id"] for s in e.value.shards) == [0, 1]


@pytest.mark.timeout(60, method="thread")
def test_an_empty_plane_is_polled_until_actors_ingest():
    table = FakeTable(mass=0.0)
    refreshes = []

    def actors_arrive(t):
        refreshes.append(1)
        if len(refreshes) == 3:
            for r in t.refs.values():
                r.mass = 100.0

    table.on_refresh = actors_arrive
    batches, _, _ = _deliver(table, 2)
    assert len(batches) == 2 and len(refreshes) >= 3
    first = next(i for i, t in enumerate(table.trace) if t[0] == "submit")
    assert sum(t == ("refresh",) for t in table.trace[:first]) == 3


@pytest.mark.timeout(60, method="thread")
def test_an_empty_plane_raises_after_the_rate_timeout():
    with dask.config.set({**FAST, "research.replay.rate-timeout": 0.2}):
        it = ClusterBatchIterator(FakeTable(mass=0.0), FakeRouter(), batch_size=8, prefetch=2)
        with pytest.raises(EmptyPlaneError):
            next(it)


@pytest.mark.timeout(60, method="thread")
def test_the_learners_own_shard_is_drawn_in_process():
    table = FakeTable(local=0)
    batches, it, _ = _deliver(table, 4)
    assert all(_shards_of(b) == {0, 1} for b in batches)
    assert {t[1] for t in table.trace if t[0] == "submit"} == {1}    # no task for shard 0
    s = it.summary()
    assert s["local_draws"] == s["remote_tasks"] == sum(t[0] == "local" for t in table.trace)


# --- the priority router against a fake table -----------------------------------------------

class UpdateClient:
    """Records the update tasks the router submits; each applies every key it carries."""

    def __init__(self, status="finished"):
        self.tasks, self.status = [], status

    def submit(self, fn, plane, uid, keys, prios, workers, **kw):
        assert fn is shard_ops.update_priorities and kw["allow_other_workers"] is False
        self.tasks.append((workers[0], uid, keys.tolist(), prios.tolist()))
        return FakeFuture(len(keys), status=self.status)


class RouterTable:
    def __init__(self, local=None):
        self.refs = {i: ShardRef(i, f"tcp://w{i}:1", f"u{i}") for i in range(3)}
        self.refs[2].lost = True
        self.local = local
        self.local_updates = []

    def get(self, sid):
        return self.refs.get(sid)

    def is_local(self, ref):
        return ref.id == self.local

    def local_shard(self):
        def update(uid, keys, prios):
            self.local_updates.append((uid, keys.tolist()))
            return len(keys)
        return SimpleNamespace(update=update)


def test_the_router_sends_each_shard_its_own_updates_and_drops_lost_and_unknown_ones():
    client, table = UpdateClient(), RouterTable()
    router = PriorityRouter(client, "p", table, interval=60.0)
    idx = np.concatenate([encode(0, [5, 6]), encode(1, [7]), encode(2, [1, 2]), encode(9, [3])])
    assert router.queue(idx, np.arange(6.0)) == 6
    assert client.tasks == []                          # queued, not shipped
    assert router.flush() == 3
    assert sorted(client.tasks) == [("tcp://w0:1", "u0", [5, 6], [0.0, 1.0]),
                                    ("tcp://w1:1", "u1", [7], [2.0])]
    assert router.counters == {"updates_queued": 6, "updates_dropped_lost": 3,
                               "updates_applied": 3, "updates_unconfirmed": 0}
    assert [table.refs[i].updates_sent for i in range(3)] == [2, 1, 0]


def test_the_router_ships_at_most_every_interval_unless_forced():
    client = UpdateClient(status="pending")
    router = PriorityRouter(client, "p", RouterTable(), interval=3600.0)
    router.queue(encode(0, [1]), np.ones(1))
    router.ship(force=False)                           # the first one goes
    router.queue(encode(0, [2]), np.ones(1))
    router.ship(force=False)                           # within the interval: kept
    assert [t[2] for t in client.tasks] == [[1]]
    router.ship()
    assert [t[2] for t in client.tasks] == [[1], [2]]


def test_the_router_counts_updates_applied_by_earlier_shipments():
    client = UpdateClient()
    router = PriorityRouter(client, "p", RouterTable(), interval=0.0)
    router.queue(encode(0, [1, 2]), np.ones(2))
    router.ship()
    router.queue(encode(1, [3]), np.ones(1))
    router.ship()                                      # collects the finished first shipment
    assert router.counters["updates_applied"] == 2
    assert router.flush() == 1 and router.counters["updates_applied"] == 3


class VanishingClient(UpdateClient):
    """Its update tasks finish, but their replies are gone when fetched (the key cancelled
    meanwhile: Dask then raised CancelledError, or UnboundLocalError from its sync)."""

    def submit(self, *args, **kw):
        import asyncio

        f = super().submit(*args, **kw)
        f.result = lambda timeout=None: (_ for _ in ()).throw(asyncio.CancelledError())
        return f


def test_an_update_whose_reply_is_gone_is_counted_unconfirmed_and_does_not_stop_the_learner():
    router = PriorityRouter(VanishingClient(), "p", RouterTable(), interval=0.0)
    router.queue(encode(0, [1, 2]), np.ones(2))
    router.ship()
    router.queue(encode(1, [3]), np.ones(1))
    router.ship()                                      # collects the first: its reply is gone
    assert router.counters["updates_unconfirmed"] == 2
    assert router.flush() == 0
    assert router.counters == {"updates_queued": 3, "updates_dropped_lost": 0, "updates_applied": 0,
                               "updates_unconfirmed": 3}


def test_the_router_updates_the_learners_own_shard_in_process():
    client, table = UpdateClient(), RouterTable(local=1)
    router = PriorityRouter(client, "p", table, interval=0.0)
    router.queue(np.concatenate([encode(0, [1]), encode(1, [4, 5])]), np.ones(3))
    assert router.flush() == 1
    assert table.local_updates == [("u1", [4, 5])] and [t[0] for t in client.tasks] == [
        "tcp://w0:1"]
    assert router.counters["updates_applied"] == 3


# --- the real shard table against a fake client of fake workers -----------------------------

class FakeCluster(FakeClient):
    """The shared fake client with CartPole shards: ``start(address, n)`` adds a worker whose shard holds ``n``."""

    def __init__(self, name="p", sampler=None):
        super().__init__(name)
        self.sampler = sampler or replay.UniformSampler()

    def start(self, address, n=0, capacity=100):
        shard = WorkerShard(self.name, CARTPOLE, capacity, self.sampler, seed=len(self.workers), address=address)
        if n:
            shard.ingest(make_batch(n))
        return self.add(address, shard)


@pytest.fixture
def cluster():
    c = FakeCluster()
    yield c
    c.close()


class RecordedEvents(PlaneEvents):
    """The plane's events as the table emits them, kept by the fake cluster (the transport,
    dask_research.events.Outbox, is tested on its own in tests/test_events.py)."""

    def emit(self, kind, **data):
        self.client.events.append((self.topic, self.message(kind, **data)))


def _table(cluster, **kw):
    events = RecordedEvents(None, cluster.name, "research.replay")
    events.client = cluster
    return ShardTable(cluster, cluster.name, CARTPOLE, cluster.sampler, events, seed=0, **kw)


def _events(cluster, kind):
    return [m for _, m in cluster.events if m["event"] == kind]


def test_the_table_finds_new_shards_and_marks_a_departed_worker_lost_once(cluster):
    cluster.start("tcp://a:1", 30)
    cluster.start("tcp://b:1", 10)
    table = _table(cluster)
    table.refresh()
    assert [(r.id, r.address, r.size) for r in table.refs()] == [(0, "tcp://a:1", 30),
                                                                 (1, "tcp://b:1", 10)]
    assert [e["shard"] for e in _events(cluster, "shard-new")] == [0, 1]
    cluster.stop("tcp://a:1")
    table.refresh()
    table.refresh()
    a = table[0]
    assert a.lost and a.lost_reason == "worker left" and a.lost_size == 30 and a.size == 0
    lost = _events(cluster, "shard-lost")
    assert [{k: v for k, v in m.items() if k != "time"} for m in lost] == [
        {"v": 1, "source": "replay", "event": "shard-lost", "run": None, "plane": "p", "shard": 0,
         "worker": "tcp://a:1", "reason": "worker left", "size": 30, "checkpointed": 0}]
    assert isinstance(lost[0]["time"], float)
    assert table.id_of("tcp://a:1") is None and table.addresses() == ["tcp://b:1"]
    assert table.size() == 10 and table.allocate(64) == {1: 64}


def test_a_new_shard_on_the_same_address_replaces_the_old_one_under_a_new_id(cluster):
    cluster.start("tcp://a:1", 30)
    table = _table(cluster)
    table.refresh()
    cluster.stop("tcp://a:1")
    cluster.start("tcp://a:1", 5)                     # a restarted worker, a fresh shard
    table.refresh()
    old, new = table.refs()
    assert old.lost and old.lost_reason == "replaced" and not new.lost
    assert (new.id, new.size, table.id_of("tcp://a:1")) == (1, 5, 1)


def test_a_sample_reply_from_a_replaced_shard_is_discarded_and_the_shard_lost(cluster):
    cluster.start("tcp://a:1", 30)
    cluster.start("tcp://b:1", 30)
    table = _table(cluster)
    table.refresh()
    a, b = table.refs()
    good = table.sample_future(b, 4).result()
    stale = shard_ops.sample("p", 4, "some-older-uid", dask_worker=cluster.workers["tcp://a:1"])
    assert table.assemble([(a.id, stale), (b.id, good)], 8) is None
    assert a.lost and a.lost_reason == "replaced" and table.counters["sampled"] == 0
    batch = table.assemble([(b.id, good)], 4)
    assert decode(batch.indices)[0].tolist() == [b.id] * 4 and table.counters["sampled"] == 4


def test_a_late_reply_does_not_roll_a_shard_back(cluster):
    shard = cluster.start("tcp://a:1", 10)
    table = _table(cluster)
    old = shard.info()
    shard.ingest(make_batch(20, start=10))
    table.refresh()
    table[0].update(old)                              # a prefetched reply, arriving late
    assert table[0].size == 30


def test_allocation_follows_mass_and_skips_empty_shards(cluster):
    cluster.start("tcp://a:1", 75)
    cluster.start("tcp://b:1", 25)
    cluster.start("tcp://c:1", 0)
    table = _table(cluster)
    table.refresh()
    total = {0: 0, 1: 0}
    for _ in range(200):
        for sid, n in table.allocate(100).items():
            total[sid] += n
    assert set(total) == {0, 1} and 0.72 < total[0] / 20_000 < 0.78


def test_nothing_to_sample_says_empty_while_a_shard_lives_and_lost_when_none_does(cluster):
    cluster.start("tcp://a:1", 0)
    cluster.start("tcp://b:1", 40)
    table = _table(cluster)
    table.refresh()
    cluster.stop("tcp://b:1")
    table.refresh()
    with pytest.raises(EmptyPlaneError):               # shard a lives: actors may come
        table.allocate(8)
    cluster.stop("tcp://a:1")
    table.refresh()
    with pytest.raises(ShardsLostError) as e:
        table.allocate(8)
    assert sorted((s["id"], s["size"]) for s in e.value.shards) == [(0, 0), (1, 40)]
    table[1].restored_to = 0                           # restored: counted where it went
    assert [s["id"] for s in table.nothing_to_sample().shards] == [0]


def test_a_lost_shard_remembers_its_last_checkpoint(cluster, tmp_path):
    shard = cluster.start("tcp://a:1", 30)
    cluster.start("tcp://b:1", 10)
    table = _table(cluster, checkpoint_dir=str(tmp_path))
    table.refresh()
    shard.checkpoint(tmp_path / "p")
    shard.ingest(make_batch(5, start=30))              # never checkpointed
    table.refresh()
    cluster.stop("tcp://a:1")
    table.refresh()
    assert table[0].checkpoint["size"] == 30 and table[0].lost_size == 35
    assert _events(cluster, "shard-lost")[0]["checkpointed"] == 30
    assert table.find_checkpoint("no-such-uid") is None


def test_a_failed_task_of_a_shard_is_explained_by_a_refresh(cluster):
    cluster.start("tcp://a:1", 0)
    table = _table(cluster)
    table.refresh()
    table[0].size, table[0].mass = 5, 5.0              # the table thinks it holds data
    empty = table.sample_future(table[0], 4)           # it does not: EmptyPlaneError there
    assert empty.status == "error"
    table.check_failure(0, empty)
    assert (table[0].size, table[0].mass) == (0, 0.0)
    broken = FakeFuture(status="error", exc=ValueError("bug"))
    with pytest.raises(ValueError, match="bug"):
        table.check_failure(0, broken)
    cluster.stop("tcp://a:1")
    table.check_failure(0, broken)                     # its worker left: the shard is lost
    assert table[0].lost


def test_bandwidth_of_the_shards_workers_else_the_scheduler_s_else_a_default(cluster):
    cluster.start("tcp://a:1", 10)
    cluster.start("tcp://b:1", 10)
    cluster.bw = {"total": 5e8, "workers": {"tcp://a:1": 1e9, "tcp://b:1": 3e9, "x": 7.0}}
    table = _table(cluster)
    table.refresh()
    assert table.bandwidth() == 2e9
    cluster.bw = {"total": 5e8, "workers": {}}
    table.refresh()
    assert table.bandwidth() == 5e8
    cluster.bw = {"total": float("nan"), "workers": {}}
    table.refresh()
    assert table.bandwidth() == 100e6


def test_the_learners_own_shard_is_local_and_out_of_the_remote_share(cluster):
    cluster.start("tcp://a:1", 30)
    cluster.start("tcp://b:1", 10)
    table = _table(cluster, worker=cluster.workers["tcp://a:1"])
    table.refresh()
    assert table.is_local(table[0]) and not table.is_local(table[1])
    assert table.remote_share() == pytest.approx(0.25)
    assert len(table.sample_local(7)["keys"]) == 7


def test_refresh_calls_its_hook_and_maybe_refresh_keeps_the_interval(cluster):
    cluster.start("tcp://a:1", 10)
    calls = []
    table = _table(cluster, refresh_interval=3600.0, on_refresh=lambda: calls.append(1))
    assert table.maybe_refresh() is True and calls == [1]
    assert table.maybe_refresh() is False and calls == [1]
    table.refresh()
    assert calls == [1, 1]


def test_a_scheduler_without_bandwidth_figures_is_said_once_and_the_default_used(cluster, caplog):
    from dask_research._compat import DaskCompatError

    def moved(fn):
        raise DaskCompatError("distributed's Scheduler.bandwidth_workers is gone")

    cluster.start("tcp://a:1", 10)
    cluster.run_on_scheduler = moved
    table = _table(cluster)
    with caplog.at_level("WARNING", logger="dask_research.replay.cluster.table"):
        table.refresh()
        table.refresh()
    said = [r for r in caplog.records if "no bandwidth measurement" in r.getMessage()]
    assert len(said) == 1 and "bandwidth_workers" in said[0].getMessage()
    assert table.bandwidth() == 100e6 and not table[0].lost
