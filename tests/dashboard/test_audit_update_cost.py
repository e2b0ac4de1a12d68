"""Audit: a page update costs the events logged since the last one, never the whole log.

The Branches and Experience pages re-read the topic's whole log on every update (every half
second and every second): 3 s of the scheduler's event loop per update with 300,000
experiments events in the log (batches of many events each), 100 ms with the 1,000 replay
entries the scheduler keeps. Counted here in events read, not in wall time.
"""
import pytest

pytest.importorskip("bokeh")

from dask_research.dashboard import components  # noqa: E402
from dask_research.dashboard.components import BranchBoard, ExperiencePanel  # noqa: E402
from dask_research.dashboard.folds import BranchFold, PlaneFold  # noqa: E402


class _Scheduler:
    clients: dict = {}

    def __init__(self, log):
        self.log = log

    def get_events(self, topic):
        return tuple(self.log)


@pytest.fixture
def counted(monkeypatch):
    """How many events the pages read from the log (``unpack`` yields each once)."""
    read = [0]
    real = components.unpack

    def unpack(log):
        for item in real(log):
            read[0] += 1
            yield item

    monkeypatch.setattr(components, "unpack", unpack)
    return read


def _experiments(n_batches, per, first=0):
    out = []
    for i in range(n_batches):
        events = []
        for j in range(per):
            k = first + i * per + j
            b, h, t = f"b{k % 7}", f"h{k}", k * 0.01
            events += [{"event": "select", "run": "r", "t": t, "scores": {f"b{m}": 1.0 + m for m in range(7)}},
                       {"event": "dispatch", "run": "r", "t": t, "branch": b, "hypothesis": h, "slot": k % 4},
                       {"event": "result", "run": "r", "t": t, "branch": b, "hypothesis": h, "mean": 0.5}]
        out.append((float(i), {"event": "batch", "source": "experiments", "run": "r", "events": events}))
    return out


def test_a_branches_update_reads_only_the_new_events(counted):
    log = [(0.0, {"event": "add", "run": "r"})] + _experiments(200, 20)
    board = BranchBoard(_Scheduler(log))
    board.update()
    assert counted[0] == 1 + 200 * 20 * 3
    assert sum(board.occ.data["n"][-1:]) == 0 and board.summary.text.count("4000 results") == 1
    counted[0] = 0
    board.update()
    assert counted[0] == 0
    log += _experiments(1, 2, first=4000)
    board.update()
    assert counted[0] == 6
    assert "4002 results" in board.summary.text
    data = board.occ.data
    assert data["n"][-1] == 0 and len(data["t"]) == len(data["n"]) <= BranchFold.MAX_OCCUPANCY


def test_the_branches_series_are_bounded_however_long_the_run():
    n = BranchFold.MAX_POINTS + BranchFold.MAX_OCCUPANCY
    log = [(0.0, {"event": "add", "run": "r"})] + _experiments(1, n)
    board = BranchBoard(_Scheduler(log))
    board.update()
    assert max(len(xs) for xs in board.lines.data["xs"]) <= 2 * BranchFold.MAX_POINTS
    assert len(board.occ.data["t"]) == BranchFold.MAX_OCCUPANCY
    assert board.occ.data["t"][-1] == pytest.approx((n - 1) * 0.01)       # the latest points kept


def _stats(i):
    return (float(i), {"event": "stats", "plane": "p", "t": 100.0 + i, "size": i, "capacity": 10**6,
                       "inserted": 10 * i, "sampled": 5 * i, "tiers": [{"name": "host", "used": i, "rows": 10**6}],
                       "exposed_mean_s": 0.001, "step_mean_s": 0.01})


def test_an_experience_update_reads_only_the_new_events(counted):
    log = [_stats(i) for i in range(1000)]
    panel = ExperiencePanel(_Scheduler(log))
    panel.update()
    assert counted[0] == 1000 and len(panel.source.data["t"]) == 1000
    counted[0] = 0
    log.append(_stats(1000))
    panel.update()
    assert counted[0] == 1
    data = panel.source.data
    assert len(data["t"]) == 1001 and data["ingest_rate"][-1] == pytest.approx(10.0)
    assert "1,000 transitions" in panel.summary.text


def test_the_experience_series_are_bounded_however_long_the_plane_publishes():
    log = [_stats(i) for i in range(PlaneFold.MAX_POINTS + 10)]
    panel = ExperiencePanel(_Scheduler(log))
    panel.update()
    assert len(panel.source.data["t"]) == PlaneFold.MAX_POINTS
    log.append(_stats(PlaneFold.MAX_POINTS + 10))
    panel.update()
    assert len(panel.source.data["t"]) == PlaneFold.MAX_POINTS
    assert panel.source.data["t"][-1] == pytest.approx((100.0 + PlaneFold.MAX_POINTS + 10) * 1000.0)
