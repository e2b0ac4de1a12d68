"""The engine's parts on their own: keys, the tree folder, timing, stragglers, checks' judgement,
the arrivals of futures, failures."""
from __future__ import annotations

import asyncio
import statistics
import time
from types import SimpleNamespace

import numpy as np
import pytest
from distributed import Client, LocalCluster
from hypothesis import given, settings
from hypothesis import strategies as st

from dask_research import montecarlo as mc
from dask_research.exceptions import PipelineError, ResearchError
from dask_research.montecarlo.arrivals import Arrivals
from dask_research.montecarlo.checks import Checks, Producers
from dask_research.montecarlo.failures import LOST, lost_scheduler, lost_scheduler_error, raise_if_cancelled
from dask_research.montecarlo.folding import TreeFolder
from dask_research.montecarlo.keys import block_key, parse_block_key, verify_key
from dask_research.montecarlo.stragglers import Stragglers
from dask_research.montecarlo.submission import submit_many
from dask_research.montecarlo.timing import Limits, RunningMedian
from dask_research.montecarlo.tree import tree_fold

# -- keys ---------------------------------------------------------------------------------------

def test_block_keys_are_what_the_dashboard_parses():
    tag = "0a1b2c3d4e5f-9f8e7d"
    variants = [{}, {"speculative": True}, {"tree": False}, {"retry": 3}]
    kinds = []
    for kw in variants:
        parsed = parse_block_key(block_key(tag, 256, 512, **kw))
        assert parsed and parsed.tag == tag and (parsed.start, parsed.stop) == (256, 512)
        kinds.append(parsed.kind)
    assert kinds == ["block", "spec", "redo", "retry3"]
    assert verify_key(tag, 7) == f"mc-verify-{tag}-7" and verify_key(tag, 7, attempt=1).endswith("-7-m1")
    assert parse_block_key(verify_key(tag, 7)) is None            # checks are not blocks


def test_submit_many_is_one_map_call_over_the_columns():
    calls = []
    client = SimpleNamespace(map=lambda func, *cols, **kw: calls.append((func, cols, kw)) or ["f1", "f2"])
    futs = submit_many(client, max, [(1, 2), (3, 4)], ["k1", "k2"], workers=["w"], trim=True)
    assert futs == ["f1", "f2"]
    (func, cols, kw), = calls
    assert func is max and cols == ([1, 3], [2, 4])
    assert kw == {"key": ["k1", "k2"], "pure": False, "workers": ["w"], "allow_other_workers": False, "trim": True}
    assert submit_many(client, max, [], []) == [] and len(calls) == 1
    client.submit = lambda func, *args, **kw: calls.append((func, args, kw)) or "f3"
    assert submit_many(client, max, [(5, 6)], ["k3"]) == ["f3"]                  # one task: one submit
    assert calls[-1] == (max, (5, 6), {"key": "k3", "pure": False})


# -- the tree -----------------------------------------------------------------------------------

@settings(deadline=None)
@given(st.integers(1, 40).flatmap(lambda n: st.permutations(list(range(n)))))
def test_the_folder_gives_the_fixed_trees_root_in_any_arrival_order(order):
    merge = lambda a, b: f"({a} {b})"
    folder = TreeFolder(len(order), merge)
    for i, m in enumerate(order):
        assert folder.root is None
        folder.arrive(m, str(m))
        assert (folder.root is None) == (i < len(order) - 1)
    assert folder.root == tree_fold(merge, [str(m) for m in range(len(order))]) and not folder.nodes


# -- timing and stragglers ------------------------------------------------------------------------

@settings(deadline=None)
@given(st.lists(st.floats(0, 1e3, allow_nan=False), max_size=60))
def test_the_running_median_is_statistics_median(values):
    m = RunningMedian()
    for i, v in enumerate(values):
        m.append(v)
        assert m.median() == statistics.median(values[:i + 1]) and len(m) == i + 1
    assert values or m.median() is None


class Fut:
    def __init__(self, key, status="pending"):
        self.key, self.status = key, status

    def done(self):
        return self.status != "pending"

    def cancel(self):
        self.status = "cancelled"


def test_a_block_past_the_block_timeout_fails_the_run_naming_it():
    limits = Limits(block=4)
    limits.block_timeout = 10.0
    s = Stragglers(None, limits, speculate=0.0, poll=0.2, bounds=[(0, 4), (4, 8)], emit=lambda *a, **k: None)
    first, copy = Fut("mc-block-t-4-8"), Fut("mc-spec-t-4-8")
    s.running.update({first.key: (100.0, "tcp://w1"), copy.key: (105.0, "tcp://w2")})
    s.check_hung(109.0, {first: 1, copy: 1}, {1: [first, copy]})          # 9 s: within the limit
    with pytest.raises(PipelineError, match=r"shard 4-7: did not return within 11\.0 s on worker tcp://w1 .*"
                       r"allows 10\.0 s.*; a copy has run 6\.0 s on worker tcp://w2"):
        s.check_hung(111.0, {first: 1, copy: 1}, {1: [first, copy]})


def test_a_straggler_is_copied_once_and_a_slow_copy_stops_speculation():
    events, copies = [], []
    s = Stragglers(None, Limits(block=1), speculate=2.0, poll=0.2, bounds=[(0, 1), (1, 2), (2, 3)],
                   emit=lambda kind, **d: events.append((kind, d)))
    s.durations.extend([1.0, 1.0])
    late = {2: [Fut("mc-block-t-2-3")]}
    s.running[late[2][0].key] = (0.0, "tcp://slow")
    copy = lambda idx, worker: copies.append((idx, worker)) or late[idx].append(Fut("mc-spec-t-2-3"))
    done = {0: "state", 1: "state"}
    s.speculate_copies(10.0, {}, True, done, late, copy)         # first seen at the end now: not yet
    assert copies == []
    s.speculate_copies(11.0, {}, False, done, late, copy)        # blocks left to submit: not the end
    s.speculate_copies(12.5, None, True, done, late, copy)       # the scheduler was not read this turn
    assert copies == []
    s.speculate_copies(12.5, {}, True, done, late, copy)         # 2.5 s > 2 x the median
    assert copies == [(2, "tcp://slow")]
    s.running[late[2][1].key] = (12.5, "tcp://fast")
    s.speculate_copies(13.0, {}, True, done, late, copy)         # the copy runs: no second copy
    assert copies == [(2, "tcp://slow")] and not s.stopped
    s.speculate_copies(15.0, {}, True, done, late, copy)         # the copy is as slow: stop for the run
    assert s.stopped and events == [("speculate-stopped", {"start": 2, "stop": 3, "seconds": 2.5})]


def test_a_group_that_finished_on_a_worker_frozen_since_is_opened():
    """Issue 26's stress gate: a group's collector finished on a worker that froze before the
    client fetched it. Dask keeps the future 'finished' there (the worker is not dead yet), so
    the group was never timed as late, its blocks were never asked one by one, and the run
    waited for the frozen worker. Its blocks must be waited on one by one instead."""
    from dask_research.montecarlo.block_watch import BlockWatch
    from dask_research.montecarlo.groups import Groups

    opened = []
    groups = Groups(2)
    collector, members = Fut("mc-group-t-0-2", "finished"), [Fut("mc-block-t-0-1", "finished"),
                                                             Fut("mc-block-t-1-2", "finished")]
    groups.add(collector, members)
    window = SimpleNamespace(groups=groups, pending={m: i for i, m in enumerate(members)}, attempts={},
                             bounds=[(0, 1), (1, 2)], open_group=lambda c: (opened.append(groups.open(c)), (0, 2))[1])
    limits = Limits(block=1)
    limits.block_timeout = None
    arrivals = Arrivals(None, bound=lambda: 1.0)
    events: list = []
    watch = BlockWatch(None, window, limits, arrivals, speculate=0.0, attempts=2,
                       emit=lambda kind, **data: events.append((kind, data)))
    watch.accepted(["mc-block-t-9-10"], seconds=0.5, computed=1)     # blocks take 0.5 s
    clock = iter([100.0, 102.0, 104.0, 106.0])
    real = time.monotonic
    time.monotonic = lambda: next(clock)
    try:
        watch.after_turn(ending=False, finished={})      # it finished: fetched by the next turn, as a rule
        arrivals.unfetched[collector.key] = (102.0, 1.0)  # ... but its fetch timed out: its holder froze
        watch.after_turn(ending=False, finished={})
        watch.after_turn(ending=False, finished={})
        assert opened == []                               # within 1 + (2 + 2) x 0.5 s of being seen unfetched
        watch.after_turn(ending=False, finished={})
    finally:
        time.monotonic = real
    assert opened == [members] and collector.status == "cancelled" and collector not in groups
    assert events == [("group-opened", {"start": 0, "stop": 2, "reason": "late"})]     # and it is traced


@pytest.mark.timeout(120, method="thread")
def test_a_holder_that_does_not_answer_holds_its_own_results_not_the_drivers_turns():
    """A result held by a worker that does not answer (behind a partition, frozen) is fetched
    beside the driver's turns: a turn returns while that fetch is in flight, the next turn
    brings another worker's result, and the fetch is stopped when the run ends. (The turn
    used to wait for the gather's bound twice over, and a worker cut off for twice the block
    timeout had its running blocks rescued in no turn at all.)"""
    stuck, good = Fut("mc-block-t-0-1", "finished"), Fut("mc-block-t-1-2", "finished")

    class Client:
        async def _gather(self, futs):
            if stuck in futs:
                await asyncio.Event().wait()            # never answers
            return [f.key for f in futs]

        def gather(self, futs, asynchronous=True):
            return self._gather(futs)

    arrivals = Arrivals(Client(), bound=lambda: 600.0)
    wanted = {stuck, good}

    async def turns():
        arrivals._ended[stuck] = None                   # it finished on the worker that went silent
        first = await arrivals.collect(wanted, 0.05)
        in_flight = arrivals.fetching
        arrivals._ended[good] = None                    # then one finished on a worker that answers
        second = await arrivals.collect(wanted, 0.05)
        still = arrivals.fetching
        await arrivals.close()
        return first, in_flight, second, still, arrivals.fetching

    first, in_flight, second, still, after = asyncio.run(turns())
    assert first == ([], {}) and in_flight == 1        # the turn came back; the fetch goes on
    assert second == ([good], {good: "mc-block-t-1-2"}) and still == 1
    assert after == 0 and stuck.key not in arrivals.unfetched    # stopped, not recorded as a timeout


@pytest.mark.timeout(120, method="thread")
def test_a_check_whose_worker_leaves_moves_to_a_live_one(loop):
    """Checks are pinned to their verifier (Dask's work stealing moved a loosely pinned check to
    its producer on a busy machine, and it proved nothing); so one whose verifier leaves while
    it runs must be moved by the run itself, not wait for a worker that will never come."""
    import functools

    from dask_research.testing.pipelines import slow_tanh

    job = mc.Job(functools.partial(slow_tanh, delay=3.0), {"a": mc.Normal(1, 0.1), "b": mc.Normal(2, 0.2)},
                 shards=2, samples_per_shard=64, seed=5, range=(-1.0, 1.0))
    reducer = job.make_reducer(job.range)
    events = []
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None,
                      loop=loop) as cluster, Client(cluster, set_as_default=False) as client:
        producer, verifier = sorted(client.scheduler_info()["workers"])
        limits = Limits(block=1)
        limits.block_timeout = limits.check_timeout = None   # no lateness rule: only the worker's leaving moves it
        checks = Checks(client, job, reducer, run_id=job.id, tag="t", poll=0.1, limits=limits,
                        emit=lambda kind, **d: events.append((kind, d)))
        assert checks.submit(0, producer)
        record, fut = checks.checks[0]
        assert record["verifier"] == verifier
        deadline = time.monotonic() + 60
        while not client.processing().get(verifier) and time.monotonic() < deadline:
            time.sleep(0.05)
        name = next(n for n, w in cluster.workers.items() if w.address == verifier)
        client.sync(cluster.workers[name].close)             # the verifier leaves mid-check
        gathered = checks.gather()
    state, where = gathered[0]
    # Moved to the live worker, once: it ran there (under load the client used to recompute it,
    # see the next test)
    assert where == producer and record["moved_from"] == [verifier]
    assert events == [("check-moved", {"shard": 0, "worker": verifier, "reason": "its worker left"})]
    assert state == mc.compute_shard(job, 0, reducer=reducer)


def test_a_moved_check_that_ran_is_not_moved_again_while_its_result_is_fetched():
    """Under load (two in 64 runs of the test above beside four CPU hogs) a moved check finished
    on its new worker a moment before its result was fetched; its first attempt, pinned to the
    worker that left, was the only one still pending, so the check looked "gone" again and was
    moved off the worker that had just run it (the client then recomputed it). An attempt that
    finished keeps it in place until its fetch ends or outlives its bound."""
    from types import SimpleNamespace

    job = mc.Job(lambda a: a, {"a": mc.Normal(0.0, 1.0)}, shards=2, samples_per_shard=64, seed=1, range=(-8, 8))
    events, cancelled, moved = [], [], []
    limits = Limits(block=1)
    limits.block_timeout = limits.check_timeout = None
    checks = Checks(SimpleNamespace(cancel=cancelled.extend), job, job.make_reducer(job.range), run_id=job.id,
                    tag="t", poll=0.01, limits=limits, emit=lambda kind, **d: events.append(kind))
    old = Fut("mc-verify-t-0", "pending")               # pinned to the worker that left: never runs
    new = Fut("mc-verify-t-0-m1", "finished")           # ran; its fetch is in flight
    checks.checks[0] = ({"shard": 0, "producer": "tcp://p", "verifier": "tcp://p", "moved_from": ["tcp://v"]}, new)
    checks.attempts[0] = [(old, "tcp://v", time.monotonic()), (new, "tcp://p", time.monotonic())]
    turns = iter([([], {}), ([], {}), ([new], {new: ("state", "tcp://p")})])
    checks.arrivals.collect_sync = lambda owner, poll: next(turns)
    checks._alive = lambda now: {"tcp://p"}
    checks.submit = lambda *a, **k: moved.append(a) or True
    assert checks.gather() == {0: ("state", "tcp://p")}
    assert moved == [] and events == [] and cancelled == [old]
    # a fetch that outlived its bound (a frozen holder) lets the check move again
    checks.arrivals.collect_sync = lambda owner, poll: ([], {})
    checks.arrivals.unfetched[new.key] = (time.monotonic(), 5.0)
    checks.submit = lambda *a, **k: moved.append(a) or False          # no worker left: the client
    assert checks.gather() == {0: (mc.compute_shard(job, 0, reducer=checks.reducer), "client")}
    assert events == ["check-moved"] and len(moved) == 1 and cancelled[1:] == [old, new]


# -- checks' judgement -------------------------------------------------------------------------------

def _checks_with(job, reducer, answers):
    """A Checks whose checks answer ``answers[s]`` from worker ``tcp://v`` (no cluster)."""
    events = []
    checks = Checks(None, job, reducer, run_id=job.id, tag="t", emit=lambda kind, **d: events.append(kind),
                    limits=Limits(block=1), poll=0.1)

    def submit(s, producer, exclude=frozenset()):
        checks.checks[s] = ({"shard": s, "producer": producer, "verifier": "tcp://v"}, None)
        return True

    checks.submit = submit
    checks.gather = lambda ready=None: {s: (answers[s], "tcp://v") for s in checks.checks}
    return checks, events


def test_a_mismatch_blames_the_producer_or_for_a_reused_shard_its_stored_file():
    job = mc.Job(lambda a: a, {"a": mc.Normal(0.0, 1.0)}, shards=8, samples_per_shard=64, seed=3, range=(-8, 8))
    reducer = job.make_reducer(job.range)
    truth = {s: mc.compute_shard(job, s, reducer=reducer) for s in range(8)}
    producers = Producers(8, {s: "tcp://stored" for s in range(4)})      # 0-3 reused from the store
    producers.record([4, 5, 6, 7], "tcp://w")
    kept = dict(truth)
    kept[1], kept[6] = truth[2], truth[5]                                  # an edited file, a faulty worker
    checks, events = _checks_with(job, reducer, truth)
    record, bad, bad_stored = checks.verify(kept, producers, {"tcp://w": 4}, [0, 1, 2, 3], 8, {0, 1, 2, 3})
    assert bad == {"tcp://w"} and bad_stored == {1} and record["quarantined_workers"] == ["tcp://w"]
    faulty = {m["shard"]: m["faulty"] for m in record["mismatches"]}
    assert faulty == {1: ["the stored shard file (producer tcp://stored)"], 6: ["tcp://w"]}
    assert events.count("check") == record["checks"] == 8 and record["reused_checked"] == [0, 1, 2, 3]


def test_producers_are_compact_and_ordered():
    p = Producers(6, {5: "b", 0: "a"})
    p.record([1, 2], "b")
    assert p.names == ["b", "a"] and p.of.tolist() == [1, 0, 0, -1, -1, 0]
    assert p.among([5, 3, 1]) == {1: "b", 5: "b"} and p.shards_of({"b"}) == [1, 2, 5] and p.shards_of({"x"}) == []


# -- arrivals on a cluster -------------------------------------------------------------------------

def _slow_identity(x, seconds):
    import time

    time.sleep(seconds)
    return x


@pytest.mark.slow
@pytest.mark.timeout(120, method="thread")
def test_arrivals_wake_on_the_first_end_and_gather_every_finished_one(loop):
    with LocalCluster(loop=loop, n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cl, \
            Client(cl, set_as_default=False) as c:
        arrivals = Arrivals(c, bound=lambda: 30.0)
        fast, slow = c.submit(_slow_identity, 1, 0.0, pure=False), c.submit(_slow_identity, 2, 3.0, pure=False)
        arrivals.track([fast, slow])
        done, values = arrivals.collect_sync([fast, slow], 30.0)
        assert done == [fast] and values == {fast: 1}
        assert arrivals.collect_sync([slow], 0.05) == ([], {})               # not yet: the wait is bounded
        done, values = arrivals.collect_sync([slow], 30.0)
        assert done == [slow] and values == {slow: 2}
        broken = c.submit(_slow_identity, 3, "not a number", pure=False)     # errs: ended, nothing to gather
        arrivals.track([broken])
        done, values = arrivals.collect_sync([broken], 30.0)
        assert done == [broken] and values == {} and broken.status == "error"
        assert arrivals.collect_sync({fast: 0}, 0.05) == ([], {})            # consumed: not handed out twice
        early = c.submit(_slow_identity, 4, 0.0, pure=False)
        early.result()
        arrivals.track([early])                                              # tracked after it ended
        assert arrivals.collect_sync({early: 0}, 30.0) == ([early], {early: 4})


def test_a_result_that_could_not_be_fetched_waits_out_its_bound():
    told = []
    arrivals = Arrivals(None, bound=lambda: 1.0, on_unfetched=lambda key, now: told.append(key))
    a, b = Fut("a"), Fut("b")
    arrivals.unfetched["a"] = (float("inf"), 1.0)
    assert arrivals.waitable([a, b]) == [b]
    arrivals.unfetched["a"] = (0.0, 1.0)
    assert arrivals.waitable([a, b]) == [a, b]
    assert asyncio.run(arrivals.collect({}, 0.01)) == ([], {})


def test_a_result_cancelled_while_it_is_fetched_is_handed_back_as_ended():
    from dask_research._compat import FutureCancelledError

    f = Fut("mc-block-t-0-1", "finished")

    async def gather(futures, asynchronous=True):
        f.status = "cancelled"                  # cancelled from outside while the gather is in flight
        raise FutureCancelledError(f.key, reason="by-an-operator")

    arrivals = Arrivals(SimpleNamespace(gather=gather), bound=lambda: 1.0)
    arrivals._ended[f] = None                   # as_completed handed it out
    assert asyncio.run(arrivals.collect({f: 0}, 0.01)) == ([f], {}) and f.status == "cancelled"
    assert arrivals.unfetched == {}


def test_a_result_lost_while_it_was_fetched_is_fetched_when_it_finishes_again():
    """Dask's gather resets a future whose holder fails to answer (the key is recomputed or
    reported again) and the fetch's bound can end while it is pending: it is handed back as
    ended without a result, and ``as_completed`` never reports it again, so it must stay tracked
    and be fetched once it finishes again (dropped, a block or a check waited for ever)."""
    f = Fut("mc-block-t-0-1", "finished")
    calls = []

    async def gather(futures, asynchronous=True):
        calls.append(f.status)
        if len(calls) <= 2:                      # the first fetch and its one-holder-at-a-time retry
            f.status = "pending"                 # Dask reset it (its holder failed to answer) and
            await asyncio.sleep(60)              # waits for it to finish again: the bound ends it
        return ["state"]

    arrivals = Arrivals(SimpleNamespace(gather=gather), bound=lambda: 0.2)
    arrivals._ended[f] = None                   # as_completed handed it out, once
    assert asyncio.run(arrivals.collect({f: 0}, 5.0)) == ([f], {})      # ended, no result
    assert arrivals.unfetched == {}             # not a timeout: nothing to wait out
    assert asyncio.run(arrivals.collect({f: 0}, 0.01)) == ([], {})      # still pending: nothing
    f.status = "finished"                       # recomputed
    assert asyncio.run(arrivals.collect({f: 0}, 5.0)) == ([f], {f: "state"})
    assert calls == ["finished", "pending", "finished"] and not arrivals._ended


def test_a_result_a_frozen_worker_holds_is_retried_with_doubling_bounds_below_dasks_connect_timeout(monkeypatch):
    """A gather that waits longer than Dask's connect timeout lets Dask give up on the frozen
    holder first: it reports the key lost and the scheduler recomputes it wherever it likes (on
    the frozen worker, in a stress run of the suite, which then waited for it). The bounds double
    from retry to retry and stop at half the connect timeout."""
    import dask

    from dask_research.montecarlo import arrivals as arrivals_module

    waited: list[float] = []

    async def wait_for(aw, timeout):           # every gather of the frozen holder times out
        waited.append(timeout)
        aw.close()
        raise asyncio.TimeoutError

    async def who_has(client, op, keys):
        return {k: ["tcp://frozen"] for k in keys}

    monkeypatch.setattr(arrivals_module.asyncio, "wait_for", wait_for)
    monkeypatch.setattr(arrivals_module, "scheduler_call", who_has)

    async def never(futures, asynchronous=True):
        await asyncio.sleep(3600)

    f = Fut("mc-group-t-0-4", "finished")
    arrivals = Arrivals(SimpleNamespace(gather=never), bound=lambda: 6.0)
    with dask.config.set({"distributed.comm.timeouts.connect": "30s"}):
        for _ in range(5):
            arrivals._ended[f] = None
            if f.key in arrivals.unfetched:    # its bound has passed: it is tried again now
                arrivals.unfetched[f.key] = (time.monotonic() - 1e4, arrivals.unfetched[f.key][1])
            assert asyncio.run(arrivals.collect({f: 0}, 0.01)) == ([], {})
    assert max(waited) == 15.0 and 6.0 in waited and 12.0 in waited, waited    # 6, 12, 15, 15, ...
    assert arrivals.unfetched[f.key][1] == 15.0


# -- failures ----------------------------------------------------------------------------------------

def test_a_cancellation_from_outside_and_a_lost_scheduler_read_differently():
    from dask_research._compat import FutureCancelledError

    class Cancelled(Fut):
        def __init__(self, reason):
            super().__init__("mc-block-t-0-1", "cancelled")
            self.reason = reason

        def result(self, timeout=None):
            raise FutureCancelledError(self.key, reason=self.reason)

    running = SimpleNamespace(status="running")
    with pytest.raises(ResearchError, match=r"task mc-block-t-0-1 was cancelled from outside the run "
                       r"\(reason: by-an-operator\)"):
        raise_if_cancelled(running, "ab" * 32, [Cancelled("by-an-operator")])
    # The block being fetched when it was cancelled is reset and re-reported by Dask as "unknown"
    # (or "already forgotten"); its siblings cancelled in the same call keep the operator's reason.
    with pytest.raises(ResearchError, match=r"\(reason: by-an-operator\)"):
        raise_if_cancelled(running, "ab" * 32, [Cancelled("unknown"), Cancelled("already forgotten"),
                                                Cancelled("by-an-operator")])
    with pytest.raises(ResearchError, match=r"\(reason: not given\)"):
        raise_if_cancelled(running, "ab" * 32, [Cancelled("unknown")])
    with pytest.raises(FutureCancelledError) as info:
        raise_if_cancelled(running, "ab" * 32, [Cancelled("unknown"), Cancelled(LOST)])
    assert info.value.reason == LOST
    with pytest.raises(FutureCancelledError) as info:
        raise_if_cancelled(running, "ab" * 32, [Cancelled(LOST)])
    assert lost_scheduler(running, info.value)
    assert not lost_scheduler(running, OSError("disk")) and lost_scheduler(SimpleNamespace(status="closed"), OSError())
    msg = str(lost_scheduler_error(OSError("gone"), address="tcp://s:8786", run_id="ab" * 32, shards=10, have=4,
                                   where="/data/store/runs/x"))
    assert msg.startswith("run abababababab lost the connection to tcp://s:8786 (OSError: gone): the 4 of 10")
    assert "stored in /data/store/runs/x are kept" in msg and "the missing 6" in msg
    assert "no store= was given" in str(lost_scheduler_error(OSError(), address=None, run_id="ab" * 32, shards=10,
                                                             have=4, where=None))


def test_numpy_ids_of_producers_index_names():
    p = Producers(3)
    p.record([0, 2], "w")
    assert isinstance(p.of, np.ndarray) and p.among(range(3)) == {0: "w", 2: "w"}
