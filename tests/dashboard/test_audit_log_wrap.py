"""Audit: an open page goes on with its run when the scheduler's event log wraps.

The scheduler keeps the last ``distributed.admin.low-level-log-length`` (1,000) entries of a
topic. Where more were logged between two updates than it keeps, the Shards page started over
from what the log held, found no ``start`` there and froze on its last picture for the rest
of the run; the Branches page, which re-read the whole log, found no ``add`` and froze too.
"""
import dask
import pytest
from distributed import Client, LocalCluster

pytest.importorskip("bokeh")

from dask_research.dashboard.components import BranchBoard, ShardBoard  # noqa: E402
from dask_research.testing.processes import wait_for  # noqa: E402

KEEP = 40


@pytest.fixture
def short_log_cluster(loop):
    with dask.config.set({"distributed.admin.low-level-log-length": KEEP}), \
            LocalCluster(loop=loop, n_workers=1, threads_per_worker=1, processes=False,
                         dashboard_address=None) as cl, Client(cl, set_as_default=False) as c:
        yield cl, c


def _logged(cl, topic, event):
    """Wait until ``event`` is the newest entry of ``topic``."""
    wait_for(lambda: (log := cl.scheduler.get_events(topic)) and log[-1][1] == event, 60, f"{event} logged")


def test_the_shards_page_goes_on_with_its_run_after_the_log_wrapped(short_log_cluster):
    cl, c = short_log_cluster
    topic = "research.montecarlo"
    c.log_event(topic, {"event": "start", "run": "r", "shards": 1000, "key_prefix": "p", "name": "job",
                        "client": c.id})
    for i in range(10):
        c.log_event(topic, {"event": "accepted", "run": "r", "start": i, "stop": i + 1})
    _logged(cl, topic, {"event": "accepted", "run": "r", "start": 9, "stop": 10})
    board = ShardBoard(cl.scheduler)
    board.update()
    assert "990 queued, 10 accepted" in board.summary.text
    for i in range(10, 10 + 3 * KEEP):            # more than the log keeps, between two updates
        c.log_event(topic, {"event": "accepted", "run": "r", "start": i, "stop": i + 1})
    last = {"event": "accepted", "run": "r", "start": 9 + 3 * KEEP, "stop": 10 + 3 * KEEP}
    _logged(cl, topic, last)
    board.update()
    assert board.start is not None and board.start["run"] == "r"
    assert f"{10 + KEEP} accepted" in board.summary.text            # what the page read, and says so
    assert "dropped some of this run's events" in board.summary.text
    c.log_event(topic, {"event": "done", "run": "r"})
    _logged(cl, topic, {"event": "done", "run": "r"})
    board.update()
    assert "(done)" in board.summary.text


def test_the_branches_page_goes_on_with_its_run_after_the_log_wrapped(short_log_cluster):
    cl, c = short_log_cluster
    topic = "research.experiments"
    c.log_event(topic, {"event": "add", "run": "r"})
    c.log_event(topic, {"event": "dispatch", "run": "r", "t": 0.0, "branch": "a", "hypothesis": "a0", "slot": 0})
    _logged(cl, topic, {"event": "dispatch", "run": "r", "t": 0.0, "branch": "a", "hypothesis": "a0", "slot": 0})
    board = BranchBoard(cl.scheduler)
    board.update()
    assert board.source.data["branch"] == ["a"]
    for i in range(2 * KEEP):
        c.log_event(topic, {"event": "result", "run": "r", "t": 1.0 + i, "branch": "b", "hypothesis": f"b{i}",
                            "mean": 0.5})
    c.log_event(topic, {"event": "paper.trigger", "run": "r", "branch": "b"})
    _logged(cl, topic, {"event": "paper.trigger", "run": "r", "branch": "b"})
    board.update()
    assert board.source.data["branch"] == ["a", "b"] and board.source.data["status"] == ["active", "paper"]
    assert "papers: b" in board.summary.text
