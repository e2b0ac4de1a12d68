"""Issue 27: a run's settings are one object, built once from mc.run's keywords and dask.config,
checked once before anything runs, passed whole to the engine and recorded in result.json."""
from __future__ import annotations

import ast
import inspect
import json
import pathlib

import dask
import numpy as np
import pytest
import yaml
from distributed import Client, LocalCluster

import dask_research
from dask_research import montecarlo as mc
from dask_research.exceptions import ConfigError, InputError, StoreError
from dask_research.montecarlo.run_settings import KEYWORDS, ROWS, RunSettings

PACKAGE = pathlib.Path(dask_research.__file__).parent
CALLS: list[int] = []      # shards the pipeline was asked for, in this process


def counted(a, b):
    CALLS.append(len(a))
    return np.tanh(a * b)


def _job(shards=16, seed=5, pipeline=counted):
    return mc.Job(pipeline, {"a": mc.Normal(1.0, 0.1), "b": mc.Normal(2.0, 0.2)}, shards=shards,
                  samples_per_shard=256, seed=seed, bins=16, range=(0.0, 1.0))


@pytest.fixture
def two_workers(loop):
    with LocalCluster(loop=loop, n_workers=2, threads_per_worker=1, processes=False,
                      dashboard_address=None) as cl, Client(cl, set_as_default=False) as c:
        yield c


def test_every_setting_is_a_row_with_its_config_key_in_research_yaml_and_the_schema():
    defaults = yaml.safe_load((PACKAGE / "research.yaml").read_text())["research"]["montecarlo"]
    schema = yaml.safe_load((PACKAGE / "research-schema.yaml").read_text())
    declared = schema["properties"]["research"]["properties"]["montecarlo"]["properties"]
    keys = {row.key for row in ROWS.values() if row.key is not None}
    assert keys <= set(defaults) and keys <= set(declared)
    # Every research.montecarlo.* key is a run setting, but those of a Job and of the event log.
    assert set(defaults) - keys == {"shards", "samples-per-shard", "bins", "range-margin", "event-topic"}
    assert KEYWORDS == ("verify", "shards_per_task", "progress", "check_merger", "speculate", "window")


def test_mc_run_shows_every_keyword_setting_in_its_signature_and_docstring():
    params = inspect.signature(mc.run).parameters
    assert list(params)[:4] == ["job", "client", "store", "pilot"]
    assert all(params[k].kind is inspect.Parameter.KEYWORD_ONLY and params[k].default is None for k in KEYWORDS)
    assert all(f"\n    {k} : " in mc.run.__doc__ for k in KEYWORDS) and "{settings}" not in mc.run.__doc__


@pytest.mark.parametrize("name, value, expected", [
    ("verify", -1, "a non-negative number of shards"),
    ("verify", "3", "a non-negative number of shards"),
    ("shards_per_task", 3, "a power of two"),
    ("window", 0, "a positive number of blocks"),
    ("speculate", -0.5, "a number >= 0"),
    ("nope", 1, "one of mc.run's keywords"),
])
def test_a_bad_keyword_is_an_input_error_naming_it_before_anything_runs(name, value, expected):
    CALLS.clear()
    job = _job()
    with pytest.raises(InputError, match=rf"^run: {name}={value!r} is invalid; expected {expected}") as info:
        mc.run(job, progress=False, **{name: value})
    assert "\n" not in str(info.value) and CALLS == []          # no pilot, no cluster: refused first


@pytest.mark.parametrize("key, value, expected", [
    ("pipeline-attempts", 0, "a positive number of workers"),
    ("store-writes", "sometimes", '"auto" .* or "client"'),
    ("block-timeout", True, '"auto", a positive duration'),          # the schema's type check, in the row's words
    ("check-timeout", "soon", '"auto", a positive duration'),
    ("timeout-factor", 0, "a positive number"),
    ("verify-reused", "some", 'null \\(as many as verify\\), "all"'),
    ("lease-wait", -1, "a number of seconds >= 0"),
    ("group-blocks", 2.5, "a positive number of blocks"),
])
def test_a_bad_config_value_is_a_config_error_naming_its_key_before_anything_runs(key, value, expected):
    CALLS.clear()
    with dask.config.set({f"research.montecarlo.{key}": value}):
        with pytest.raises(ConfigError, match=rf"^config research\.montecarlo\.{key}=.* is invalid; expected {expected}"):
            mc.run(_job(), progress=False, verify=0)
    assert CALLS == []


def test_a_keyword_wins_over_the_config_and_none_reads_it():
    with dask.config.set({"research.montecarlo.verify": 7, "research.montecarlo.window": 24}):
        s = RunSettings.parse(verify=2)
    assert (s.verify, s.window, s.for_cluster(threads=64).window) == (2, 24, 24)
    assert RunSettings.parse().for_cluster(threads=4).window == 32 and RunSettings.parse().window is None
    with pytest.raises(InputError, match="run: verfy=1 is invalid; expected one of the run's settings"):
        RunSettings.parse(verfy=1)


def test_result_json_records_the_settings_the_run_used(tmp_path, two_workers):
    store = tmp_path / "store"
    with dask.config.set({"research.montecarlo.block-timeout": "90s"}):
        res = mc.run(_job(seed=6), client=two_workers, store=str(store), verify=1, shards_per_task=4, progress=False)
    doc = json.loads((store / "runs" / res.run_id / "result.json").read_text())
    assert doc["settings"] == res.settings.record() and RunSettings.from_record(doc["settings"]) == res.settings
    s = res.settings
    assert (s.verify, s.shards_per_task, s.block_timeout, s.window) == (1, 4, 90.0, 16)   # 2 threads: 16
    assert mc.show(res.run_id, str(store))["result"]["settings"] == doc["settings"]
    # A settings entry that is no setting's value is refused like any other edit of result.json.
    doc["settings"]["verify"] = {"nested": [1, 2]}
    (store / "runs" / res.run_id / "result.json").write_text(json.dumps(doc))
    with pytest.raises(StoreError, match=r"result\.json: settings\.verify is .*; expected a number"):
        mc.show(res.run_id, str(store))


def test_a_worker_process_reads_the_runs_lease_once_per_run_not_once_per_block(tmp_path, two_workers, monkeypatch):
    reads = []
    holder = mc.RunStore.lease_holder

    def counting(self, run_id):
        reads.append(run_id)
        return holder(self, run_id)

    monkeypatch.setattr(mc.RunStore, "lease_holder", counting)
    job = _job(seed=7)
    res = mc.run(job, client=two_workers, store=str(tmp_path / "s"), verify=0, shards_per_task=1, progress=False)
    rec = mc.RunStore(str(tmp_path / "s")).read_result(job.id)["store_writes"]
    assert rec["mode"] == "workers" and rec["blocks_by_workers"] == 16 and res.computed_shards == 16
    assert reads == [job.id]                 # one worker process (in-process workers), one run: one read
    other = _job(seed=8)
    mc.run(other, client=two_workers, store=str(tmp_path / "s"), verify=0, shards_per_task=1, progress=False)
    assert reads == [job.id, other.id]       # another run (another token) is checked again


GATE: dict = {}      # "path": the gate file; "passed": calls let through since it was armed


def gated(a, b):
    """Once armed, the first four calls pass; the others wait for the gate file (at most 120 s)."""
    import os
    import time

    if GATE:
        GATE["passed"] += 1
        if GATE["passed"] > 4:
            t0 = time.monotonic()
            while not os.path.exists(GATE["path"]) and time.monotonic() - t0 < 120:
                time.sleep(0.01)
    return np.tanh(a * b)


@pytest.mark.timeout(300, method="thread")
def test_a_run_whose_lease_is_taken_over_stops_although_its_workers_checked_the_lease_once(tmp_path, two_workers,
                                                                                          monkeypatch):
    """The workers saw the run's lease token once and go on writing; the client notices the
    takeover (its heartbeat) and stops at the next block a worker wrote, not at the end."""
    import threading

    from dask_research.montecarlo.store import HeldRun
    from dask_research.testing.processes import wait_for

    from .store_helpers import BOUND, steal_lease

    held: list[HeldRun] = []
    enter = HeldRun.__enter__
    monkeypatch.setattr(HeldRun, "__enter__", lambda self: held.append(self) or enter(self))
    job = _job(shards=32, seed=9, pipeline=gated)
    pilot = mc.pilot(job)                    # before the gate is armed: the pilot runs the pipeline too
    store = tmp_path / "store"
    shards = store / "runs" / job.id / "shards"
    outcome: list[BaseException | None] = []

    def run():
        try:
            mc.run(job, client=two_workers, store=str(store), verify=0, shards_per_task=1, window=2,
                   progress=False, pilot=pilot)
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 - the test reads it
            outcome.append(e)

    gate = tmp_path / "gate"
    monkeypatch.setitem(GATE, "path", str(gate))
    monkeypatch.setitem(GATE, "passed", 0)
    with dask.config.set({"research.montecarlo.lease-timeout": 2.0}):
        t = threading.Thread(target=run, daemon=True)
        t.start()
        try:
            wait_for(lambda: len(list(shards.glob("*.json"))) >= 4 if shards.exists() else False, BOUND,
                     "the first four shard files, written by the workers")
            steal_lease(store / "runs" / job.id / "lease.json", owner="bob")
            wait_for(lambda: held and not held[0].lease.held, BOUND, "the run's heartbeat to notice the takeover")
        finally:
            gate.touch()
        t.join(BOUND)
    assert outcome and isinstance(outcome[0], StoreError), outcome
    assert "this writer lost the lease of run" in str(outcome[0]) and "held now by bob" in str(outcome[0])
    written = len(list(shards.glob("*.json")))
    assert written < 16, written             # it stopped: the rest of the run was not computed and written
    assert not (store / "runs" / job.id / "result.json").exists()
    assert json.loads((store / "runs" / job.id / "lease.json").read_text())["token"] == "thief"


def test_the_engine_and_its_parts_never_read_dask_config():
    engine_modules = ["engine", "acceptance", "block_watch", "submission", "verification", "timing", "checks",
                      "stragglers", "arrivals", "blocks", "outcome", "store/held_run", "store/worker_writes"]
    for name in engine_modules:
        tree = ast.parse((PACKAGE / "montecarlo" / f"{name}.py").read_text())
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                    for alias in node.names if node.module in (None, "..", "...") or node.level}
        assert "config" not in imported, name
        assert not any(isinstance(node, ast.Attribute) and node.attr == "resolve" and
                       isinstance(node.value, ast.Name) and node.value.id == "config" for node in ast.walk(tree)), name


def test_the_client_is_a_keyword_and_the_old_positional_form_warns():
    import inspect

    from distributed import Client, LocalCluster

    sig = inspect.signature(mc.run)
    assert sig.parameters["client"].kind is inspect.Parameter.KEYWORD_ONLY
    job = mc.Job(lambda a: a, {"a": mc.Normal(0.0, 1.0)}, shards=2, samples_per_shard=256, seed=1)
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cl, \
            Client(cl, set_as_default=False) as client:
        with pytest.warns(DeprecationWarning, match=r"mc.run\(job, client=client\)"):
            old = mc.run(job, client, progress=False, verify=0)
        assert old.mean == mc.run(job, client=client, progress=False, verify=0).mean
