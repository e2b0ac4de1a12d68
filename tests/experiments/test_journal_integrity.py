"""Per-record checksums of the experiments journal (issue 14), on real files.

A whole record that lost only its newline is kept (and ended with one before the next append);
a torn last line is ignored; any other damaged line is refused with its line number, so an
edited reward never resumes into different statistics.
"""
import json
import re
import warnings

import pytest

from dask_research.exceptions import CheckpointError, ExperimentError
from dask_research.experiments import Hypothesis, IterationScheduler
from dask_research.experiments.checkpoint import Journal, JournalLegacyWarning, _encode

REWARDS = {"a": 0.8, "b": 0.3}


class Runner:
    """Reward by branch, a digit of variety per id; remembers what it ran."""

    def __init__(self):
        self.calls = []

    def __call__(self, h):
        self.calls.append(h.id)
        return REWARDS[h.branch] + int(h.id[-1]) / 1000


def _scheduler(runner, path, **kw):
    sched = IterationScheduler(runner, slots=1, progress=False, checkpoint=path,
                               prune_floor=0.0, **kw)
    sched.add([Hypothesis(f"{b}-{k}", b) for k in range(5) for b in REWARDS])
    return sched


def _stats(report):
    return {b: (s.runs, s.reward_sum, s.failures, s.queued) for b, s in report.branches.items()}


def test_a_record_torn_just_before_its_newline_is_kept_not_cut(tmp_path):
    path = tmp_path / "loop.jsonl"
    first = _scheduler(Runner(), path, max_experiments=3).run()
    data = path.read_bytes()
    assert data.endswith(b"\n")
    path.write_bytes(data[:-1])                 # the crash came between record and newline
    last = json.loads(data.splitlines()[-1])
    assert last["kind"] == "event"
    runner = Runner()
    again = _scheduler(runner, path, max_experiments=4).run()
    # nothing counted was lost: the three results are replayed, one new experiment runs
    assert again.replayed == 3 and len(runner.calls) == 1
    assert not set(runner.calls) & {r.hypothesis.id for r in first.results}
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"" and json.loads(lines[len(data.splitlines()) - 1]) == last
    state = Journal(path).load()                # every line whole and checked
    outcomes = [r for r in state.records if r["kind"] == "event"
                and r["e"]["kind"] in ("result", "failure")]
    assert len(outcomes) == 4


def test_a_flipped_digit_in_a_reward_is_refused_with_its_line(tmp_path):
    path = tmp_path / "loop.jsonl"
    _scheduler(Runner(), path, max_experiments=6).run()
    lines = path.read_text().splitlines(keepends=True)
    n = next(k for k, ln in enumerate(lines) if '"kind": "result"' in ln)
    m = re.search(r'"reward": 0\.(\d)', lines[n])
    digit = m.group(1)
    flipped = "9" if digit != "9" else "1"
    lines[n] = lines[n][:m.start(1)] + flipped + lines[n][m.end(1):]
    path.write_text("".join(lines))
    with pytest.raises(CheckpointError, match=rf"loop.jsonl: line {n + 1} fails its checksum "
                                              r"\(the record was altered or damaged\)"):
        IterationScheduler.resume(path, Runner(), progress=False)
    with pytest.raises(CheckpointError, match=rf"line {n + 1} fails its checksum"):
        _scheduler(Runner(), path)
    # the same flip in the last line, newline kept: refused too (a torn write has no newline)
    _scheduler(Runner(), tmp_path / "b.jsonl", max_experiments=2).run()
    tail = (tmp_path / "b.jsonl").read_text().splitlines(keepends=True)
    tail[-1] = tail[-1].replace('"queued": ', '"queued": 1')
    (tmp_path / "b.jsonl").write_text("".join(tail))
    with pytest.raises(CheckpointError, match=rf"line {len(tail)} fails its checksum"):
        IterationScheduler.resume(tmp_path / "b.jsonl", Runner(), progress=False)


def test_a_torn_tail_is_ignored_and_cut_and_only_the_last_line(tmp_path):
    whole = tmp_path / "whole.jsonl"
    reference = _scheduler(Runner(), whole).run()
    path = tmp_path / "loop.jsonl"
    _scheduler(Runner(), path, max_experiments=4).run()
    good = path.read_bytes()
    extra = whole.read_bytes()[len(good):].split(b"\n")[0]
    assert extra                                   # the next record, as the crash tore it
    for cut in (5, len(extra) // 2, len(extra) - 3):
        path.write_bytes(good + extra[:cut])
        assert len(Journal(path).load().records) == len(good.splitlines()) - 1
    runner = Runner()
    report = _scheduler(runner, path).run()
    assert report.replayed == 4 and _stats(report) == _stats(reference)
    assert Journal(path).load() is not None and not path.read_bytes().count(extra[:len(extra) - 3])
    # a torn line that is not the last one is damage, not a tear
    lines = good.split(b"\n")
    lines[2] = lines[2][:20]
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(CheckpointError, match=r"line 3 (fails its checksum|is not valid JSON)"):
        Journal(path).load()


def test_a_line_without_a_checksum_in_a_new_journal_is_refused(tmp_path):
    path = tmp_path / "loop.jsonl"
    _scheduler(Runner(), path, max_experiments=2).run()
    lines = path.read_text().splitlines()
    rec = json.loads(lines[3])
    del rec["crc"]
    lines[3] = json.dumps(rec)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(CheckpointError, match=r"line 4 has no checksum; every record of a "
                                              r"version-3 journal carries one"):
        Journal(path).load()


def test_a_legacy_version_2_journal_is_read_with_a_warning(tmp_path):
    path = tmp_path / "old.jsonl"
    _scheduler(Runner(), path, max_experiments=3).run()
    legacy = []
    for k, line in enumerate(path.read_text().splitlines()):
        rec = json.loads(line)
        del rec["crc"]
        if k == 0:
            rec["version"] = 2
        legacy.append(json.dumps(rec))
    path.write_text("\n".join(legacy) + "\n")
    with pytest.warns(JournalLegacyWarning, match=r"old.jsonl: a version-2 journal, written "
                                                  r"without per-record checksums"):
        sched = IterationScheduler.resume(path, Runner(), progress=False, max_experiments=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", JournalLegacyWarning)
        report = sched.run()
        assert report.replayed == 3
        state = Journal(path).load()
    assert len(state.records) > 3
    new = path.read_text().splitlines()[len(legacy):]
    assert new and all('"crc": "' in ln for ln in new)       # appended records are checked


def _resign_line(path, pick, edit):
    """Edit the first record ``pick`` accepts and recompute its checksum (a deliberate editor)."""
    lines = path.read_text().splitlines()
    n = next(k for k, ln in enumerate(lines) if pick(ln))
    rec = json.loads(lines[n])
    rec.pop("crc")
    edit(rec)
    lines[n] = _encode(rec)
    path.write_text("\n".join(lines) + "\n")
    return n + 1


@pytest.mark.parametrize("reward", ["inf", "nan", "-inf", 1e308, -5, 1.5, True, [0.5], None])
def test_a_resigned_reward_the_live_loop_counts_as_a_failure_is_refused_on_resume(tmp_path, reward):
    path = tmp_path / "loop.jsonl"
    _scheduler(Runner(), path, max_experiments=3).run()
    n = _resign_line(path, lambda ln: '"kind": "result"' in ln,
                     lambda rec: rec["e"].__setitem__("reward", reward))
    with pytest.raises(CheckpointError, match=rf"loop.jsonl: record {n} is a result of '[ab]-\d' with reward "
                                              rf"{re.escape(repr(reward))}, which the live loop counts as a "
                                              r"failure \(.+\); the journal was edited"):
        IterationScheduler.resume(path, Runner(), progress=False)
    with pytest.raises(CheckpointError, match=rf"record {n} is a result"):
        _scheduler(Runner(), path)                    # the constructor replays it the same way


@pytest.mark.parametrize("reward, accepted", [(1e308, True), (-5, True), ("inf", False), ("nan", False)])
def test_resume_accepts_exactly_the_rewards_the_live_loop_accepts(tmp_path, reward, accepted):
    """Unbounded rewards: the live loop counts 1e308 and -5 as results, inf and nan as failures."""
    path = tmp_path / "loop.jsonl"
    live = IterationScheduler(lambda h: float(reward), slots=1, progress=False, bounded=False)
    live.add([Hypothesis("x-0", "a")])
    assert bool(live.run().results) is accepted
    _scheduler(Runner(), path, max_experiments=3, bounded=False).run()
    _resign_line(path, lambda ln: '"kind": "result"' in ln, lambda rec: rec["e"].__setitem__("reward", reward))
    if accepted:
        sched = IterationScheduler.resume(path, Runner(), progress=False)
        assert reward in [r.reward for r in sched._books.results]
    else:
        with pytest.raises(CheckpointError, match="which the live loop counts as a failure"):
            IterationScheduler.resume(path, Runner(), progress=False)


@pytest.mark.parametrize("key, value, problem", [
    ("slots", 1e9, r"its header's setting slots is 1000000000.0; expected a whole number; the file is "
                   r"damaged or was edited"),
    ("slots", 10 ** 9, r"holds a setting that cannot be used \(IterationScheduler: slots=1000000000 is invalid; "
                       r"expected an integer in \[1, 65536\]\)"),
    ("bounded", "yes", r"its header's setting bounded is 'yes'; expected true or false"),
    ("prune_floor", "inf", r"its header's setting prune_floor is 'inf'; expected a finite number, or an "
                                  r"object \{objective: finite number\}"),
    ("objectives", [["a"]], r"its header's setting objectives\[0\] is \['a'\]; expected a list of 2 items"),
    ("checkpoint", "/etc/passwd", r"its header has an unknown entry 'checkpoint'; the file is damaged"),
])
def test_a_resigned_header_setting_is_refused_naming_it(tmp_path, key, value, problem):
    path = tmp_path / "loop.jsonl"
    _scheduler(Runner(), path, max_experiments=2).run()
    _resign_line(path, lambda ln: '"format"' in ln, lambda rec: rec["settings"].__setitem__(key, value))
    with pytest.raises(CheckpointError, match=rf"checkpoint {path}: {problem}"):
        IterationScheduler.resume(path, Runner(), progress=False)
    if key == "slots":                                # the caller's own value replaces the bad one
        assert IterationScheduler.resume(path, Runner(), progress=False, slots=2).slots == 2


def test_a_step_is_kept_whole_or_not_at_all(tmp_path):
    """The records of one step are committed together: every line but the step's last carries
    ``"more": true``; a step whose last line is missing is ignored and cut off before the next
    append; ``more`` of any other value is refused with its line."""
    path = tmp_path / "loop.jsonl"
    j = Journal(path)
    j.open({"slots": 1})
    j.append({"kind": "output", "branch": "a", "output": 1})            # a step of one record
    j.stage({"kind": "output", "branch": "b", "output": 2})
    j.stage({"kind": "output", "branch": "c", "output": 3})
    assert len(path.read_bytes().splitlines()) == 2                     # staged: not written yet
    j.commit()
    j.close()
    lines = path.read_bytes().splitlines(keepends=True)
    assert [json.loads(ln).get("more") for ln in lines[1:]] == [None, True, None]
    assert [r["branch"] for r in Journal(path).load().records] == ["a", "b", "c"]
    path.write_bytes(b"".join(lines[:3]))                               # the crash came inside the step
    assert [r["branch"] for r in Journal(path).load().records] == ["a"]
    j = Journal(path)
    j.append({"kind": "output", "branch": "d", "output": 4})
    j.close()
    assert [r["branch"] for r in Journal(path).load().records] == ["a", "d"]
    assert b'"branch": "b"' not in path.read_bytes()                    # cut off, not left inside
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(lines[0] + (_encode({"kind": "output", "branch": "e", "output": 5, "more": 1}) + "\n").encode())
    with pytest.raises(CheckpointError, match=r"line 2 holds more=1; a journal record carries more=true or nothing"):
        Journal(bad).load()


@pytest.mark.parametrize("drive", ["run", "ask/tell"])
def test_a_step_an_error_cut_short_is_not_written_by_the_close_that_follows(tmp_path, drive):
    """A result whose follow-ups cannot be journaled (here a hyps record over the line limit)
    ends the run or the tell with that error; closing the journal afterwards must not commit the
    result staged without them: on resume the experiment runs again, its follow-ups with it
    (found by review: the close committed the half step, and resume lost the follow-ups)."""
    import dask

    path = tmp_path / "loop.jsonl"

    def expander(res):
        return [Hypothesis(res.hypothesis.id + "-child", "a", {"blob": "x" * 20000})] if res.hypothesis.id == "a1" else []

    with dask.config.set({"research.experiments.journal-max-line-bytes": 10000}):
        sched = IterationScheduler((lambda h: 0.5) if drive == "run" else None, slots=1, progress=False,
                                   expander=expander, prune_floor=0.0, checkpoint=path)
        sched.add([Hypothesis(f"a{i}", "a") for i in range(3)])
        with pytest.raises(CheckpointError, match="more than the 10,000"):
            if drive == "run":
                sched.run()
            else:
                for _ in range(2):
                    sched.tell(sched.ask(), 0.5)
        if drive == "ask/tell":
            sched.report()                  # closes the journal, as run() did
    events = [(r["e"]["kind"], r["e"].get("hypothesis")) for r in Journal(path).load().records if r["kind"] == "event"]
    assert ("result", "a0") in events and ("dispatch", "a1") in events and ("result", "a1") not in events
    # its memory holds a1's result, its checkpoint does not: it goes no further (review: a second
    # run() counted a1, a later tell committed on top of it); the checkpoint is where it goes on
    for go_on in (sched.run, sched.ask, lambda: sched.tell("a1", 0.5), lambda: sched.add(Hypothesis("z", "a"))):
        with pytest.raises(ExperimentError, match="ahead of the checkpoint; go on from the checkpoint"):
            go_on()
    resumed = IterationScheduler.resume(path, (lambda h: 0.5) if drive == "run" else None, expander=lambda res: [])
    assert [r.hypothesis.id for r in resumed._books.results] == ["a0"]
    assert [x.id for x in resumed._books.retry] == ["a1"]       # runs again on resume


def test_a_run_cancelled_while_its_paper_is_written_keeps_its_stop_in_the_journal(tmp_path):
    """Decisions alone (the final stop) are committed before the run waits on anything, so an
    interruption while it waits for a paper writer loses none of them (review: the stop was
    staged across that wait and dropped with the interrupted step)."""
    import asyncio
    import contextlib

    path = tmp_path / "loop.jsonl"

    async def writer(branch, stats, best):
        await asyncio.Event().wait()            # still writing when the run is interrupted

    async def main():
        sched = IterationScheduler(lambda h: 0.9, slots=1, progress=False, paper_writer=writer,
                                   paper_threshold=0.5, prune_floor=0.0, checkpoint=path)
        sched.add([Hypothesis(f"a-{k}", "a") for k in range(2)])
        task = asyncio.ensure_future(sched.run_async())
        while not (sched._recorder.trace and any(e.kind == "stop" for e in sched._recorder.trace)):
            assert not task.done()
            await asyncio.sleep(0.01)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(main())
    kinds = [r["e"]["kind"] for r in Journal(path).load().records if r["kind"] == "event"]
    assert "paper.trigger" in kinds and kinds[-1] == "stop", kinds


def test_a_runner_that_swallows_its_cancellation_books_nothing_after_the_run(tmp_path):
    """An interrupted run cancels its experiments; one whose runner swallows the cancellation and
    returns must not be booked into the journal the run has closed (review: its completion hook
    did, and took the journal's lease again)."""
    import asyncio
    import contextlib

    path = tmp_path / "loop.jsonl"

    async def main():
        started = asyncio.Event()

        async def runner(h):
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                pass                            # swallowed: it returns a reward anyway
            return 0.9

        sched = IterationScheduler(runner, slots=1, progress=False, prune_floor=0.0, checkpoint=path)
        sched.add([Hypothesis("a-0", "a")])
        task = asyncio.ensure_future(sched.run_async())
        await started.wait()
        task.cancel()                           # Ctrl-C in a notebook
        with contextlib.suppress(asyncio.CancelledError):
            await task
        for _ in range(20):                     # the swallowed one returns now
            await asyncio.sleep(0)

    asyncio.run(main())
    kinds = [r["e"]["kind"] for r in Journal(path).load().records if r["kind"] == "event"]
    assert "dispatch" in kinds and "result" not in kinds, kinds
    assert not (tmp_path / "loop.jsonl.lease").exists()
