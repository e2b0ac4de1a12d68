"""Crash-safe resume: the journal rebuilds the exact state; a real SIGKILL loses nothing."""
import json
import os
import pathlib
import pickle
import signal
import subprocess
import sys
import textwrap
import time

import crash_scenario as cs
import pytest
from exp_scenarios import summary

from dask_research.exceptions import CheckpointError, ExperimentError, InputError
from dask_research.experiments import (
    Hypothesis,
    IterationScheduler,
    deterministic_expander,
    make_deterministic_runner,
)
from dask_research.experiments.checkpoint import Journal, _encode
from dask_research.experiments.lock import JournalLockWarning

HERE = pathlib.Path(__file__).resolve().parent
REWARDS = {"strong": 0.9, "mid": 0.5, "weak": 0.1}


class CountingRunner:
    def __init__(self):
        self.inner = make_deterministic_runner(REWARDS, delay_ms=1, fail={"broken"})
        self.calls = []

    async def __call__(self, h):
        self.calls.append(h.id)
        return await self.inner(h)


def _scheduler(runner, path, **kw):
    papers = kw.pop("papers", [])

    def writer(branch, stats, best):
        papers.append(branch)
        return f"paper on {branch}"

    sched = IterationScheduler(runner, slots=1, progress=False, checkpoint=path,
                               expander=deterministic_expander, paper_writer=writer,
                               failure_limit=2, **kw)
    sched.add([Hypothesis(f"{b}-{k}", b) for k in range(4)
               for b in ("strong", "mid", "weak", "broken")])
    return sched


def _stats(report):
    return {b: (s.runs, s.reward_sum, s.pruned, s.paper_emitted, s.failures, s.queued)
            for b, s in report.branches.items()}


def test_rebuilding_with_the_same_hypotheses_continues_like_one_run(tmp_path):
    whole = _scheduler(CountingRunner(), None).run()

    path = tmp_path / "runs" / "loop.jsonl"
    first_runner, papers = CountingRunner(), []
    first = _scheduler(first_runner, path, max_experiments=7, papers=papers).run()
    assert first.stop_reason == "max_experiments" and len(first_runner.calls) == 7
    assert papers == ["strong"]

    # a new scheduler on the same checkpoint, the same hypotheses added again: it continues
    second_runner, papers_again = CountingRunner(), []
    second = _scheduler(second_runner, path, papers=papers_again).run()
    assert second.replayed == 7 and second.dispatched == len(whole.results) + len(
        whole.failed) - 7
    assert not set(second_runner.calls) & set(first_runner.calls)      # nothing ran twice
    assert papers_again == [] and second.papers == {"strong": "paper on strong"}
    # decisions, statistics, prunes, follow-ups and papers equal those of the run in one go
    assert summary(second) == summary(whole) and _stats(second) == _stats(whole)
    restored = [e for e in second.events.of("result", "failure") if e.data.get("restored")]
    assert len(restored) == 7

    third_runner = CountingRunner()
    third = IterationScheduler.resume(path, third_runner, expander=deterministic_expander,
                                      progress=False)
    assert third_runner.calls == [] and third.run().dispatched == 0
    assert third.stats == second.branches


def test_budgets_count_what_was_spent_and_settings_come_from_the_header(tmp_path):
    path = tmp_path / "loop.jsonl"
    _scheduler(CountingRunner(), path, max_experiments=5).run()
    resumed = IterationScheduler.resume(path, CountingRunner(), expander=deterministic_expander,
                                        max_experiments=8, progress=False)
    assert resumed.slots == 1 and resumed.failure_limit == 2 and resumed.max_experiments == 8
    report = resumed.run()
    assert report.stop_reason == "max_experiments" and report.dispatched == 3
    assert report.total_runs + report.failures == 8
    # max_seconds counts the time of the trace so far
    t_end = report.events[-1].t
    again = IterationScheduler.resume(path, CountingRunner(), max_experiments=None, progress=False,
                                      max_seconds=t_end / 2)
    late = again.run()
    assert late.stop_reason == "max_seconds" and late.dispatched == 0


def test_a_damaged_setting_in_the_header_is_a_checkpoint_error(tmp_path):
    # found by the journal fuzzer: a flipped bit in "completion" made resume() raise a bare
    # InputError that did not say the checkpoint was at fault
    path = tmp_path / "loop.jsonl"
    _scheduler(CountingRunner(), path, max_experiments=3).run()
    lines = path.read_text().splitlines()
    assert '"completion"' in lines[0]
    edited = lines[0].replace('"completion"', '"bompletion"')
    path.write_text("\n".join([edited] + lines[1:]) + "\n")
    with pytest.raises(CheckpointError, match=r"loop.jsonl: line 1 fails its checksum"):
        IterationScheduler.resume(path, CountingRunner(), progress=False)
    # edited with the checksum recomputed: the setting itself is refused
    path.write_text("\n".join([_resign(edited)] + lines[1:]) + "\n")
    with pytest.raises(CheckpointError, match=r"loop.jsonl.*apply_order='bompletion' is "
                                              r"invalid.*damaged or was edited"):
        IterationScheduler.resume(path, CountingRunner(), progress=False)
    # a bad value the caller passes is the caller's error, as without a checkpoint
    with pytest.raises(InputError, match=r"slots=0 is invalid"):
        IterationScheduler.resume(path, CountingRunner(), progress=False, slots=0)


def _resign(line):
    """A journal line with its checksum recomputed (what a deliberate editor would do)."""
    rec = json.loads(line)
    rec.pop("crc")
    return _encode(rec)


def test_in_flight_experiments_are_requeued_once(tmp_path):
    # cut a complete slots=3 journal right after a dispatch: what a crash leaves
    whole = tmp_path / "whole.jsonl"
    cs.scheduler(cs.LoggingRunner(None, 0.002), whole, slots=3, prune=False).run()
    lines = whole.read_text().splitlines(keepends=True)
    cut = [k for k, ln in enumerate(lines) if '"kind": "dispatch"' in ln][14]
    crashed = tmp_path / "crashed.jsonl"
    crashed.write_text("".join(lines[:cut + 1]) + lines[cut + 1][:25])     # and a torn line
    sched = IterationScheduler.resume(crashed, cs.LoggingRunner(None, 0.0),
                                      expander=cs.EXPANDER, progress=False)
    in_flight = {b: s.pending for b, s in sched.stats.items() if s.pending}
    assert sum(in_flight.values()) == 3                   # the state at the crash: 3 pending
    runner = sched.runner
    report = sched.run()
    requeued = [e.hypothesis for e in report.events.of("dispatch") if e.data.get("requeued")]
    assert len(requeued) == 3 and runner.calls[:3] == requeued
    ids = [r.hypothesis.id for r in report.results]
    assert len(ids) == len(set(ids))                       # no duplicates
    all_ids = {r.hypothesis.id for r in json_results(whole)}
    assert set(ids) == all_ids                             # no losses


def json_results(path):
    state = Journal(path).load()
    from dask_research.experiments.books import Books
    from dask_research.experiments.ledger import BranchLedger
    from dask_research.experiments.resume import restore

    books = Books(BranchLedger(0.5))
    restore(state, books, str(path))
    return books.results


SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
import crash_scenario as cs
runner = cs.LoggingRunner({log!r}, {delay!r})
cs.scheduler(runner, {path!r}, slots={slots}, prune={prune}).run()
"""


def _run_and_kill(tmp_path, slots, prune, delay=0.02, after=12):
    path, log = str(tmp_path / "loop.jsonl"), str(tmp_path / "done.log")
    script = tmp_path / "crash_run.py"
    script.write_text(textwrap.dedent(SCRIPT.format(tests=str(HERE), log=log, delay=delay,
                                                    path=path, slots=slots, prune=prune)))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            if os.path.exists(path):
                with open(path) as f:
                    if f.read().count('"kind": "result"') >= after:
                        break
            if proc.poll() is not None:
                pytest.fail(f"the run ended before it was killed: {proc.stderr.read()!r}")
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(30)
    assert proc.returncode == -signal.SIGKILL
    return path, log


def test_sigkill_mid_run_then_resume_equals_an_uninterrupted_run_slots1(tmp_path):
    path, log = _run_and_kill(tmp_path, slots=1, prune=True)
    done_before = open(log).read().split()
    assert 12 <= len(done_before) < 50                     # killed mid-run
    runner = cs.LoggingRunner(log, 0.0)
    with pytest.warns(JournalLockWarning, match=r"loop.jsonl.lease: taking over the lease of the "
                                                r"journal held by .*, because its process, pid \d+ on "
                                                r"this host, is gone"):
        sched = IterationScheduler.resume(path, runner, expander=cs.EXPANDER, progress=False)
    report = sched.run()
    whole = cs.scheduler(cs.LoggingRunner(None, 0.0)).run()
    assert _stats(report) == _stats(whole)                 # the same statistics, bit for bit
    assert report.paper_triggers == whole.paper_triggers
    assert summary(report) == summary(whole)               # and the same decisions
    assert report.replayed >= 12 and report.stop_reason == "queue_empty"


def test_sigkill_mid_run_with_three_slots_runs_every_hypothesis_exactly_once(tmp_path):
    path, log = _run_and_kill(tmp_path, slots=3, prune=False)
    before = open(log).read().split()
    state = Journal(path).load()
    runner = cs.LoggingRunner(log, 0.0)
    with pytest.warns(JournalLockWarning, match=r"its process, pid \d+ on this host, is gone"):
        sched = IterationScheduler.resume(path, runner, expander=cs.EXPANDER, progress=False)
    in_flight = {h.id for h in sched._books.retry}
    report = sched.run()
    ids = [r.hypothesis.id for r in report.results]
    assert len(ids) == len(set(ids))                       # no duplicates
    whole = cs.scheduler(cs.LoggingRunner(None, 0.0), slots=3, prune=False).run()
    assert set(ids) == {r.hypothesis.id for r in whole.results}      # no losses
    assert not report.failed and state.records
    # the runner completed each hypothesis once, except those in flight at the kill, which may
    # have finished in the killed process before their result reached the journal
    done = open(log).read().split()
    twice = {h for h in done if done.count(h) > 1}
    assert twice <= in_flight and set(done) == set(ids)
    assert set(runner.calls) == set(ids) - {r.hypothesis.id for r in report.results[
        :report.replayed]}
    assert len(before) >= 12


@pytest.mark.filterwarnings("ignore::dask_research.experiments.checkpoint.JournalLegacyWarning")
def test_corrupt_foreign_and_pickled_checkpoints_are_refused(tmp_path):
    runner = CountingRunner()
    foreign = tmp_path / "foreign.jsonl"
    foreign.write_text('{"some": "thing"}\n')
    with pytest.raises(CheckpointError, match=f"checkpoint {foreign}: not an experiments "
                                              "journal"):
        _scheduler(runner, foreign).run()
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"format": "dask-research.experiments.journal", "version": 2}\n'
                      'garbage\n{"kind": "output", "branch": "a", "output": 1}\n')
    with pytest.raises(CheckpointError, match=r"line 2 is not valid JSON \(.*\): 'garbage'"):
        _scheduler(runner, broken).run()
    future = tmp_path / "future.jsonl"
    future.write_text('{"format": "dask-research.experiments.journal", "version": 9}\n')
    with pytest.raises(CheckpointError, match="journal version 9 is not supported"):
        IterationScheduler.resume(future, runner, progress=False)
    unfit = tmp_path / "unfit.jsonl"
    unfit.write_text('{"format": "dask-research.experiments.journal", "version": 2}\n'
                     '{"kind": "event", "e": {"kind": "result", "hypothesis": "x", '
                     '"branch": "a", "reward": 1, "t": 0}}\n')
    with pytest.raises(CheckpointError, match=r"record 2 does not fit the state before it"):
        IterationScheduler.resume(unfit, runner, progress=False)
    with pytest.raises(CheckpointError, match="does not exist or is empty"):
        IterationScheduler.resume(tmp_path / "missing.jsonl", runner, progress=False)
    # the same ids on other branches: the checkpoint belongs to another run
    good = tmp_path / "good.jsonl"
    _scheduler(CountingRunner(), good, max_experiments=2).run()
    other = IterationScheduler(runner, checkpoint=good, progress=False)
    with pytest.raises(CheckpointError, match="'strong-0' is on branch 'strong' in the "
                                              "checkpoint but on 'elsewhere' here"):
        other.add([Hypothesis("strong-0", "elsewhere")])
    assert runner.calls == []


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):               # unpickling would create the marker file
        return (open, (self.marker, "w"))


def test_a_planted_pickle_is_refused_and_never_executed(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "loop.jsonl"
    path.write_bytes(pickle.dumps({"format": "x", "payload": _Payload(str(marker))}))
    with pytest.raises(CheckpointError, match=f"checkpoint {path}: is not a UTF-8 JSON-lines "
                                              "journal .* never unpickled"):
        IterationScheduler.resume(path, CountingRunner(), progress=False)
    with pytest.raises(CheckpointError):
        IterationScheduler(CountingRunner(), checkpoint=path)
    assert not marker.exists()
    # a pickle hidden in a JSON payload stays an inert string
    text = pickle.dumps(_Payload(str(marker)), protocol=0).decode("latin-1")
    sched = IterationScheduler(lambda h: 0.5, progress=False, checkpoint=tmp_path / "j.jsonl")
    sched.add([Hypothesis("h1", "a", {"blob": text})])
    sched.run()
    again = IterationScheduler.resume(tmp_path / "j.jsonl", lambda h: 0.5, progress=False)
    assert again.run().results[0].hypothesis.payload == {"blob": text}
    assert not marker.exists()


def test_payloads_must_be_json_with_a_checkpoint(tmp_path):
    sched = IterationScheduler(lambda h: 0.5, progress=False, checkpoint=tmp_path / "j.jsonl")
    with pytest.raises(ExperimentError, match=r"the payload of hypothesis 'h1' is not a JSON "
                                              r"value .* \(never pickle\)"):
        sched.add([Hypothesis("h1", "a", {"fn": print})])
    assert sched.stats == {}


def test_torn_last_line_is_ignored_and_repaired(tmp_path):
    path = tmp_path / "loop.jsonl"
    _scheduler(CountingRunner(), path, max_experiments=3).run()
    with open(path, "a") as f:
        f.write('{"kind": "event", "e": {"kind": "result", "hyp')          # died mid-write
    again = CountingRunner()
    report = _scheduler(again, path, max_experiments=4).run()
    assert report.replayed == 3 and len(again.calls) == 1
    records = [json.loads(line) for line in path.read_text().splitlines()]   # all whole
    assert [r.get("kind") for r in records].count("output") == 1               # strong's
    outcomes = [r for r in records if r.get("kind") == "event"
                and r["e"]["kind"] in ("result", "failure")]
    assert len(outcomes) == 3 + 1


def test_fsspec_url_checkpoint(tmp_path):
    fsspec = pytest.importorskip("fsspec")
    url = "memory://dask-research-test/loop.jsonl"
    fs = fsspec.filesystem("memory")
    if fs.exists(url):
        fs.rm(url)
    _scheduler(CountingRunner(), url, max_experiments=4).run()
    assert fs.exists(url) and not [p for p in fs.ls("/dask-research-test") if ".tmp-" in
                                    p["name"]]
    report = IterationScheduler.resume(url, CountingRunner(), expander=deterministic_expander,
                                       max_experiments=None, progress=False).run()
    whole = _scheduler(CountingRunner(), None).run()
    assert _stats(report) == _stats(whole)
    fs.rm(url)


def test_randomised_and_contextual_policies_resume_exactly(tmp_path):
    def build(path, policy, budget=None):
        run = make_deterministic_runner(lambda h: (h.features[0] + 1) / 3, delay_ms=0)
        sched = IterationScheduler(run, slots=1, progress=False, checkpoint=path,
                                   policy=policy, seed=7, prune_floor=0.0, paper_threshold=1.0,
                                   max_experiments=budget)
        sched.add([Hypothesis(f"{b}{k}", b, features=(k % 3 - 1.0, 1.0))
                   for k in range(6) for b in "abcd"])
        return sched

    for policy in ("thompson", "linucb", "discounted-ucb"):
        whole = build(None, policy).run()
        path = tmp_path / f"{policy}.jsonl"
        build(path, policy, budget=9).run()
        rest = IterationScheduler.resume(path, build(None, policy).runner,
                                         max_experiments=None, progress=False).run()
        assert rest.events.picks() == whole.events.picks(), policy
        assert _stats(rest) == _stats(whole), policy


def test_a_crash_anywhere_in_the_journal_resumes_into_the_uninterrupted_run(tmp_path):
    """The journal as a crash could leave it at every line boundary of a whole run, and in the
    middle of lines: each resumes into the uninterrupted run's decisions and statistics. (A
    crash between a ``select`` and its ``dispatch`` resumed into a second pick of the same
    experiment; between a ``result`` and its ``prune`` or expansion, into a run without them:
    the suite's SIGKILL test caught the first once in a fresh environment.)"""
    import warnings

    path = tmp_path / "whole.jsonl"
    whole = cs.scheduler(cs.LoggingRunner(None, 0.0), str(path)).run()
    expect = (summary(whole), _stats(whole))
    lines = path.read_bytes().splitlines(keepends=True)
    kinds = {json.loads(ln)["e"]["kind"] for ln in lines[1:] if json.loads(ln)["kind"] == "event"}
    assert {"select", "dispatch", "result", "prune", "expand"} <= kinds    # every kind of step is cut
    cuts = cs.journal_cuts(path)
    for k, data in enumerate(cuts):
        cut = tmp_path / f"cut{k}.jsonl"
        cut.write_bytes(data)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", JournalLockWarning)
            again = IterationScheduler.resume(str(cut), cs.LoggingRunner(None, 0.0), expander=cs.EXPANDER,
                                              progress=False)
            again.add(cs.hypotheses())          # as after any crash: those journaled are not added twice
            report = again.run()
        got = (summary(report), _stats(report))
        assert got == expect, (len(data), data.splitlines()[-1][:120])
