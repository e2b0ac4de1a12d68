"""The store's one answer before a run (RunStore.holdings), the store's modules, and the job's margin."""
import os

import dask
import numpy as np
import pytest

from dask_research import montecarlo as mc
from dask_research.exceptions import InputError, StoreError
from dask_research.montecarlo.store import Holdings, RunStore, StoreFiles
from dask_research.montecarlo.store.holdings import stored_state_problem
from dask_research.montecarlo.store.layout import (
    classify_shard_name,
    is_run_id,
    shard_file_name,
    shard_file_range,
)
from dask_research.montecarlo.store.manifest import build_manifest, check_manifest
from dask_research.montecarlo.store.store_files import Exists
from dask_research.montecarlo.tree import tree_fold
from dask_research.testing.processes import wait_for

from .store_helpers import BOUND, steal_lease


def double(a):
    return 2 * a


def _job(**kw):
    return mc.Job(double, {"a": mc.Normal(0.0, 1.0)}, shards=4, samples_per_shard=128, seed=5, **kw)


# -- holdings ----------------------------------------------------------------------------------
def test_a_new_run_holds_nothing_and_its_manifest_is_written_once_asked(tmp_path):
    job, store = _job(), RunStore(str(tmp_path))
    p = mc.pilot(job)
    held = store.holdings(job, p)
    assert (held.status, held.missing, held.states, held.producers) == ("nothing", 4, {}, {})
    assert held.range == p.range and store.has_run(job.id)
    assert store.read_manifest(job.id)["job"] == job.describe()


def test_partial_and_complete_holdings_carry_the_states_and_their_producers(tmp_path):
    job, store = _job(range=(-9.0, 9.0)), RunStore(str(tmp_path))
    store.holdings(job, mc.pilot(job))
    store.write_shards(job.id, {0: mc.compute_shard(job, 0), 1: mc.compute_shard(job, 1)}, "tcp://w1")
    held = store.holdings(job)
    assert (held.status, sorted(held.states), held.producers) == ("partial", [0, 1], {0: "tcp://w1", 1: "tcp://w1"})
    assert held.states[1] == mc.compute_shard(job, 1) and held.range == (-9.0, 9.0)
    store.write_shards(job.id, {2: mc.compute_shard(job, 2), 3: mc.compute_shard(job, 3)}, "tcp://w2")
    assert store.holdings(job).status == "complete" and store.holdings(job).missing == 0


def test_a_reader_asks_only_a_run_that_has_a_manifest(tmp_path):
    job = _job()
    with pytest.raises(StoreError, match="manifest.json: does not exist"):
        RunStore(str(tmp_path)).holdings(job)


def test_shards_of_another_histogram_are_refused_naming_the_file(tmp_path):
    job, other = _job(range=(-9.0, 9.0)), _job(range=(-1.0, 1.0))
    store = RunStore(str(tmp_path))
    store.holdings(job, mc.pilot(job))
    store.write_shards(job.id, {0: mc.compute_shard(other, 0)}, "w")
    with pytest.raises(StoreError, match=r"000000000000-000000000001\.json: shard 0 has histogram"):
        store.holdings(job)


def test_no_store_holds_nothing():
    assert (Holdings(3).status, Holdings(3).missing, Holdings(3).range) == ("nothing", 3, None)


def test_stored_state_problem_names_what_is_wrong():
    job = _job(range=(-9.0, 9.0))
    template = job.make_reducer().init()
    assert stored_state_problem(job, 0, mc.compute_shard(job, 0), template) is None
    small = _job(range=(-9.0, 9.0)).replace(samples_per_shard=64)
    assert "counts 64 samples, not 128" in stored_state_problem(job, 0, mc.compute_shard(small, 0), template)
    assert "holds a dict for shard 0, not the run's accumulator" in stored_state_problem(job, 0, {"n": 1}, template)
    assert stored_state_problem(job, 0, {"n": 1}, None) is None     # nothing to compare with yet


# -- manifest ----------------------------------------------------------------------------------
def test_a_manifest_is_checked_against_the_job_and_the_engine():
    job = _job()
    manifest = build_manifest(job, mc.pilot(job))
    assert manifest["origin"]["qualname"] == "double" and manifest["engine"] == job.describe()["engine"]
    check_manifest(manifest, job, "m.json")
    with pytest.raises(StoreError, match="m.json: describes a different job"):
        check_manifest(manifest, job.replace(seed=6), "m.json")
    with pytest.raises(StoreError, match="m.json: was written by engine"):
        check_manifest({**manifest, "engine": {"numpy": "0"}}, job, "m.json")


# -- layout and files --------------------------------------------------------------------------
def test_layout_names():
    assert shard_file_name(8, 16) == "000000000008-000000000016.json"
    assert shard_file_range(shard_file_name(8, 16)) == (8, 16) and shard_file_range("8-16.json") is None
    assert classify_shard_name("8-16.json") == "bad" and classify_shard_name("notes.txt") == "foreign"
    assert is_run_id("0" * 64) and not is_run_id("0" * 63) and not is_run_id(None)


def _code_strings(tree):
    """The string constants of a module's code (docstrings left out: they describe the layout)."""
    import ast

    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.lineno, node.value


def test_the_stores_file_names_are_written_in_layout_only():
    """lease.json, manifest.json, result.json, shards/, quarantine/, runs/: spelled once, in layout.py."""
    import ast
    import pathlib
    import re

    import dask_research
    from dask_research.montecarlo.store import layout

    names = {layout.RUNS_DIR, layout.MANIFEST_FILE, layout.SHARDS_DIR, layout.QUARANTINE_DIR, layout.RESULT_FILE,
             layout.LEASE_FILE, layout.LEASE_LOCK_FILE, layout.REASON_SUFFIX}
    assert names == {"runs", "manifest.json", "shards", "quarantine", "result.json", "lease.json", "lease.lock",
                     ".reason.json"}
    files = {"manifest.json", "result.json", "lease.json", "lease.lock", ".reason.json"}
    path_like = re.compile(r"(^|/)(runs|shards|quarantine)/|(manifest|result|lease)\.json|lease\.lock|\.reason\.json")
    root = pathlib.Path(dask_research.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        if path == pathlib.Path(layout.__file__) or "durable" in path.parts:   # durable: the generic layer
            continue
        tree = ast.parse(path.read_text())
        for lineno, text in _code_strings(tree):
            if text in files or path_like.search(text):
                found.append(f"{path.relative_to(root)}:{lineno}: {text!r}")
        for node in ast.walk(tree):     # a directory named by a literal: files.path(run_id, "shards")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                    "path", "join", "run_dir"):
                found += [f"{path.relative_to(root)}:{a.lineno}: {a.value!r}" for a in node.args
                          if isinstance(a, ast.Constant) and a.value in ("runs", "shards", "quarantine")]
    assert found == []


def test_store_files_never_overwrite_unasked_and_refuse_links(tmp_path):
    files = StoreFiles(str(tmp_path / "s")).prepare()
    path = files.path("a" * 64, "result.json")
    files.write_json(path, {"v": 1})
    with pytest.raises(Exists):
        files.write_json(path, {"v": 2})
    files.write_json(path, {"v": 2}, overwrite=True)
    assert files.read_json(path) == {"v": 2}
    os.symlink(tmp_path, tmp_path / "s" / "runs" / ("b" * 64))
    with pytest.raises(StoreError, match="is a symbolic link; links inside it are refused, never followed"):
        files.write_json(files.path("b" * 64, "x.json"), {})
    with pytest.raises(StoreError, match="is a symbolic link; links inside it are refused"):
        files.refuse_links_under(files.run_dir("b" * 64))
    assert not (tmp_path / "x.json").exists()


def test_store_files_call_the_guard_before_each_write(tmp_path):
    seen = []
    files = StoreFiles(str(tmp_path), guard=seen.append)
    files.write_json(files.path("c" * 64, "a.json"), {})
    assert seen == [files.path("c" * 64, "a.json")]


def test_a_held_lease_guards_the_writes_into_its_run_only_while_held(tmp_path):
    """What a user sees: while a run's lease is held, a write into that run is refused once the
    lease is lost; other runs, and the same run after release, are written freely."""
    store = RunStore(str(tmp_path))
    rid, other = "d" * 64, "e" * 64
    state = {0: mc.Moments.from_samples(np.array([0.5]), (0.0, 1.0), 4)}
    with store.lease(rid, timeout=1.0) as lease:
        store.write_shards(rid, state, "w")
        lease_file = tmp_path / "runs" / rid / "lease.json"
        steal_lease(lease_file, owner="bob")
        wait_for(lambda: not lease.held, BOUND, "the holder to notice it lost its lease")
        with pytest.raises(StoreError, match="lost the lease of run dddddddddddd .*held now by bob"):
            store.write_result(rid, {"mean": 1.0})
        store.write_result(other, {"mean": 2.0})                 # another run: not this lease's
    lease_file.unlink()
    store.write_result(rid, {"mean": 3.0})                       # released: no lease, no guard
    assert store.read_result(rid)["mean"] == 3.0 and store.read_result(other)["mean"] == 2.0


# -- the job's margin --------------------------------------------------------------------------
def test_the_margin_is_read_once_when_the_job_is_built():
    job = _job()
    before = job.id
    with dask.config.set({"research.montecarlo.range-margin": 0.5}):
        assert mc.Job(double, job.inputs, shards=4, samples_per_shard=128, seed=5).range_margin == 0.5
        fresh = _job(range_margin=0.25)
        assert job.describe()["accumulate"]["range"]["margin"] == 0.25 and job.replace(seed=5).id == before
        assert fresh.id == before                       # the same job and margin: the same id
    assert _job(range_margin=0.5).id != before
    assert _job(range=(-9.0, 9.0), range_margin=0.5).id == _job(range=(-9.0, 9.0)).id   # margin unused


def test_the_pilot_widens_by_the_jobs_margin():
    narrow, wide = mc.pilot(_job(range_margin=0.0)), mc.pilot(_job(range_margin=1.0))
    assert wide.range[0] < narrow.range[0] and wide.range[1] > narrow.range[1]


@pytest.mark.parametrize("margin", [-0.1, float("nan"), float("inf"), "wide", True])
def test_a_margin_that_is_not_a_fraction_is_refused(margin):
    with pytest.raises(InputError, match="range_margin"):
        _job(range_margin=margin)


# -- tree, module names ------------------------------------------------------------------------
def test_tree_fold_is_the_fixed_pairwise_tree():
    assert tree_fold(lambda a, b: f"({a}{b})", list("abcdefg")) == "(((ab)(cd))((ef)g))"
    assert tree_fold(lambda a, b: a + b, ["x"]) == "x"
    with pytest.raises(ValueError, match="at least one leaf"):
        tree_fold(lambda a, b: a, [])


def test_mc_replay_is_documented_and_says_what_it_did(tmp_path):
    """What a user sees of mc.replay: its signature and docstring, and a report that says the verdict."""
    import inspect

    params = list(inspect.signature(mc.replay).parameters)
    assert params[:3] == ["run_id", "shard", "store"] and "job" in params and "trust_origin" in params
    assert "Recompute ``shard``" in (mc.replay.__doc__ or "")
    job = _job(range=(-9.0, 9.0))
    store = RunStore(str(tmp_path))
    store.holdings(job, mc.pilot(job))
    store.write_shards(job.id, {1: mc.compute_shard(job, 1)}, "w")
    report = mc.replay(job.id[:8], 1, str(tmp_path), job=job)
    assert report.match and str(report) == f"run {job.id[:12]} shard 1: recomputed alone, identical (exact)"
