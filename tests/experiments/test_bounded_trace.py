"""The trace stays bounded (issue 14): select events keep the best ``trace_scores`` branch
scores, not every branch's, and a resume reads the journal one record at a time."""
import gc
import json
import tracemalloc

import numpy as np
import pytest

from dask_research.exceptions import InputError
from dask_research.experiments import Hypothesis, IterationScheduler
from dask_research.experiments.decision_trace import top_scores

BRANCHES = 400


async def instant(h):
    return (int(h.id[1:]) % 97) / 100


def _run(n, trace_scores=None, checkpoint=None):
    sched = IterationScheduler(instant, slots=3, progress=False, prune_floor=0.0,
                               paper_threshold=1.0, trace_scores=trace_scores,
                               checkpoint=checkpoint)
    sched.add([Hypothesis(f"h{k}", f"b{k % BRANCHES}") for k in range(n)])
    return sched.run()


def _trace_bytes(n, trace_scores):
    gc.collect()
    tracemalloc.start()
    try:
        report = _run(n, trace_scores)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return report, held / n


def test_select_events_keep_the_best_scores_and_the_pick():
    report = _run(1200)
    selects = report.events.of("select")
    assert len(selects) == 1200
    for ev in selects:
        assert ev.scores is None and len(ev.top) == 32 and ev.scored == BRANCHES
        kept = report.events.scores(ev)
        assert ev.branch in kept and kept[ev.branch] == ev.data["score"]
        values = list(kept.values())
        assert values == sorted(values, reverse=True)
    d = selects[-1].to_dict(report.events.branches)
    assert len(d["scores"]) == 32 and d["scores_truncated"] == BRANCHES
    slim = json.loads(report.to_json(scores=False))
    assert not any("scores" in e or "scores_truncated" in e for e in slim["events"])
    # the same decisions as with every score kept
    full = _run(1200, trace_scores="all")
    assert full.events.picks() == report.events.picks()
    ev = full.events.of("select")[-1]
    assert ev.top is None and len(ev.scores) == BRANCHES
    every = full.events.scores(ev)
    best = sorted(every.items(), key=lambda kv: -kv[1])[:32]
    kept = report.events.scores(selects[-1])
    # the best 31 always; the 32nd place goes to the pick if it is not among them (a branch
    # whose queue is empty still has a score, and may outscore the pick)
    assert list(kept.values())[:31] == [v for _, v in best[:31]]
    assert selects[-1].branch in kept


@pytest.mark.slow
def test_memory_per_experiment_does_not_grow_with_the_branches():
    bounded, per_exp = _trace_bytes(2000, None)
    full, per_exp_full = _trace_bytes(2000, "all")
    assert bounded.total_runs == full.total_runs == 2000
    # every score: 8 bytes x 400 branches per decision; bounded: a few hundred bytes
    assert per_exp_full > 8 * BRANCHES
    assert per_exp < 4000 and per_exp < per_exp_full / 2


@pytest.mark.slow
def test_resume_reads_the_journal_one_record_at_a_time(tmp_path):
    path = tmp_path / "loop.jsonl"
    _run(1500, checkpoint=path)
    size = path.stat().st_size
    gc.collect()
    tracemalloc.start()
    try:
        sched = IterationScheduler.resume(path, instant, progress=False)
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert sched.stats["b0"].runs == 1500 // BRANCHES + (0 < 1500 % BRANCHES)
    # every parsed record at once would hold several times the file; one at a time, the
    # peak is the file plus the restored state
    assert peak - held < 2.5 * size


def test_top_scores_and_the_setting():
    s = np.array([0.2, np.inf, 0.5, np.inf, 0.1])
    assert top_scores(s, 2, 4).tolist() == [(1, np.inf), (4, 0.1)]
    assert top_scores(s, 9, 0)["branch"].tolist() == [1, 3, 2, 0, 4]
    with pytest.raises(InputError, match=r"trace_scores=0 is invalid; expected an integer "
                                         r">= 1, or \"all\""):
        IterationScheduler(instant, trace_scores=0)
