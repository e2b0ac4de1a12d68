"""Audit: events from a hostile or buggy producer never fail a research page nor inject markup.

Any client of the scheduler can log any event on the research topics. A page that raised on
one (the Branches page on a branch that was not a string, a score map that was not a map, an
unhashable hypothesis; the Experience page on an int past float's range; the Shards page on an
infinite ``n`` or a client id that was a map) answered HTTP 500 for everyone from then on.
"""
import logging
import urllib.request

import pytest

pytest.importorskip("bokeh")

from dask_research.dashboard.components import (  # noqa: E402
    BranchBoard,
    ExperiencePanel,
    ShardBoard,
    run_status,
)
from dask_research.testing.processes import wait_for  # noqa: E402

JUNK = [None, -1, 1e15, 10**400, float("nan"), float("inf"), "<script>alert(1)</script>",
        '"><img src=x onerror=alert(1)>', "x" * 100_000, [1, [2]], {"a": {"b": 1}}, True, "__missing__"]

BRANCH_RUN = [{"event": "add", "run": "r"},
              {"event": "select", "run": "r", "t": 0.1, "scores": {"a": 1.0}},
              {"event": "dispatch", "run": "r", "t": 0.1, "branch": "a", "hypothesis": "a0", "slot": 0},
              {"event": "result", "run": "r", "t": 0.3, "branch": "a", "hypothesis": "a0", "mean": 0.5},
              {"event": "prune", "run": "r", "branch": "a"},
              {"event": "paper.trigger", "run": "r", "branch": "a"},
              {"event": "stop", "run": "r", "reason": "done"}]

STATS = {"event": "stats", "plane": "p", "t": 12.0, "size": 9, "capacity": 9, "inserted": 100, "sampled": 400,
         "tiers": [{"name": "host", "used": 9, "rows": 9}], "exposed_mean_s": 0.001, "step_mean_s": 0.01}


class _Scheduler:
    """A scheduler's event log and nothing else (entries made once: the pages find them by identity)."""

    clients: dict = {}

    def __init__(self, events):
        self.log = tuple((float(i), e) for i, e in enumerate(events))

    def get_events(self, topic):
        return self.log


def _spoil(events, index, field, value):
    out = [dict(e) for e in events]
    if value == "__missing__":
        out[index].pop(field, None)
    else:
        out[index][field] = value
    return out


def _no_markup(text):
    assert "<script" not in text and "<img" not in text, text[:300]


def _cases(events):
    return [(i, f, v) for i, e in enumerate(events) for f in e if f not in ("event", "run") for v in JUNK]


@pytest.mark.parametrize("index,field,value", _cases(BRANCH_RUN),
                         ids=lambda x: repr(x)[:20])
def test_the_branches_page_reads_any_event(index, field, value):
    board = BranchBoard(_Scheduler(_spoil(BRANCH_RUN, index, field, value)))
    board.update()
    board.update()
    _no_markup(board.summary.text)
    assert all(isinstance(n, str) for n in board.branch_range.factors)


@pytest.mark.parametrize("field,value", [(f, v) for f in list(STATS) + ["tiers"] if f != "event" for v in JUNK]
                         + [("tiers", [{"name": 5, "rows": 1, "used": 1}]),
                            ("tiers", [{"name": "a", "rows": 1, "used": 1}] * 2),
                            ("tiers", [{"name": "a", "rows": 10**400, "used": 1}]),
                            ("tiers", [{"name": "<script>", "rows": 1.5, "used": 1}])],
                         ids=lambda x: repr(x)[:20])
def test_the_experience_page_reads_any_event(field, value):
    spoiled = _spoil([dict(STATS, t=11.0), STATS], 1, field, value)
    panel = ExperiencePanel(_Scheduler(spoiled))
    panel.update()
    panel.update()
    _no_markup(panel.summary.text)
    factors = panel.tier_range.factors
    assert all(isinstance(n, str) for n in factors) and len(set(factors)) == len(factors)


@pytest.mark.parametrize("field,value", [(f, v) for f in ("mean", "stderr", "n") for v in JUNK])
def test_the_shards_estimate_reads_any_accepted_event(field, value):
    events = [{"event": "start", "run": "r", "shards": 4, "key_prefix": "p", "name": "<script>x</script>"},
              {"event": "accepted", "run": "r", "start": 0, "stop": 2, "mean": 0.5, "stderr": 0.1, "n": 10},
              {"event": "done", "run": "r"}]
    board = ShardBoard(_Scheduler(_spoil(events, 1, field, value)))
    board.update()
    board.update()
    _no_markup(board.summary.text)
    assert board.source.data["state"] == ["accepted"] * 2 + ["queued"] * 2


@pytest.mark.parametrize("client", [{"a": 1}, [1, 2], "x" * 100_000])
def test_a_run_whose_client_id_is_junk_is_stale_not_an_error(client):
    status = run_status({"run": "r", "client": client}, [], clients={"c1"})
    assert status.startswith("stale:") and len(status) < 400


def test_a_bad_event_warns_once_however_many_updates(caplog):
    """The Experience page re-read the whole log every second: one warning per bad event per update."""
    events = [dict(STATS, t=11.0), dict(STATS, size="nine"), STATS]
    branch = [BRANCH_RUN[0], dict(BRANCH_RUN[2], branch=["x"]), *BRANCH_RUN[2:]]
    with caplog.at_level(logging.WARNING, logger="dask_research.dashboard.folds"):
        pages = [ExperiencePanel(_Scheduler(events)), BranchBoard(_Scheduler(branch))]
        for _ in range(3):
            for page in pages:
                page.update()
    skipped = [r.getMessage() for r in caplog.records if "skipped an event" in r.getMessage()]
    assert len(skipped) == 2, skipped
    assert pages[1].source.data["branch"] == ["a"]


def test_every_page_answers_after_hostile_events_over_a_real_comm(dashboard_cluster):
    """Through a real scheduler (what msgpack lets through: lists become tuples, maps stay maps)."""
    cl, c = dashboard_cluster
    hostile = {
        "research.experiments": [
            {"event": "add", "run": "<script>r</script>"},
            {"event": "dispatch", "run": "<script>r</script>", "t": 0.1, "branch": ["a"], "hypothesis": "h"},
            {"event": "dispatch", "run": "<script>r</script>", "t": 0.1, "branch": "b", "hypothesis": {"h": 1}},
            {"event": "select", "run": "<script>r</script>", "t": 0.1, "scores": "<img src=x onerror=alert(1)>"},
            {"event": "prune", "run": "<script>r</script>"},
            {"event": "dispatch", "run": "<script>r</script>", "t": 0.2, "branch": "ok", "hypothesis": "h2"},
            {"event": "stop", "run": "<script>r</script>", "reason": '"><img src=x onerror=alert(1)>'}],
        "research.replay": [
            dict(STATS, t=1.0), dict(STATS, t=2.0, tiers=[{"name": 3, "rows": 1, "used": 1}]),
            dict(STATS, t=3.0, plane="<script>p</script>")],
        "research.montecarlo": [
            {"event": "start", "run": "r", "shards": 4, "key_prefix": "p", "client": {"a": 1},
             "name": '"><img src=x onerror=alert(1)>'},
            {"event": "accepted", "run": "r", "start": 0, "stop": 2, "mean": 0.5, "stderr": 0.1, "n": float("inf")}],
    }
    for topic, events in hostile.items():
        for e in events:
            c.log_event(topic, e)
    for topic, events in hostile.items():
        wait_for(lambda t=topic, n=len(events): len(cl.scheduler.get_events(t)) >= n, 60, f"{topic} logged")
    for page in (BranchBoard, ExperiencePanel, ShardBoard):
        board = page(cl.scheduler)
        board.update()
        board.update()
        _no_markup(board.summary.text)
    for route in ("branches", "experience", "shards"):
        url = cl.dashboard_link.replace("/status", f"/individual-research-{route}")
        with urllib.request.urlopen(url, timeout=60) as page:
            assert page.status == 200


@pytest.mark.parametrize("inner", [5, 1e15, True, "ab", {"a": 1}, None, ({"event": "add", "run": "r"},)])
def test_a_batch_whose_events_is_not_a_list_is_skipped_by_every_reader(inner):
    """``unpack`` iterated a batch's ``events`` whatever it was: a batch with ``events: 5`` (any
    client can log one) raised TypeError in every page and reader of the topic."""
    from dask_research.events import unpack

    log = [(1.0, {"event": "batch", "run": "r", "events": inner}), (2.0, {"event": "add", "run": "r"})]
    got = [(t, m["event"]) for t, m in unpack(log)]
    assert got == ([(1.0, "add")] if isinstance(inner, tuple) else []) + [(2.0, "add")]
    board = BranchBoard(_Scheduler([m for _, m in log]))
    board.update()
    assert "run <code>r</code>" in board.summary.text
