"""Queue-ahead (issue 30): a decided experiment waits behind each running one, so a slot starts
its next experiment the moment one ends.

The promises, each on what it is about: the ``"auto"`` rule as a unit; a queued decision is one
more slot of parallelism (the same decisions as ``slots + 1`` in dispatch order); on real
``dask worker`` processes a queued experiment starts before the driver has even heard that the
one before it on its worker ended, a worker killed with a queued experiment re-runs it once, and
nothing ever runs more than ``slots`` at a time; timeouts count from an experiment's start, not
from when it was queued; a journal cut anywhere, and a real SIGKILL, resume a queue-ahead run
into the uninterrupted run's decisions. No assertion bounds a wall-clock time from above: the
orderings come from the experiments' own recorded start and end times.

Every test here runs on ``transport="tasks"`` (one Dask task per experiment, queued on its
worker), set for the module below, the driver subprocesses included; queue-ahead in the default
transport's actors is tested in ``test_actors.py``. (``gen_cluster`` resets Dask's configuration:
its tests say ``transport="tasks"`` themselves.)
"""
import os
import pathlib
import signal
import textwrap
import threading
import time
import warnings

import crash_scenario as cs
import dask
import pytest
from distributed.utils_test import gen_cluster
from exp_scenarios import HAND_REWARDS, queued_hand_offs, summary

from dask_research.exceptions import InputError
from dask_research.experiments import Hypothesis, IterationScheduler, Result, make_deterministic_runner
from dask_research.experiments.ahead import WINDOW, AheadRule, worth_queueing
from dask_research.experiments.lock import JournalLockWarning
from dask_research.testing.processes import dask_processes, wait_for

HERE = pathlib.Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def _tasks_transport(monkeypatch):
    """What this module tests is the tasks transport's queue-ahead (see the module)."""
    monkeypatch.setenv("DASK_RESEARCH__EXPERIMENTS__TRANSPORT", "tasks")     # driver subprocesses
    with dask.config.set({"research.experiments.transport": "tasks"}):
        yield


# -- the rule ----------------------------------------------------------------------------
def test_the_auto_rule_queues_ahead_only_where_the_idle_gap_is_worth_hiding():
    assert not worth_queueing([], [], 0.01) and not worth_queueing([0.01], [], 0.01)
    assert worth_queueing([0.006], [0.5], 0.01) and not worth_queueing([0.004], [0.5], 0.01)
    assert not worth_queueing([0.01] * 5, [3600.0] * 5, 0.01)      # hour-long: fully informed
    rule = AheadRule("auto", 0.01)
    assert rule.depth() == 0                                         # nothing measured
    for _ in range(WINDOW):
        rule.observe(0.005, 0.05)                                    # 10 % of the duration
    assert rule.depth() == 1
    for _ in range(WINDOW):                                          # the experiments grow long:
        rule.observe(None, 10.0)                                     # queued ones measure no gap
    assert rule.depth() == 0                                         # 5 ms of 10 s: off again
    rule.observe(-0.001, 0.05)                                       # clock noise counts as 0
    assert min(rule.gaps) == 0.0
    assert AheadRule("auto", 0.01, enabled=False).depth() == 0       # local backend, "dispatch"
    assert AheadRule(2, 0.01).depth() == 2 and AheadRule(0, 0.01).depth() == 0


def test_auto_queues_a_forced_pick_from_the_first_decision():
    """A pick that does not depend on results (an eligible untried branch, under a policy that
    takes untried branches first) is queued ahead at once; then the measured rule decides."""
    from dask_research.experiments.ledger import BranchLedger
    from dask_research.experiments.policies import make_policy

    rule = AheadRule("auto", 0.01)
    assert rule.depth(forced=True) == 1 and rule.depth() == 0
    assert AheadRule("auto", 0.01, timed=False).depth(forced=True) == 1       # apply_order="dispatch"
    for _ in range(WINDOW):
        rule.observe(0.005, 0.05)
    assert AheadRule("auto", 0.01, timed=False).depth() == 0                  # never by timing there
    assert AheadRule("auto", 0.01, enabled=False).depth(forced=True) == 0     # no round trip to hide
    assert AheadRule(0, 0.01).depth(forced=True) == 0                         # a number is kept

    led = BranchLedger(2 ** 0.5, make_policy("ucb1"))
    led.add([Hypothesis(f"{b}{k}", b) for b in "abc" for k in range(2)])
    forced = []
    for _ in range(4):
        forced.append(led.forced_pick())
        i, _scores = led.select()
        led.pop(i)
    assert forced == [True, True, True, False]          # a, b, c untried; then every branch pending
    led2 = BranchLedger(2 ** 0.5, make_policy("thompson", seed=1))
    led2.add([Hypothesis("a1", "a")])
    assert not led2.forced_pick()                       # a sampled score: not forced


def _six(slots, **kw):
    sched = IterationScheduler(make_deterministic_runner(SIX, delay_ms=5), slots=slots, c=0.5,
                               prune_floor=0.0, paper_threshold=1.0, progress=False, **kw)
    sched.add([Hypothesis(f"{b}{k}", b) for b in "abcdef" for k in range(1, 4)])
    return sched


async def _forced_on_dask(c, slots, apply_order):
    """On a cluster with one thread per slot, "auto" queues the six untried branches' first
    experiments ahead from the first decision, and the run makes the decisions of a run that
    never queues ahead (deterministic ones with ``apply_order="dispatch"``)."""
    informed = _six(slots, queue_ahead=0, apply_order="dispatch").run()
    ahead = await _six(slots, client=c, apply_order=apply_order).run_async()      # the defaults
    flags = [e.data.get("ahead", False) for e in ahead.events.of("dispatch")]
    assert flags[:6] == [False] * slots + [True] * (6 - slots)    # the untried branches: at once
    if apply_order == "dispatch":
        assert not any(flags[6:])                                  # then never by timing
        assert summary(ahead) == summary(informed)
    else:                                  # (the measured rule may queue later ones: 5 ms each)
        assert ahead.events.picks()[:6] == informed.events.picks()[:6] == list("abcdef")
    return ahead


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)], timeout=60)
async def test_forced_picks_queued_ahead_are_the_informed_picks_one_slot(c, s, a):
    await _forced_on_dask(c, 1, "dispatch")
    await _forced_on_dask(c, 1, "completion")


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1), ("127.0.0.1", 1)], timeout=60)
async def test_forced_picks_queued_ahead_are_the_informed_picks_two_slots(c, s, a, b):
    report = await _forced_on_dask(c, 2, "dispatch")
    again = await _six(2, client=c, apply_order="dispatch").run_async()
    assert summary(again) == summary(report)                       # deterministic


SIX = {f"{b}{k}": r for b, base in zip("abcdef", (0.2, 0.4, 0.6, 0.5, 0.3, 0.7))
       for k, r in ((1, base), (2, base + 0.1), (3, base - 0.1))}


def test_the_setting_is_checked_and_journaled(tmp_path):
    with pytest.raises(InputError, match=r'queue_ahead=-1 is invalid; expected "auto" or an integer in \[0, 64\]'):
        IterationScheduler(None, queue_ahead=-1)
    with pytest.raises(InputError, match=r"queue_ahead_gap=0 is invalid; expected a number in \(0, 1\]"):
        IterationScheduler(None, queue_ahead_gap=0)
    assert IterationScheduler(None, progress=False).queue_ahead == "auto"
    path = str(tmp_path / "loop.jsonl")
    sched = IterationScheduler(lambda h: 0.5, progress=False, checkpoint=path, queue_ahead=2)
    sched.add([Hypothesis("h0", "a")])
    sched.run()
    sched.close()
    assert IterationScheduler.resume(path, lambda h: 0.5).queue_ahead == 2


# -- decisions -----------------------------------------------------------------------------
def _hand(slots, **kw):
    sched = IterationScheduler(make_deterministic_runner(HAND_REWARDS, delay_ms=1), slots=slots,
                               c=0.5, prune_floor=0.0, paper_threshold=1.0, progress=False, **kw)
    sched.add([Hypothesis(f"{b}{k}", b) for b in "abc" for k in range(1, 5)])
    return sched


def test_a_queued_decision_is_one_more_slot_of_parallelism():
    """One slot with one experiment queued ahead decides exactly as two slots whose decision
    ``k`` waits for result ``k - 2``: without the result of the experiment running then."""
    ahead = _hand(1, queue_ahead=1).run()
    two = _hand(2, apply_order="dispatch", queue_ahead=0).run()
    informed = _hand(1, queue_ahead=0).run()
    assert ahead.events.picks() == two.events.picks() != informed.events.picks()
    assert [e.data.get("ahead", False) for e in ahead.events.of("dispatch")] == [False] + [True] * 11
    assert ahead.events.max_concurrency() == 1          # one slot: one experiment at a time
    assert ahead.total_runs == 12 and ahead.stop_reason == "queue_empty"
    spans = sorted(ahead.events.intervals(), key=lambda iv: iv.start)
    assert all(a.end <= b.start for a, b in zip(spans, spans[1:]))    # one after another


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)], timeout=60)
async def test_on_dask_queued_decisions_equal_the_local_ones(c, s, a):
    remote = await _hand(1, queue_ahead=1, client=c).run_async()
    local = _hand(1, queue_ahead=1).run()
    assert summary(remote) == summary(local)
    assert remote.events.picks() != _hand(1, queue_ahead=0).run().events.picks()


@gen_cluster(client=True, timeout=60)
async def test_no_queue_ahead_while_the_cluster_has_spare_threads(c, s, a, b):
    # gen_cluster's workers have 1 + 2 threads: a queued experiment would start at once
    with pytest.warns(UserWarning, match=r"queue_ahead=1 is not applied while the cluster has more "
                                         r"threads than slots=1"):
        report = await _hand(1, queue_ahead=1, client=c, transport="tasks").run_async()
    assert not any(e.data.get("ahead") for e in report.events.of("dispatch"))
    assert summary(report) == summary(_hand(1, queue_ahead=0).run())


# -- real processes ------------------------------------------------------------------------
def _timed_runner(delay):
    def runner(h):
        import os
        import time

        t0 = time.time()
        time.sleep(delay)
        return Result(h, 0.5, {"pid": os.getpid(), "start": t0, "end": time.time()})
    return runner


def test_a_queued_experiment_starts_before_the_driver_hears_the_one_before_it(tmp_path):
    """On two one-thread ``dask worker`` processes with two slots, every experiment queued
    ahead was in the cluster before its worker's previous result reached the driver, and most
    start before that result does (no driver round trip between them; on a loaded machine the
    result can reach the driver a millisecond before the worker starts the next one: the
    stress gate saw 1.5 ms once); no worker ever runs two at once."""
    with dask_processes(tmp_path, n_workers=2) as (client, _):
        sched = IterationScheduler(_timed_runner(0.2), slots=2, client=client, queue_ahead=1,
                                   prune_floor=0.0, progress=False)
        sched.add([Hypothesis(f"h{k}", "ab"[k % 2]) for k in range(12)])
        report = sched.run()
    assert report.total_runs == 12 and not report.failed
    assert len({r.metrics["pid"] for r in report.results}) == 2
    assert len({e.hypothesis for e in report.events.of("dispatch") if e.data.get("ahead")}) >= 8   # (10: all but the first of each slot)
    checked, early = queued_hand_offs(report)
    assert checked >= 8 and early >= checked // 2, (early, checked)


def _start_logging_runner(log, seconds):
    """A runner that logs ``<id> <pid> <time>`` as it starts, then sleeps ``seconds``."""
    def runner(h):
        import os
        import time

        with open(log, "a") as f:
            f.write(f"{h.id} {os.getpid()} {time.time()}\n")
        time.sleep(seconds)
        return 0.5
    return runner


def _worker_holding_two(client, log, within):
    """Wait for a worker with one experiment running (it logged ``id pid time`` at its start
    under ``within`` seconds ago, so the one queued behind it cannot start before the test
    acts) and one queued behind it: ``(address, running id, queued id)``."""
    box = {}

    def holding_two():
        held = client.run_on_scheduler(lambda dask_scheduler: {
            ws.address: sorted(ts.key for ts in ws.processing) for ws in dask_scheduler.workers.values()})
        lines = [ln.split() for ln in log.read_text().splitlines()] if log.exists() else []
        started = {hid: float(t) for hid, _, t in lines}
        for address, keys in held.items():
            ids = [k.split("-", 2)[2] for k in keys if k.startswith("experiment-")]
            running = [i for i in ids if i in started]
            if len(ids) == 2 and len(running) == 1 and time.time() - started[running[0]] < within:
                box["victim"] = (address, running[0], [i for i in ids if i not in started][0])
                return True
        return False

    wait_for(holding_two, 60, "a worker holding a running and a queued experiment", poll=0.02)
    return box["victim"]


def test_a_worker_killed_with_a_queued_experiment_runs_it_once_elsewhere(tmp_path):
    log = tmp_path / "starts.log"
    with dask_processes(tmp_path, n_workers=2) as (client, workers):
        pids = client.run(os.getpid)
        sched = IterationScheduler(_start_logging_runner(log, 1.0), slots=2, client=client, queue_ahead=1,
                                   prune_floor=0.0, progress=False)
        sched.add([Hypothesis(f"h{k}", "ab"[k % 2]) for k in range(8)])
        box = {}
        thread = threading.Thread(target=lambda: box.setdefault("report", sched.run()))
        thread.start()

        address, _, queued = _worker_holding_two(client, log, within=0.5)
        victim = next(p for p in workers if p.pid == pids[address])
        victim.send_signal(signal.SIGKILL)
        before = [ln.split()[0] for ln in log.read_text().splitlines()]
        thread.join(120)
        assert not thread.is_alive()
    report = box["report"]
    starts = [ln.split()[0] for ln in log.read_text().splitlines()]
    assert sorted(r.hypothesis.id for r in report.results) == sorted(f"h{k}" for k in range(8))
    assert queued not in before and starts.count(queued) == 1        # the queued one: once
    assert all(starts.count(h) == 1 for h in set(starts) - set(before))   # nothing run twice
    assert all(starts.count(h) <= 2 for h in before)     # but what ran on the dead worker, again


@pytest.mark.slow
@pytest.mark.timeout(400, method="thread")
def test_an_experiment_queued_behind_a_frozen_worker_times_out_instead_of_holding_the_run(tmp_path, monkeypatch):
    """A worker frozen (SIGSTOP) with one experiment running and one queued behind it: the
    running one times out, and the queued one, which never starts nor says so, times out one
    timeout after the slot freed; the run goes on with the other worker. Before, the queued
    one's clock waited for a start notice that never came, and the run waited until Dask gave
    the worker up (``worker-ttl``, 5 minutes by default; an hour here)."""
    monkeypatch.setenv("DASK_DISTRIBUTED__SCHEDULER__WORKER_TTL", "1h")
    log = tmp_path / "starts.log"
    with dask_processes(tmp_path, n_workers=2) as (client, workers):
        pids = client.run(os.getpid)
        sched = IterationScheduler(_start_logging_runner(log, 0.8), slots=2, client=client, queue_ahead=1, timeout=3.0,
                                   prune_floor=0.0, progress=False)
        sched.add([Hypothesis(f"h{k}", "ab"[k % 2]) for k in range(8)])
        box = {}
        thread = threading.Thread(target=lambda: box.setdefault("report", sched.run()))
        thread.start()

        try:
            address, running, queued = _worker_holding_two(client, log, within=0.4)
            victim = next(p for p in workers if p.pid == pids[address])
            victim.send_signal(signal.SIGSTOP)
            thread.join(240)
            assert not thread.is_alive(), "the run waited for an experiment queued behind a frozen worker"
            n_started_when_done = len(log.read_text().splitlines())
        finally:
            for p in workers:
                p.send_signal(signal.SIGCONT)
            thread.join(60)
    report = box["report"]
    assert running in report.timed_out and queued in report.timed_out
    starts = [ln.split()[0] for ln in log.read_text().splitlines()]
    # it never ran while the run lasted: it was given up (the thawed worker may still start it
    # before the test's cluster closes, Dask's cancel and its thread racing there)
    assert queued not in starts[:n_started_when_done]
    [failure] = [f for f in report.failed if f.hypothesis.id == queued]
    assert "had not started" in str(failure.error) and "frozen" in str(failure.error)
    assert report.total_runs + report.failures == 8


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)], timeout=60)
async def test_a_timeout_counts_from_the_start_not_from_the_queue(c, s, a):
    """Three experiments queued behind a running one on a one-thread worker: the last starts
    about 0.9 s after it was dispatched and runs 0.3 s, inside a 1 s timeout counted from its
    start (counted from its dispatch it would have been cancelled). A hanging one queued later
    still times out, one timeout after it started, and the one queued behind it, which cannot
    start while the hung one holds the worker's only thread, times out one timeout after the
    slot freed, as it would have without queue-ahead (dispatched then, stuck behind the hung
    thread); before, it waited for as long as the hung one ran, for ever behind a true hang."""
    def runner(h):
        time.sleep(4.0 if h.id == "hang" else 0.3)
        return 0.5

    sched = IterationScheduler(runner, slots=1, client=c, queue_ahead=3, timeout=1.0, transport="tasks",
                               prune_floor=0.0, progress=False)
    sched.add([Hypothesis(f"n{k}", "a") for k in range(4)] + [Hypothesis("hang", "a"),
                                                               Hypothesis("n4", "a")])
    report = await sched.run_async()
    assert report.timed_out == ["hang", "n4"] and report.total_runs == 4
    [n4] = [f for f in report.failed if f.hypothesis.id == "n4"]
    assert "had not started timeout=1 s after that one ended" in str(n4.error)
    ends = {e.hypothesis: e.t for e in report.events.of("result", "failure")}
    dispatched = {e.hypothesis: e.t for e in report.events.of("dispatch")}
    assert ends["n3"] - dispatched["n3"] > 1.0          # longer than the timeout since queued
    # the hang started as n3 ended (before the driver heard it; counted from its dispatch, 0.3 s
    # in, it would have timed out about 0.1 s after n3's result)
    assert ends["hang"] - ends["n3"] > 0.9


# -- resume ----------------------------------------------------------------------------------
def test_a_crash_anywhere_in_a_queue_ahead_journal_resumes_into_the_uninterrupted_run(tmp_path):
    from test_checkpoint_resume import _stats

    path = tmp_path / "whole.jsonl"
    whole = cs.scheduler(cs.LoggingRunner(None, 0.0), str(path), queue_ahead=1).run()
    expect = (summary(whole), _stats(whole))
    assert sum(1 for e in whole.events.of("dispatch") if e.data.get("ahead")) > 10
    cuts = cs.journal_cuts(path)
    for k, data in enumerate(cuts):
        cut = tmp_path / f"cut{k}.jsonl"
        cut.write_bytes(data)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", JournalLockWarning)
            again = IterationScheduler.resume(str(cut), cs.LoggingRunner(None, 0.0), expander=cs.EXPANDER,
                                              progress=False)
            again.add(cs.hypotheses())
            report = again.run()
        assert (summary(report), _stats(report)) == expect, (len(data), data.splitlines()[-1][:120])


SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
import crash_scenario as cs
cs.scheduler(cs.LoggingRunner({log!r}, 0.02), {path!r}, queue_ahead=1).run()
"""


def test_sigkill_with_queued_experiments_then_resume_equals_the_uninterrupted_run(tmp_path):
    path, log = str(tmp_path / "loop.jsonl"), str(tmp_path / "done.log")
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(SCRIPT.format(tests=str(HERE), log=log, path=path)))
    cs.run_and_kill(script, path, results=12, timeout=60)
    sched = cs.resume_killed(path, log)
    assert sched.queue_ahead == 1 and sum(s.pending for s in sched.stats.values()) == 2
    twice = cs.run_twice(sched.run(), log, queue_ahead=1)
    assert len(twice) <= 1          # only the one running at the kill (the queued one never ran)
