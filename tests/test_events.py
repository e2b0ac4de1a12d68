"""The one event layer: envelope, topics from config, the batched ordered outbox, the reader."""
from __future__ import annotations

import asyncio
import logging
import threading

import dask
import pytest
from distributed.utils_test import gen_cluster

from dask_research import events
from dask_research.events import Outbox, batch, envelope, topic, unpack

# ------------------------------------------------------------------------------ vocabulary

def test_every_subsystem_has_a_topic_from_config():
    assert {s: topic(s) for s in events.SUBSYSTEMS} == {
        "montecarlo": "research.montecarlo", "experiments": "research.experiments",
        "replay": "research.replay", "power": "research.power", "cluster": "research.cluster"}
    with dask.config.set({"research.power.event-topic": "lab.power"}):
        assert topic("power") == "lab.power"


def test_the_envelope_carries_version_source_kind_run_time_then_fields():
    msg = envelope("montecarlo", "check", "r1", shard=3, match=True)
    assert list(msg)[:5] == ["v", "source", "event", "run", "time"]
    assert msg["v"] == events.VERSION and msg["source"] == "montecarlo" and msg["event"] == "check"
    assert msg["run"] == "r1" and isinstance(msg["time"], float) and msg["shard"] == 3
    for key in ("v", "event"):        # source, run and time are the envelope's own arguments
        with pytest.raises(ValueError, match=f"'{key}' is reserved"):
            envelope("montecarlo", "check", **{key: 1})


def test_unpack_opens_batches_and_reads_the_shapes_before_the_envelope():
    old_mc = {"event": "accepted", "run": "r", "start": 0, "stop": 2}           # Monte-Carlo before
    old_batch = {"event": "batch", "run": "e", "events": [{"event": "add", "run": "e"}, "junk"]}
    old_power = {"action": "pause", "worker": "tcp://w:1"}
    new = batch("experiments", "e", [envelope("experiments", "select", "e", time=1.0)])
    log = [(1.0, old_mc), (2.0, "not a dict"), (3.0, old_batch), (4.0, old_power), (5.0, new),
           (6.0, {"event": "batch", "events": None})]
    assert [(t, m.get("event") or m.get("action")) for t, m in unpack(log)] == [
        (1.0, "accepted"), (3.0, "add"), (4.0, "pause"), (5.0, "select")]


# ------------------------------------------------------------------------------ a fake client

class FakeClient:
    """A client whose loop runs in a thread and whose scheduler records each round trip."""

    def __init__(self, fanout: bool = True, fail: bool = False, delay: float = 0.0, lists_only: bool = False):
        self.fanout, self.fail, self.delay, self.lists_only = fanout, fail, delay, lists_only
        self.packed = 0                              # shipments that came as one msgpack blob
        self.trips: list[tuple[str, list]] = []     # (how, messages) per round trip
        self.in_flight = self.max_in_flight = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.loop = type("IOLoop", (), {"asyncio_loop": self._loop})()
        self.scheduler = type("Rpc", (), {"address": f"fake://{id(self)}", "log_event": self._log_event,
                                          events.HANDLER: self._log_events, "get_metadata": self._metadata})()

    async def _trip(self, how: str, msgs: list) -> None:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
            if self.fail:
                raise OSError("scheduler gone")
            self.trips.append((how, msgs))
        finally:
            self.in_flight -= 1

    async def _log_event(self, topic, msg):
        await self._trip("log_event", [msg])

    async def _metadata(self, keys, default=None):
        if not self.fanout or keys != events.METADATA:
            return default                   # not preloaded: nothing there
        return {"handler": events.HANDLER, "packed": not self.lists_only}

    async def _log_events(self, topic, msgs=None, packed=None):
        if not self.fanout:
            return None                  # what a scheduler without the handler answers
        if packed is not None:
            assert not self.lists_only       # it said it takes lists only
            self.packed += 1
            msgs = events.unpack_shipment(packed)
        await self._trip("fanout", list(msgs))
        return len(msgs)

    def logged(self) -> list:
        return [m for _, msgs in self.trips for m in msgs]

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


@pytest.fixture
def fake():
    made: list[FakeClient] = []

    def make(**kwargs) -> FakeClient:
        made.append(FakeClient(**kwargs))
        return made[-1]

    yield make
    for c in made:
        c.close()


def test_an_outbox_waiting_on_a_slow_scheduler_holds_at_most_max_queued_events(fake, caplog):
    client = fake(delay=1.0)                 # every round trip takes a second
    box = Outbox(client, "montecarlo", linger=0)
    box.MAX_QUEUED = 10
    with caplog.at_level(logging.WARNING, logger="dask_research.events"):
        for i in range(200):                 # the first shipment is in flight while these queue
            box.put({"event": "x", "i": i})
            assert len(box._queue) <= 10
        assert box.flush(120)
    got = [m["i"] for m in client.logged()]
    assert box.dropped == 200 - len(got) > 0 and got == sorted(got) and got[-1] == 199   # the newest kept
    assert sum("dropping the oldest" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.timeout(60, method="thread")
@gen_cluster(client=True)
async def test_a_worker_outbox_puts_each_event_on_the_workers_stream_and_never_raises(c, s, a, b):
    box = Outbox(a, "cluster")
    box.put(envelope("cluster", "malloc-tuning", applied=True))
    for _ in range(2000):
        logged = [m for _, m in s.get_events("research.cluster")]
        if logged:
            break
        await asyncio.sleep(0.01)
    assert logged[0]["event"] == "malloc-tuning" and logged[0]["worker"] == a.address
    assert box.sent == 1 and box.flush() is True
    a.log_event = None                       # a worker whose stream is gone: counted, not raised
    box.put(envelope("cluster", "malloc-tuning"))
    assert box.failed == 1 and box.flush() is False


def test_no_client_drops_events():
    box = Outbox(None, "montecarlo")
    box.emit("start", "r")
    assert box.flush() and box.sent == box.failed == 0


def test_the_outbox_keeps_order_with_one_shipment_in_flight_and_batches_what_queues(fake):
    c = fake(delay=0.005)
    box = Outbox(c, "montecarlo")
    producers = []

    def produce(k: int) -> None:
        for i in range(50):
            box.emit("accepted", "r", producer=k, i=i)

    for k in range(3):                               # three threads emit at once
        producers.append(threading.Thread(target=produce, args=(k,)))
        producers[-1].start()
    for t in producers:
        t.join()
    assert box.flush(10)
    logged = c.logged()
    assert len(logged) == box.sent == 150 and box.failed == 0
    for k in range(3):                               # each producer's events in its order
        assert [m["i"] for m in logged if m["producer"] == k] == list(range(50))
    assert c.max_in_flight == 1                      # one shipment at a time
    assert box.shipments == len(c.trips) < 150       # many events per round trip
    assert {how for how, _ in c.trips} <= {"fanout", "log_event"}
    assert all(len(msgs) == 1 for how, msgs in c.trips if how == "log_event")


def test_a_shipment_travels_packed_and_numpy_values_arrive_as_python_numbers(fake):
    import numpy as np

    c = fake()
    box = Outbox(c, "montecarlo", linger=0)
    box.emit("accepted", "r", mean=np.float64(0.25), counts=np.arange(3), shards=np.int64(4))
    assert box.flush(10)
    (msg,) = c.logged()
    assert c.packed == 1 and msg["mean"] == 0.25 and msg["counts"] == [0, 1, 2] and msg["shards"] == 4
    assert type(msg["shards"]) is int


def test_an_event_msgpack_cannot_hold_goes_unpacked_and_still_in_one_call(fake):
    c = fake()
    box = Outbox(c, "montecarlo", linger=0)
    box.emit("accepted", "r", where=complex(1, 2))   # no msgpack form: Dask's own encoding takes it
    assert box.flush(10)
    assert c.packed == 0 and [how for how, _ in c.trips] == ["fanout"]
    assert c.logged()[0]["where"] == complex(1, 2)


def test_a_handler_that_takes_lists_only_gets_lists(fake):
    c = fake(lists_only=True)
    box = Outbox(c, "montecarlo", linger=0)
    for i in range(3):
        box.emit("accepted", "r", i=i)
        assert box.flush(10)
    assert [m["i"] for m in c.logged()] == [0, 1, 2] and box.failed == 0
    assert {how for how, _ in c.trips} == {"fanout"} and c.packed == 0
    assert events._PACKED[c.scheduler.address] is False


def test_one_event_goes_through_the_handler_once_it_is_known(fake):
    c = fake()
    box = Outbox(c, "montecarlo", linger=0)
    for i in range(3):                               # shipments of one event each
        box.emit("accepted", "r", i=i)
        assert box.flush(10)
    assert [how for how, _ in c.trips] == ["fanout"] * 3


def test_a_scheduler_that_refuses_the_fanout_gets_one_log_event_per_event(fake):
    c = fake(fanout=False, delay=0.005)
    box = Outbox(c, "montecarlo")
    for i in range(20):
        box.emit("accepted", "r", i=i)
    assert box.flush(10)
    assert [m["i"] for m in c.logged()] == list(range(20))
    assert {how for how, _ in c.trips} == {"log_event"}
    assert events._FANOUT[c.scheduler.address] is False


def test_paced_events_share_shipments_and_a_flush_cuts_the_linger_short(fake):
    c = fake()
    box = Outbox(c, "montecarlo", linger=0.05)
    for i in range(40):                              # one event a millisecond, like blocks arriving
        box.emit("accepted", "r", i=i)
        threading.Event().wait(0.001)
    assert box.flush(10)
    assert [m["i"] for m in c.logged()] == list(range(40))
    assert box.shipments < 10 and any(how == "fanout" for how, _ in c.trips)
    patient = Outbox(c, "montecarlo", linger=60.0)   # would wait a minute for company
    patient.emit("done", "r")
    assert patient.flush(10) and c.logged()[-1]["event"] == "done"


def test_a_flush_that_times_out_says_so(fake):
    c = fake(delay=1.0)
    box = Outbox(c, "montecarlo", linger=0)
    box.emit("start", "r")
    assert box.flush(0.05) is False and box.last_error is None     # late, not lost
    assert box.flush(10) is True and box.sent == 1


def test_a_failed_send_is_logged_never_raised(fake, caplog):
    c = fake(fail=True)
    box = Outbox(c, "montecarlo")
    with caplog.at_level(logging.WARNING, logger="dask_research.events"):
        box.emit("start", "r")
        box.emit("done", "r")
        assert box.flush(10) is False
    assert box.failed == 2 and box.sent == 0 and isinstance(box.last_error, OSError)
    assert "could not log montecarlo events" in caplog.text


def test_a_client_without_a_loop_costs_the_events_only():
    class NoLoop:
        loop = None

    box = Outbox(NoLoop(), "montecarlo")
    box.emit("start", "r")
    assert box.flush() is False and box.failed == 1


# ------------------------------------------------------------------------------ a real scheduler

@pytest.mark.timeout(60, method="thread")
@gen_cluster(client=True)
async def test_each_event_is_one_log_entry_shipped_in_one_round_trip(c, s, a, b):
    events.install(s)                    # what the preload does on a `dask scheduler`
    box = Outbox(c, "montecarlo")
    for i in range(40):                  # on the loop: all queue before the shipper runs
        box.emit("accepted", "run-1", start=i, stop=i + 1)
    assert await box.drain()
    logged = [m for _, m in s.get_events("research.montecarlo")]
    assert [m["start"] for m in logged] == list(range(40))
    assert all(m["source"] == "montecarlo" and m["run"] == "run-1" and m["v"] == 1 for m in logged)
    assert box.shipments == 1 and box.sent == 40
    assert events._FANOUT[c.scheduler.address] is True
    # the handler logs nothing else: no run-function entry in the scheduler's "all" topic
    assert not [m for _, m in s.get_events("all") if isinstance(m, dict) and m.get("action") == "run-function"]


@pytest.mark.timeout(60, method="thread")
@gen_cluster(client=True)
async def test_a_scheduler_without_this_package_still_gets_every_event_in_order(c, s, a, b):
    from distributed.utils_test import captured_logger

    assert events.HANDLER not in s.handlers             # not preloaded with dask_research
    with captured_logger("distributed.core", level=logging.WARNING) as log:
        box = Outbox(c, "montecarlo")
        for i in range(20):
            box.emit("accepted", "run-1", start=i)
        assert await box.drain()
    assert [m["start"] for _, m in s.get_events("research.montecarlo")] == list(range(20))
    assert events._FANOUT[c.scheduler.address] is False
    assert box.sent == 20 and box.failed == 0
    assert "No handler" not in log.getvalue()           # it was never asked for the handler


@pytest.mark.timeout(120, method="thread")
@gen_cluster(client=True, timeout=90)
async def test_events_queued_when_the_loop_cancels_its_tasks_are_still_logged_in_order(c, s, a, b):
    # What a user sees: the client's loop cancels the tasks running on it (as a loop shutting
    # down does) while events wait to be shipped; nothing is lost or reordered, and events
    # emitted afterwards are logged too, without any call to restart the outbox.
    box = Outbox(c, "montecarlo", linger=5.0)           # lingers: still waiting when cancelled
    before = asyncio.all_tasks()
    box.emit("accepted", "run-1", start=0)
    await asyncio.sleep(0)                              # the outbox's work is now on the loop
    started = [t for t in asyncio.all_tasks() - before if t is not asyncio.current_task()]
    assert started                                      # emit put work on the loop
    for t in started:
        t.cancel()
    await asyncio.gather(*started, return_exceptions=True)
    assert not s.get_events("research.montecarlo")     # cancelled before it shipped
    box.linger = 0.0
    box.emit("accepted", "run-1", start=1)

    def logged():
        return [m["start"] for _, m in s.get_events("research.montecarlo")]

    for _ in range(6000):                               # shipped on its own, no flush asked
        if logged() == [0, 1]:
            break
        await asyncio.sleep(0.01)
    assert logged() == [0, 1]
    assert await box.drain() is True and box.failed == 0 and box.sent == 2


@pytest.mark.timeout(60, method="thread")
@gen_cluster(client=True)
async def test_a_batched_outbox_logs_one_batch_envelope_per_shipment(c, s, a, b):
    box = Outbox(c, "experiments", run="e1", batched=True)
    for kind in ("add", "select", "dispatch"):
        box.put({"event": kind, "run": "e1"})
    assert await box.drain()
    (entry,) = [m for _, m in s.get_events("research.experiments")]
    assert entry["event"] == "batch" and entry["source"] == "experiments" and entry["run"] == "e1"
    assert [r["event"] for r in entry["events"]] == ["add", "select", "dispatch"]


