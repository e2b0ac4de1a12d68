import pytest

pytest.importorskip("bokeh")

from dask_research.dashboard.components import BranchBoard
from dask_research.dashboard.folds import branch_view  # noqa: E402
from dask_research.experiments import Hypothesis, IterationScheduler, make_deterministic_runner  # noqa: E402


def test_branch_board_on_a_real_run(small_cluster):
    cl, c = small_cluster
    board = BranchBoard(cl.scheduler)
    board.update()
    assert "No experiments" in board.summary.text
    runner = make_deterministic_runner({"good": 0.9, "mid": 0.5, "bad": 0.05}, delay_ms=2)
    sched = IterationScheduler(runner, slots=3, progress=False, client=c)
    sched.add([Hypothesis(f"{b}{k}", b) for k in range(5) for b in ("good", "mid", "bad")])
    report = sched.run()
    board.update()
    data = dict(zip(board.source.data["branch"], zip(board.source.data["status"], board.source.data["runs"],
                                                      board.source.data["mean"])))
    assert data["good"][0] == "paper" and data["bad"][0] == "pruned" and data["mid"][0] == "active"
    for name, stats in report.branches.items():
        assert data[name][1] == stats.runs and data[name][2] == pytest.approx(stats.mean)
    # three slots: never more than three running, whatever is queued ahead behind them (the
    # page read six "in flight" once experiments were queued ahead on the workers)
    assert max(board.occ.data["n"]) == 3 and board.occ.data["n"][-1] == 0 and board.occ.data["ahead"][-1] == 0
    assert len(board.lines.data["xs"]) == 3
    assert "papers: good" in board.summary.text and "queue_empty" in board.summary.text


def test_a_new_run_replaces_the_old_one():
    def batch(run, recs):
        return (0, {"event": "batch", "run": run, "events": [dict(r, run=run) for r in recs]})

    ev = [batch("r1", [{"event": "add"}, {"event": "dispatch", "branch": "x", "t": 0.1},
                       {"event": "result", "branch": "x", "t": 0.2, "mean": 0.3}]),
          batch("r2", [{"event": "add"}, {"event": "dispatch", "branch": "y", "t": 0.1}])]
    view = branch_view(ev)
    assert view["run"] == "r2" and list(view["branches"]) == ["y"] and view["branches"]["y"]["pending"] == 1


def test_the_score_lines_are_named_and_the_axis_says_what_it_shows():
    """The "UCB score at each selection" plot had unnamed lines and no y label."""
    from bokeh.models import Legend

    class _Scheduler:
        def get_events(self, topic):
            return [(0, {"event": "add", "run": "r"}),
                    (1, {"event": "result", "run": "r", "t": 0.4, "branch": "good", "mean": 0.9}),
                    (2, {"event": "result", "run": "r", "t": 0.4, "branch": "bad", "mean": 0.1}),
                    (3, {"event": "select", "run": "r", "t": 0.5, "scores": {"good": 1.2, "bad": 0.4}}),
                    (4, {"event": "dispatch", "run": "r", "t": 0.6, "branch": "good"}),
                    (5, {"event": "dispatch", "run": "r", "t": 0.7, "branch": "bad"})]

    board = BranchBoard(_Scheduler())
    board.update()
    assert board.score_fig.yaxis[0].axis_label.startswith("UCB score")
    legends = [r for r in board.score_fig.right if isinstance(r, Legend)]     # beside the lines, not on them
    assert legends and legends[0].items[0].label.field == "branch"
    assert board.lines.data["branch"] == ["good", "bad"]


def _records(*recs):
    return [(i, dict(r, run="r")) for i, r in enumerate([{"event": "add"}, *recs])]


def test_a_score_line_starts_at_the_branch_s_first_result_and_is_drawn_as_steps():
    """As in the demo report (issue 29): before its first result a branch's score is the bonus
    over no data (infinite, drawn as a vertical line from 0), and a straight line between two
    selections drew a score the scheduler never computed."""
    class _Scheduler:
        def get_events(self, topic):
            return _records(
                {"event": "select", "t": 0.0, "scores": {"a": "inf", "b": "inf"}},
                {"event": "dispatch", "t": 0.0, "branch": "a", "hypothesis": "a0", "slot": 0},
                {"event": "dispatch", "t": 0.0, "branch": "b", "hypothesis": "b0", "slot": 1},
                {"event": "result", "t": 1.0, "branch": "a", "hypothesis": "a0", "mean": 0.5},
                {"event": "select", "t": 1.0, "scores": {"a": 2.0, "b": "inf"}},
                {"event": "result", "t": 2.0, "branch": "b", "hypothesis": "b0", "mean": 0.2},
                {"event": "select", "t": 2.0, "scores": {"a": 1.5, "b": 1.9}},
                {"event": "select", "t": 4.0, "scores": {"a": 1.2, "b": 1.4}})

    board = BranchBoard(_Scheduler())
    board.update()
    lines = dict(zip(board.lines.data["branch"], zip(board.lines.data["xs"], board.lines.data["ys"])))
    assert lines["a"] == ([1.0, 2.0, 2.0, 4.0, 4.0], [2.0, 2.0, 1.5, 1.5, 1.2])
    assert lines["b"] == ([2.0, 4.0, 4.0], [1.9, 1.9, 1.4])


def test_slot_use_counts_an_experiment_queued_ahead_when_it_starts():
    """A dispatch ``ahead`` waits behind its slot's running experiment: it is queued, not
    running, until that one ends; one that ends while queued leaves the queue."""
    view = branch_view(_records(
        {"event": "dispatch", "t": 1.0, "branch": "a", "hypothesis": "h1", "slot": 0},
        {"event": "dispatch", "t": 1.0, "branch": "a", "hypothesis": "h2", "slot": 1},
        {"event": "dispatch", "t": 1.5, "branch": "a", "hypothesis": "h3", "slot": 0, "ahead": True},
        {"event": "dispatch", "t": 1.5, "branch": "a", "hypothesis": "h4", "slot": 1, "ahead": True},
        {"event": "result", "t": 2.0, "branch": "a", "hypothesis": "h1", "mean": 0.5},
        {"event": "result", "t": 2.5, "branch": "a", "hypothesis": "h4", "mean": 0.5},
        {"event": "result", "t": 3.0, "branch": "a", "hypothesis": "h2", "mean": 0.5},
        {"event": "dispatch", "t": 3.0, "branch": "a", "hypothesis": "h3", "slot": 2, "requeued": True},
        {"event": "result", "t": 4.0, "branch": "a", "hypothesis": "h3", "mean": 0.5}))
    t, running, ahead = view["occupancy"]
    assert list(zip(t, running, ahead)) == [
        (0.0, 0, 0), (1.0, 1, 0), (1.0, 2, 0), (1.5, 2, 1), (1.5, 2, 2),
        (2.0, 2, 1),      # h1 ended: h3 takes slot 0
        (2.5, 2, 0),      # h4 ended while queued behind h2 (it found a free thread of its own)
        (3.0, 1, 0),      # h2 ended
        (3.0, 1, 0),      # h3 dispatched again elsewhere: it left slot 0 for slot 2
        (4.0, 0, 0)]
    assert view["branches"]["a"] == {"runs": 4, "pending": 0, "mean": 0.5, "pruned": False, "paper": False}
