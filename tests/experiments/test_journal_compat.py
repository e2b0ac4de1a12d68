"""Journals and lock files written by earlier versions still load (issue 25).

``data/journal_v3/`` was written by the code at commit 84ff875 (before the journal moved onto
``dask_research.durable``): ``loop.jsonl``, a version-3 journal of ``crash_scenario.scheduler``
with ``slots=2, prune=True, max_experiments=9``, and ``loop.jsonl.lock``, the JSON lock file
that version left behind a driver killed on another host. Version-2 journals are covered by
``test_journal_integrity.test_a_legacy_version_2_journal_is_read_with_a_warning``.
"""
import pathlib
import shutil
import warnings

import crash_scenario as cs

from dask_research.experiments import IterationScheduler
from dask_research.experiments.checkpoint import Journal
from dask_research.experiments.lock import JournalLockWarning

DATA = pathlib.Path(__file__).resolve().parent / "data" / "journal_v3"


def test_a_version_3_journal_and_its_old_lock_file_resume(tmp_path):
    work = tmp_path / "runs"
    shutil.copytree(DATA, work)
    path, lock = work / "loop.jsonl", work / "loop.jsonl.lock"
    old_lock = lock.read_bytes()
    state = Journal(path).load()
    assert state.settings["slots"] == 2 and state.settings["max_experiments"] == 9
    with warnings.catch_warnings():
        warnings.simplefilter("error", JournalLockWarning)       # nothing to take over
        sched = IterationScheduler.resume(path, cs.LoggingRunner(None, 0.0), expander=cs.EXPANDER,
                                          max_experiments=None, progress=False)
    assert sum(s.runs + s.failures for s in sched.stats.values()) == 9
    report = sched.run()
    assert report.replayed == 9 and report.stop_reason == "queue_empty"
    ids = [r.hypothesis.id for r in report.results]
    assert len(ids) == len(set(ids))                              # nothing ran twice
    done = set(ids) | {r.hypothesis.id for r in report.failed} | set(report.dropped)
    assert {h.id for h in cs.hypotheses()} <= done                # every one run or dropped, once
    assert lock.read_bytes() == old_lock                          # only flocked, never rewritten
    assert path.read_bytes().startswith((DATA / "loop.jsonl").read_bytes())   # appended to, not rewritten
