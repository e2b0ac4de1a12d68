import pytest

pytest.importorskip("bokeh")

from dask_research.dashboard.components import BranchBoard, branch_view  # noqa: E402
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
    assert max(board.occ.data["n"]) == 3 and board.occ.data["n"][-1] == 0
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
                    (1, {"event": "select", "run": "r", "t": 0.5, "scores": {"good": 1.2, "bad": 0.4}}),
                    (2, {"event": "dispatch", "run": "r", "t": 0.6, "branch": "good"}),
                    (3, {"event": "dispatch", "run": "r", "t": 0.7, "branch": "bad"})]

    board = BranchBoard(_Scheduler())
    board.update()
    assert board.score_fig.yaxis[0].axis_label.startswith("UCB score")
    legends = [r for r in board.score_fig.center if isinstance(r, Legend)]
    assert legends and legends[0].items[0].label.field == "branch"
    assert board.lines.data["branch"] == ["good", "bad"]
