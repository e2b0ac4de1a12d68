"""Audit: a page opened late shows the whole run, from a plugin that folds events as they are logged.

The pages folded the scheduler's event log themselves, which keeps the last
``distributed.admin.low-level-log-length`` entries per topic (1,000 by default): a page opened
after a run's first event had left the log showed nothing of that run, and its first update
read the whole log (2.9 s of the scheduler's event loop at 300,000 batched events). The research
plugin (installed by the ``dask_research.dashboard`` preload, or at the first page opened)
folds every event as the scheduler logs it, and the pages read its folds.
"""
import logging
import urllib.request

import dask
import pytest
from distributed import Client, LocalCluster

pytest.importorskip("bokeh")

from dask_research.dashboard.components import BranchBoard, ExperiencePanel, ShardBoard  # noqa: E402
from dask_research.testing.processes import wait_for  # noqa: E402

KEEP = 50          # entries the scheduler's log keeps per topic here
MC, EXP = "research.montecarlo", "research.experiments"
FOLDS = "dask_research.dashboard.folds"


def _cluster(loop, preload):
    kwargs = {"scheduler_kwargs": {"preload": ["dask_research.dashboard"]}} if preload else {}
    return LocalCluster(loop=loop, n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0",
                        **kwargs)


@pytest.fixture
def preloaded(loop):
    """A cluster whose scheduler keeps :data:`KEEP` entries per topic and preloads the pages."""
    import dask_research.dashboard  # noqa: F401

    with dask.config.set({"distributed.admin.low-level-log-length": KEEP}), _cluster(loop, True) as cl, \
            Client(cl, set_as_default=False) as c:
        yield cl, c


@pytest.fixture
def imported(loop):
    """The same with the pages registered by import alone (no preload): a cluster of one's own."""
    import dask_research.dashboard  # noqa: F401

    with dask.config.set({"distributed.admin.low-level-log-length": KEEP}), _cluster(loop, False) as cl, \
            Client(cl, set_as_default=False) as c:
        yield cl, c


def _logged(cl, topic, event):
    """Wait until ``event`` is the newest entry of ``topic`` (the plugin folds it in the same call)."""
    wait_for(lambda: (log := cl.scheduler.get_events(topic)) and log[-1][1] == event, 60, f"{event} logged")


def _on_loop(c, fn):
    """``fn()`` on the scheduler's event loop, where the pages update (after any event being logged)."""
    async def call():
        return fn()

    return c.sync(call)


def _open(cl, route):
    url = cl.dashboard_link.replace("/status", f"/individual-research-{route}")
    with urllib.request.urlopen(url, timeout=60) as page:
        return page.status


def _long_mc_run(c, cl, n_accepted, bad=()):
    """A run of 1,000 shards: its start, ``bad`` events, then ``n_accepted`` one-shard blocks."""
    c.log_event(MC, {"event": "start", "run": "long", "shards": 1000, "key_prefix": "p", "name": "long-job",
                     "client": c.id})
    for msg in bad:
        c.log_event(MC, msg)
    for i in range(n_accepted):
        c.log_event(MC, {"event": "accepted", "run": "long", "start": i, "stop": i + 1, "mean": 0.5,
                         "stderr": 0.01, "n": 100 * (i + 1)})
    last = {"event": "accepted", "run": "long", "start": n_accepted - 1, "stop": n_accepted, "mean": 0.5,
            "stderr": 0.01, "n": 100 * n_accepted}
    _logged(cl, MC, last)
    return last


def _long_branch_run(c, cl, n_results, bad=()):
    """An experiments run in batches: ``add``, dispatches and results of branches a and b."""
    c.log_event(EXP, {"event": "add", "run": "x"})
    c.log_event(EXP, {"event": "batch", "run": "x", "events": list(bad)})
    for i in range(n_results):
        b = "ab"[i % 2]
        c.log_event(EXP, {"event": "batch", "run": "x", "events": [
            {"event": "dispatch", "run": "x", "t": i, "branch": b, "hypothesis": f"h{i}", "slot": 0},
            {"event": "result", "run": "x", "t": i + 0.5, "branch": b, "hypothesis": f"h{i}", "mean": 1.0}]})
    last = {"event": "prune", "run": "x", "branch": "b"}
    c.log_event(EXP, last)
    _logged(cl, EXP, last)


@pytest.mark.timeout(180, method="thread")
def test_a_page_opened_after_the_run_left_the_log_shows_all_of_it(preloaded):
    cl, c = preloaded
    n = 4 * KEEP
    _long_mc_run(c, cl, n)
    _long_branch_run(c, cl, 2 * KEEP)
    log = cl.scheduler.get_events(MC)
    assert len(log) == KEEP and all(m.get("event") != "start" for _, m in log)   # the start is gone
    board = _on_loop(c, lambda: ShardBoard(cl.scheduler))
    _on_loop(c, board.update)
    assert board.start is not None and board.start["run"] == "long"
    assert f"1,000 shards, {1000 - n:,} queued, {n:,} accepted" in board.summary.text, board.summary.text
    assert f"n={100 * n:,}" in board.summary.text and "dropped" not in board.summary.text
    assert board.source.data["state"] == ["accepted"] * n + ["queued"] * (1000 - n)
    branches = _on_loop(c, lambda: BranchBoard(cl.scheduler))
    _on_loop(c, branches.update)
    assert branches.source.data["branch"] == ["a", "b"]
    assert branches.source.data["runs"] == [KEEP, KEEP] and branches.source.data["status"] == ["active", "pruned"]
    assert f"{2 * KEEP} results, 1 pruned" in branches.summary.text
    for route in ("shards", "branches", "experience"):
        assert _open(cl, route) == 200


@pytest.mark.timeout(180, method="thread")
def test_pages_registered_by_import_fold_every_event_from_the_first_page_opened(imported):
    """A ``LocalCluster`` of one's own (the pages registered by ``import dask_research.dashboard``):
    the first page opened installs the plugin; a page opened later shows what came since, all of it."""
    cl, c = imported
    assert _open(cl, "shards") == 200
    n = 3 * KEEP
    _long_mc_run(c, cl, n)
    board = _on_loop(c, lambda: ShardBoard(cl.scheduler))
    _on_loop(c, board.update)
    assert f"{n:,} accepted" in board.summary.text and "long-job" in board.summary.text, board.summary.text


@pytest.mark.timeout(180, method="thread")
def test_a_bad_event_is_skipped_with_one_warning_when_logged_and_the_page_renders(preloaded, caplog):
    cl, c = preloaded
    bad_mc = [{"event": "accepted", "run": "long", "start": 0, "stop": "x"},
              {"event": "check", "run": "long", "shard": 10**6, "match": True}]
    bad_exp = [{"event": "dispatch", "run": "x", "t": 0.1, "branch": ["a"], "hypothesis": "h"}]
    with caplog.at_level(logging.WARNING, logger=FOLDS):
        _long_mc_run(c, cl, 2 * KEEP, bad=bad_mc)
        _long_branch_run(c, cl, KEEP, bad=bad_exp)
        _on_loop(c, lambda: None)                      # the last events folded in
        at_log_time = [r.getMessage() for r in caplog.records if "skipped an event" in r.getMessage()]
        assert len(at_log_time) == 3, at_log_time    # each bad event once, as it was logged
        pages = _on_loop(c, lambda: [ShardBoard(cl.scheduler), BranchBoard(cl.scheduler)])
        for _ in range(3):
            for page in pages:
                _on_loop(c, page.update)
        for route in ("shards", "branches"):
            assert _open(cl, route) == 200
    skipped = [r.getMessage() for r in caplog.records if "skipped an event" in r.getMessage()]
    assert skipped == at_log_time                                  # and never again
    shards, branches = pages
    assert f"{2 * KEEP} accepted" in shards.summary.text and "running" in shards.summary.text
    assert branches.source.data["branch"] == ["a", "b"]


def test_the_plugin_holds_one_run_per_page_however_many_runs_come_and_go():
    from dask_research.dashboard.folds import PlaneFold, ShardFold
    from dask_research.dashboard.plugin import ResearchEventsPlugin

    plugin = ResearchEventsPlugin()
    for k in range(300):
        run = f"mc{k}"
        plugin.log_event(MC, {"event": "start", "run": run, "shards": 10**6, "key_prefix": run})
        plugin.log_event(MC, {"event": "accepted", "run": run, "start": 0, "stop": 10**5})
        for _ in range(3):
            plugin.log_event(MC, {"event": "done", "run": run})
        plugin.log_event(EXP, {"event": "batch", "run": f"x{k}", "events": [
            {"event": "add", "run": f"x{k}"},
            {"event": "dispatch", "run": f"x{k}", "t": 0.0, "branch": f"b{k}", "hypothesis": "h", "slot": 0}]})
        plugin.log_event("research.replay", {"event": "stats", "plane": f"p{k}", "t": float(k), "size": 1,
                                             "capacity": 1, "inserted": 1, "sampled": 1, "tiers": [],
                                             "exposed_mean_s": 0.0})
    for _ in range(100):
        plugin.log_event(MC, {"event": "failed", "run": "mc299", "reason": "again"})
    held = plugin.held()
    assert held["montecarlo"] == ["mc299"] and held["experiments"] == ["x299"]
    assert len(held["replay"]) == PlaneFold.MAX_PLANES and "p299" in held["replay"]
    shards, branches = plugin.folds["montecarlo"], plugin.folds["experiments"]
    assert len(shards.ends) == ShardFold.MAX_ENDS and shards.cells.cells <= 4096
    assert list(branches.branches) == ["b299"]
    plugin.log_event("another.topic", {"event": "start", "run": "z", "shards": 5})   # not ours: ignored
    assert plugin.held()["montecarlo"] == ["mc299"]


def test_without_the_plugin_a_page_reads_the_log_as_before(monkeypatch, caplog):
    """A Dask whose scheduler never calls ``SchedulerPlugin.log_event``: no plugin (said once), and
    the pages fold the log themselves."""
    from dask_research.dashboard import plugin as plugin_mod

    monkeypatch.setattr(plugin_mod, "scheduler_plugins_see_events", lambda: False)
    monkeypatch.setattr(plugin_mod, "_WARNED", [])

    class _Scheduler:
        clients: dict = {}
        plugins: dict = {}
        tasks: dict = {}

        def __init__(self):
            self.log = ((0.0, {"event": "start", "run": "r", "shards": 4, "key_prefix": "p"}),
                        (1.0, {"event": "accepted", "run": "r", "start": 0, "stop": 2}))

        def add_plugin(self, plugin, name=None, idempotent=False):
            self.plugins[name] = plugin

        def get_events(self, topic):
            return self.log if topic == MC else ()

    sched = _Scheduler()
    with caplog.at_level(logging.WARNING, logger="dask_research.dashboard.plugin"):
        assert plugin_mod.install(sched) is None
        assert plugin_mod.install(sched) is None          # each page opened asks again: said once
    assert sched.plugins == {} and len(caplog.records) == 1
    board = ShardBoard(sched)
    board.update()
    assert "2 queued, 2 accepted" in board.summary.text
    panel = ExperiencePanel(sched)
    panel.update()
    assert "No experience plane" in panel.summary.text
