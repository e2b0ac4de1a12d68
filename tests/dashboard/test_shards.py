import numpy as np
import pytest
from distributed import Client

pytest.importorskip("bokeh")

from dask_research import montecarlo as mc  # noqa: E402
from dask_research.dashboard.components import STATE_NAMES, ShardBoard, run_status, shard_states  # noqa: E402
from dask_research.testing.processes import wait_for  # noqa: E402


def test_shard_board_shows_a_real_run(dashboard_cluster):
    cl, c = dashboard_cluster
    job = mc.Job(lambda a: np.sin(a), {"a": mc.Normal(0, 1)}, shards=40, samples_per_shard=512, seed=2, bins=16)
    board = ShardBoard(cl.scheduler)
    board.update()
    assert board.source.data["x"] == [] and "No Monte-Carlo run" in board.summary.text
    res = mc.run(job, client=c, verify=3, progress=False, shards_per_task=4)
    board.update()
    states = board.source.data["state"]
    assert len(states) == 40
    checked = {ch["shard"] for ch in res.verification["checked"]}
    assert {i for i, s in enumerate(states) if s == "verified"} == checked
    assert states.count("accepted") == 40 - len(checked)
    assert res.run_id[:12] in board.summary.text and "done" in board.summary.text
    assert f"{res.mean:.6g}"[:4] in board.summary.text  # the running estimate ended at the mean


def test_states_from_events():
    ev = [(0, {"event": "start", "run": "old", "shards": 3}),
          (1, {"event": "start", "run": "r", "shards": 6, "key_prefix": "p"}),
          (2, {"event": "accepted", "run": "r", "start": 0, "stop": 2}),
          (3, {"event": "speculate", "run": "r", "start": 4, "stop": 6}),
          (4, {"event": "check", "run": "r", "shard": 1, "match": True}),
          (5, {"event": "quarantine", "run": "r", "shards": [0]}),
          (6, {"event": "accepted", "run": "old", "start": 2, "stop": 3})]
    start, states = shard_states(ev, running=[(2, 4)])
    assert start["run"] == "r"
    assert [STATE_NAMES[s] for s in states] == ["quarantined", "verified", "running", "running", "re-run", "re-run"]
    # A block rescued from a worker that went silent shows as re-run too; an opened group changes nothing.
    _, states = shard_states(ev[:3] + [(3, {"event": "rescue", "run": "r", "start": 2, "stop": 4}),
                                       (4, {"event": "group-opened", "run": "r", "start": 0, "stop": 4})])
    assert [STATE_NAMES[s] for s in states] == ["accepted", "accepted", "re-run", "re-run", "queued", "queued"]


def test_many_shards_are_grouped_into_cells(dashboard_cluster):
    cl, c = dashboard_cluster
    c.log_event("research.montecarlo", {"event": "start", "run": "big", "shards": 100_000, "key_prefix": "x"})
    c.log_event("research.montecarlo", {"event": "accepted", "run": "big", "start": 0, "stop": 50_000})
    board = ShardBoard(cl.scheduler)
    board.update()
    assert len(board.source.data["x"]) <= 4096
    assert board.source.data["state"][0] == "accepted" and board.source.data["state"][-1] == "queued"
    assert "100,000 shards" in board.summary.text


def _fails_on_workers(a):
    """Fine in the client (the pilot), raises on every worker: a run that fails."""
    from distributed import get_worker

    try:
        get_worker()
    except ValueError:
        return np.sin(a)
    raise RuntimeError("solver diverged")


def test_a_failed_run_is_shown_as_failed_with_its_reason(dashboard_cluster):
    from dask_research.exceptions import PipelineError

    cl, c = dashboard_cluster
    job = mc.Job(_fails_on_workers, {"a": mc.Normal(0, 1)}, shards=64, samples_per_shard=256, seed=4, bins=16)
    with pytest.raises(PipelineError, match="solver diverged"):
        mc.run(job, client=c, verify=0, progress=False, shards_per_task=1)
    board = ShardBoard(cl.scheduler)
    board.update()
    text = board.summary.text
    assert job.id[:12] in text and "(failed: pipeline output of shard " in text and "solver diverged" in text
    assert "running" not in text


def test_a_run_whose_client_left_the_scheduler_is_shown_as_stale(dashboard_cluster):
    cl, c = dashboard_cluster
    other = Client(cl.scheduler_address, set_as_default=False)
    try:
        gone = other.id
        other.log_event("research.montecarlo", {"event": "start", "run": "ab" * 32, "shards": 640,
                                                "key_prefix": "x-y", "client": gone, "name": "orphan"})
        other.log_event("research.montecarlo", {"event": "accepted", "run": "ab" * 32, "start": 0, "stop": 8})
        board = ShardBoard(cl.scheduler)
        board.update()
        assert "(running)" in board.summary.text      # its client is still connected
    finally:
        other.close()
    wait_for(lambda: gone not in cl.scheduler.clients, 30, "the scheduler to drop the client")
    board.update()
    assert f"(stale: its client {gone} has left the scheduler)" in board.summary.text
    assert "632 queued" in board.summary.text


def test_run_status_from_events():
    start = {"run": "r", "client": "c1"}
    assert run_status(start, [{"event": "accepted"}, {"event": "done"}], clients=set()) == "done"
    assert run_status(start, [{"event": "failed", "reason": "lost the scheduler"}]) == "failed: lost the scheduler"
    assert run_status(start, [], clients={"c1"}) == "running"
    assert run_status(start, [], clients={"c2"}).startswith("stale")
    assert run_status({"run": "r"}, [], clients=set()) == "running"   # a run from before client ids


def test_shard_states_read_envelopes_batches_and_the_older_shape_alike():
    from dask_research.events import batch, envelope

    old = [(0.0, {"event": "start", "run": "r", "shards": 4, "key_prefix": "ab-cd"}),
           (1.0, {"event": "accepted", "run": "r", "start": 0, "stop": 2}),
           (2.0, {"event": "check", "run": "r", "shard": 0, "match": True})]
    new = [(0.0, envelope("montecarlo", "start", "r", shards=4, key_prefix="ab-cd")),
           (1.0, batch("montecarlo", "r", [envelope("montecarlo", "accepted", "r", start=0, stop=2),
                                           envelope("montecarlo", "check", "r", shard=0, match=True)]))]
    for log in (old, new):
        start, states = shard_states(log, running=[(2, 3)])
        assert start["key_prefix"] == "ab-cd"
        assert [STATE_NAMES[s] for s in states] == ["verified", "accepted", "running", "queued"]


@pytest.mark.parametrize("bad", ["abc", -5, 1e15, True, None])
def test_a_malformed_start_event_is_skipped_with_one_warning_and_the_page_still_answers(dashboard_cluster, caplog, bad):
    """A start event with shards "abc", -5 or 1e15 made the Shards page answer HTTP 500 for everyone."""
    import logging
    import urllib.request

    cl, c = dashboard_cluster
    c.log_event("research.montecarlo", {"event": "start", "run": "good", "shards": 8, "key_prefix": "g"})
    c.log_event("research.montecarlo", {"event": "start", "run": "bad", "shards": bad, "key_prefix": "b"})
    c.log_event("research.montecarlo", {"event": "accepted", "run": "good", "start": 0, "stop": "x"})
    c.log_event("research.montecarlo", {"event": "accepted", "run": "good", "start": 0, "stop": 4})
    wait_for(lambda: len(cl.scheduler.get_events("research.montecarlo")) >= 4, 60, "the events logged")
    with caplog.at_level(logging.WARNING, logger="dask_research.dashboard.folds"):
        board = ShardBoard(cl.scheduler)
        board.update()
        board.update()
    skipped = [r for r in caplog.records if "skipped an event" in r.getMessage()]
    assert len(skipped) == 2, [r.getMessage() for r in skipped]          # each bad event once
    assert board.source.data["state"] == ["accepted"] * 4 + ["queued"] * 4
    url = cl.dashboard_link.replace("/status", "/individual-research-shards")
    with urllib.request.urlopen(url, timeout=60) as page:
        assert page.status == 200


def test_the_page_costs_cells_and_new_events_not_shards(dashboard_cluster, monkeypatch):
    """A 10^12-shard run is 4,096 cells of aggregates (it was a per-shard array: 1.5 s per update at
    10^7 shards); an update folds in only the events logged since the last one."""
    from dask_research.dashboard import shard_cells

    cl, c = dashboard_cluster
    n = 10**12
    c.log_event("research.montecarlo", {"event": "start", "run": "huge", "shards": n, "key_prefix": "h"})
    c.log_event("research.montecarlo", {"event": "accepted", "run": "huge", "start": 0, "stop": n // 2})
    c.log_event("research.montecarlo", {"event": "check", "run": "huge", "shard": 0, "match": False})
    wait_for(lambda: len(cl.scheduler.get_events("research.montecarlo")) >= 3, 60, "the events logged")
    applied = []
    real = shard_cells.ShardCells.apply
    monkeypatch.setattr(shard_cells.ShardCells, "apply", lambda self, msg: (applied.append(msg), real(self, msg)))
    board = ShardBoard(cl.scheduler)
    board.update()
    cells = board.cells
    assert cells is not None and cells.cells <= shard_cells.MAX_CELLS
    assert all(a.size <= shard_cells.MAX_CELLS for a in (cells.accepted, cells.verified, cells.rerun, cells.size))
    states = board.source.data["state"]
    assert states[:2] == ["quarantined", "accepted"] and states[-1] == "queued" and len(states) == cells.cells
    assert f"{n:,} shards, {n // 2:,} queued, {n // 2 - 1:,} accepted, 1 quarantined" in board.summary.text
    assert len(applied) == 2
    board.update()
    assert len(applied) == 2                       # nothing new: nothing folded in again
    c.log_event("research.montecarlo", {"event": "accepted", "run": "huge", "start": n // 2, "stop": n // 2 + 10})
    wait_for(lambda: len(cl.scheduler.get_events("research.montecarlo")) >= 4, 60, "the events logged")
    board.update()
    assert len(applied) == 3


def test_the_estimate_is_labelled_a_95_ci_and_is_no_longer_running_when_done(dashboard_cluster):
    cl, c = dashboard_cluster
    for msg in ({"event": "start", "run": "r2", "shards": 4, "key_prefix": "q"},
                {"event": "accepted", "run": "r2", "start": 0, "stop": 4, "mean": 1.5, "stderr": 0.1, "n": 400}):
        c.log_event("research.montecarlo", msg)
    wait_for(lambda: len(cl.scheduler.get_events("research.montecarlo")) >= 2, 60, "the events logged")
    board = ShardBoard(cl.scheduler)
    board.update()
    assert "running estimate 1.5 &plusmn; 0.196 (95 % CI of the mean; stderr 0.1; n=400)" in board.summary.text
    c.log_event("research.montecarlo", {"event": "done", "run": "r2"})
    wait_for(lambda: len(cl.scheduler.get_events("research.montecarlo")) >= 3, 60, "the events logged")
    board.update()
    assert "(done)" in board.summary.text and "running estimate" not in board.summary.text
    assert "estimate 1.5 &plusmn; 0.196 (95 % CI" in board.summary.text


def test_the_preload_without_bokeh_says_so_in_the_scheduler_log(monkeypatch, caplog):
    """``--preload dask_research.dashboard`` without bokeh: the pages 404ed with no word in the log."""
    import logging
    import sys

    import dask_research.dashboard as dash

    monkeypatch.setitem(sys.modules, "bokeh", None)         # import bokeh raises ImportError

    class _Scheduler:
        handlers: dict = {}

        def set_metadata(self, keys, value):
            pass

    with caplog.at_level(logging.WARNING, logger="dask_research.dashboard"):
        dash.dask_setup(_Scheduler())
    lines = [r.getMessage() for r in caplog.records if "bokeh is not installed" in r.getMessage()]
    assert len(lines) == 1 and "pip install 'dask-research[dashboard]'" in lines[0]
