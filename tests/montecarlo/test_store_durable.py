"""The Monte-Carlo store's trust cases (issue 25), on real files and real processes.

Each test failed on the store before it moved onto the durability layer:

- a shard state that is not the run's accumulator (``0``, a shard of another run) and a
  result.json claiming mean 42: ``mc show`` printed "mean 42 ... verified" or raised a bare
  ``ValueError``; now the state is refused naming its file, and no figure is shown that was
  not recomputed from the shards;
- ``mc.replay`` without ``job=`` in a script called a helper function of the script whose
  address a hostile store reproduced; now only the pipeline of a Job the script built is used;
- a block of 128 shards of 2**20 bins became a 268 MB shard file that the readers refuse
  (256 MiB); now the writer splits it, and never writes a file above the readers' cap;
- a manifest with a retyped ``range`` (checksum recomputed) crashed replay with ``TypeError``,
  a state nested 600 deep with ``RecursionError``; now each is a StoreError naming the file;
- every manifest field, retyped to each JSON type with its checksum recomputed: replay, show
  and resume load it or raise a StoreError naming manifest.json, nothing else (the fuzzer's
  TypeError, issue 26);
- verification of reused shards is a sample: print(result), ``mc show`` and the docs say "k of
  N reused shards re-run" and name ``verify-reused: all``.
"""
import json
import math
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from dask_research import montecarlo as mc
from dask_research.cli import main
from dask_research.durable import jsondoc
from dask_research.exceptions import StoreError
from dask_research.montecarlo.codec import encode
from dask_research.montecarlo.store import RunStore, StoreWarning, checksum, store_files
from dask_research.montecarlo.store.manifest import build_manifest
from dask_research.testing.processes import subprocess_env


def tanh_of(a, b):
    return np.tanh(a * b)


def _job(seed=1, rng=(0.0, 1.0), shards=4, **kw):
    return mc.Job(tanh_of, {"a": mc.Normal(1, 0.1), "b": mc.Normal(2, 0.2)}, shards=shards, samples_per_shard=64,
                  seed=seed, bins=8, range=rng, **kw)


def _store(root: pathlib.Path, job, result=None) -> RunStore:
    """A complete store of ``job`` written through the public store API (no cluster)."""
    rs = RunStore(str(root))
    rs.write_manifest(job.id, build_manifest(job, mc.pilot(job)))
    rs.write_shards(job.id, {s: mc.compute_shard(job, s) for s in range(job.shards)}, "tcp://w1")
    if result is not None:
        rs.write_result(job.id, result)
    return rs


def _shard_file(root, job) -> pathlib.Path:
    return next((pathlib.Path(root) / "runs" / job.id / "shards").iterdir())


def _resign_shards(path: pathlib.Path, edit) -> None:
    doc = json.loads(path.read_text())
    edit(doc["states"])
    doc["checksum"] = checksum(doc["states"])
    path.write_text(json.dumps(doc))


def _resign_manifest(path: pathlib.Path, edit) -> None:
    doc = json.loads(path.read_text())
    edit(doc)
    doc["checksum"] = checksum({k: v for k, v in doc.items() if k != "checksum"})
    path.write_text(json.dumps(doc))


FORGED = {"mean": 42.0, "sd": 0.1, "stderr": 0.001, "n": 256, "mean_interval95": [41.9, 42.1],
          "verification": {"checked": [{"shard": 0, "producer": "w", "verifier": "v", "same_worker": False,
                                        "match": True}], "mismatches": []},
          "workers": {"w": 4}, "computed_shards": 4, "reused_shards": 0}


# -- show refuses a state that is not the run's accumulator, and shows only what it recomputed -----
def test_show_refuses_a_state_that_is_not_an_accumulator_and_never_prints_the_forged_mean(tmp_path):
    job = _job()
    _store(tmp_path, job, FORGED)
    path = _shard_file(tmp_path, job)
    _resign_shards(path, lambda states: states.__setitem__("0", 0))
    with pytest.raises(StoreError, match=rf"{path.name}: holds an int for shard 0, not the run's accumulator"):
        mc.show(job.id, str(tmp_path))
    out = CliRunner().invoke(main, ["mc", "show", job.id[:10], "--store", str(tmp_path)])
    assert out.exit_code == 1 and path.name in out.output, out.output
    assert "mean 42" not in out.output and "verified" not in out.output and "Traceback" not in out.output


def test_a_transplanted_shard_of_another_run_is_refused_naming_the_file(tmp_path):
    job, other = _job(), _job(seed=2, rng=(-1.0, 1.0))
    _store(tmp_path, job, FORGED)
    path = _shard_file(tmp_path, job)
    alien = encode(mc.compute_shard(other, 1))
    _resign_shards(path, lambda states: states.__setitem__("1", alien))
    for call in (lambda: mc.show(job.id, str(tmp_path)), lambda: mc.replay(job.id, 1, str(tmp_path), job=job),
                 lambda: RunStore(str(tmp_path)).holdings(job)):
        with pytest.raises(StoreError, match=rf"{path.name}: shard 1 has histogram \[-1.0, 1.0\) x 8, not the run's"):
            call()


def test_show_prints_only_what_it_recomputed_from_the_shards(tmp_path):
    job = _job()
    _store(tmp_path, job, FORGED)
    with pytest.warns(StoreWarning, match="result.json disagrees with the stored shards: mean 42.0"):
        info = mc.show(job.id, str(tmp_path))
    res = info["result"]
    assert res["verification"] is None and "mean_interval95 [41.9, 42.1]" in res["result_mismatch"]
    assert math.isclose(res["mean"], 0.96, rel_tol=0.02) and res["n"] == 256
    lo, hi = res["mean_interval95"]
    assert lo < res["mean"] < hi and hi - lo < 0.01                     # recomputed, not the forged [41.9, 42.1]
    out = CliRunner().invoke(main, ["mc", "show", job.id, "--store", str(tmp_path)])   # the warning: one line
    assert [x for x in out.output.splitlines() if "disagrees with the stored shards" in x][0].startswith("Warning: ")
    assert out.exit_code == 0 and "mean 42" not in out.stdout and "41.9" not in out.stdout
    assert "(recomputed from the stored shards)" in out.stdout and "verified" not in out.stdout


class Count:
    def init(self):
        return {"n": 0}

    def update(self, state, y):
        return {"n": state["n"] + len(y)}

    def merge(self, a, b):
        return {"n": a["n"] + b["n"]}

    def finalize(self, state):
        return state["n"]


def test_show_of_a_user_reducer_shows_no_figure_it_cannot_recompute(tmp_path):
    job = _job(rng=None, reducer=Count())
    _store(tmp_path, job, FORGED)
    res = mc.show(job.id, str(tmp_path))["result"]
    assert res["result_checked"] is False and res["mean"] is None and res["mean_interval95"] is None
    out = CliRunner().invoke(main, ["mc", "show", job.id, "--store", str(tmp_path)])
    assert out.exit_code == 0, out.output
    assert "mean 42" not in out.output and "verified" not in out.output
    assert "a user reducer, which show cannot recompute without its code" in out.output


# -- replay without job= never calls a helper of the user's __main__ ---------------------------------
VICTIM = '''
import pathlib
import sys

import numpy as np
from dask_research import montecarlo as mc
from dask_research.durable import jsondoc
from dask_research.exceptions import StoreError


def helper(a):
    pathlib.Path(sys.argv[3]).write_text("the store chose the code that runs")
    return a


def model(a):
    return np.tanh(a)


job = mc.Job(model, {"a": mc.Normal(0.0, 1.0)}, shards=2, samples_per_shard=64, seed=1, range=(-1.0, 1.0))
try:
    mc.replay(sys.argv[1], 0, sys.argv[2])
    print("REPLAYED")
except StoreError as e:
    print("REFUSED", e)
'''

ATTACKER = '''
import pathlib
import sys

import numpy as np
from dask_research import montecarlo as mc
from dask_research.montecarlo.job import ENGINE
from dask_research.montecarlo.store import RunStore

{helper}

# The helper's content address, reproduced from the script's text (never run here).
job = mc.Job(helper, {{"a": mc.Normal(0.0, 1.0)}}, shards=2, samples_per_shard=64, seed=1, range=(-1.0, 1.0))
rs = RunStore(sys.argv[1])
rs.write_manifest(job.id, {{"job": job.describe(), "name": "innocent", "range": [-1.0, 1.0], "pilot": {{}},
                           "engine": dict(ENGINE),
                           "origin": {{"module": "__main__", "qualname": "helper", "file": sys.argv[2]}}}})
rs.write_shards(job.id, {{0: mc.Moments.from_samples(np.array([0.5]), (-1.0, 1.0), 8)}}, "w")
print(job.id)
'''


@pytest.mark.slow
@pytest.mark.timeout(300, method="thread")
def test_replay_in_a_script_never_calls_a_helper_whose_address_the_store_reproduced(tmp_path):
    script = tmp_path / "analysis.py"
    script.write_text(VICTIM)
    helper = VICTIM[VICTIM.index("def helper"):VICTIM.index("def model")].strip()
    attacker = tmp_path / "attacker.py"
    attacker.write_text(ATTACKER.format(helper=helper))
    store, marker = tmp_path / "store", tmp_path / "MARKER"
    made = subprocess.run([sys.executable, str(attacker), str(store), str(script)], cwd=tmp_path,
                          env=subprocess_env(), capture_output=True, text=True, timeout=240)
    assert made.returncode == 0, made.stderr[-3000:]
    rid = made.stdout.split()[-1]
    out = subprocess.run([sys.executable, str(script), rid, str(store), str(marker)], cwd=tmp_path,
                         env=subprocess_env(), capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("REFUSED"), out.stdout
    assert "not the pipeline of any job built in this process" in out.stdout and "pass job=" in out.stdout
    assert "manifest.json" in out.stdout and not marker.exists()


def test_replay_without_job_uses_the_pipeline_of_a_job_this_process_built(tmp_path):
    job = _job()
    _store(tmp_path, job)
    rebuilt = mc.Job(tanh_of, job.inputs, shards=4, samples_per_shard=64, seed=1, bins=8, range=(0.0, 1.0))
    del job, rebuilt                       # the pipeline lives on (a module function): still found
    assert mc.replay(_job().id, 2, str(tmp_path)).match


# -- the writer never writes a file its readers refuse ---------------------------------------------
def test_a_block_too_large_for_one_file_is_split_into_files_the_readers_accept(tmp_path):
    job = _job(shards=16)
    rs = RunStore(str(tmp_path))
    rs.write_manifest(job.id, build_manifest(job, mc.pilot(job)))
    states = {s: mc.compute_shard(job, s) for s in range(16)}
    one = len(json.dumps({"states": {"0": encode(states[0])}}))
    cap = 5 * one                           # a few shards per file
    first, _ = rs.write_shard_file(job.id, states, "w", cap=cap)
    files = sorted((tmp_path / "runs" / job.id / "shards").iterdir())
    assert len(files) > 2 and first == str(files[0])
    ranges = [tuple(int(x) for x in f.stem.split("-")) for f in files]
    assert ranges[0][0] == 0 and ranges[-1][1] == 16 and all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    assert all(f.stat().st_size <= cap for f in files) and max(f.stat().st_size for f in files) > cap - one
    for f in files:                    # each file byte for byte what the durable layer writes of its document
        assert f.read_bytes() == jsondoc.dumps(jsondoc.loads(f.read_bytes()))
    stored = rs.read_shards(job.id)
    assert {s: v[0] for s, v in stored.items()} == states
    assert mc.show(job.id, str(tmp_path))["complete"]
    rs.write_shard_file(job.id, states, "w", cap=cap)             # the same split again: idempotent
    assert sorted((tmp_path / "runs" / job.id / "shards").iterdir()) == files
    with pytest.raises(StoreError, match=r"shard 0's accumulator alone makes a .* shard file, more than the 100 "
                                         r"the store's readers accept; use fewer bins"):
        rs.write_shard_file("ab" * 32, {0: states[0]}, "w", cap=100)
    assert not (tmp_path / "runs" / ("ab" * 32)).exists()


def test_the_store_cap_is_the_same_for_its_writer_and_its_readers(tmp_path, monkeypatch):
    job = _job(shards=8)
    rs = RunStore(str(tmp_path))
    states = {s: mc.compute_shard(job, s) for s in range(8)}
    whole = len(json.dumps({"states": {str(s): encode(m) for s, m in states.items()}}))
    monkeypatch.setattr(store_files, "MAX_FILE_BYTES", whole // 3)
    rs.write_shards(job.id, states, "w")
    files = list((tmp_path / "runs" / job.id / "shards").iterdir())
    assert len(files) >= 3 and all(f.stat().st_size <= whole // 3 for f in files)
    assert sorted(rs.read_shards(job.id)) == list(range(8))
    with pytest.raises(StoreError, match=r"result.json: would be [\d,]+ bytes, more than the [\d,]+ its readers accept"):
        rs.write_result(job.id, {"state": encode(states[0]), "pad": "x" * whole})


@pytest.mark.slow
@pytest.mark.timeout(600, method="thread")
def test_a_block_of_128_shards_of_2_20_bins_never_makes_a_file_above_the_readers_cap(tmp_path):
    """The issue's case at its real size: 128 shards x 2**20 bins is ~268 MB of JSON, above 256 MiB."""
    job = mc.Job(tanh_of, {"a": mc.Normal(1, 0.1), "b": mc.Normal(2, 0.2)}, shards=128, samples_per_shard=16,
                 seed=3, bins=2**20, range=(0.0, 1.0))
    state = mc.compute_shard(job, 0)
    doc = encode(state)                    # one encoding shared by every shard: the writer's size is the same

    rs = RunStore(str(tmp_path))
    rs.write_shard_file(job.id, {s: state for s in range(128)}, "w", encoder=lambda m: doc)
    files = sorted((tmp_path / "runs" / job.id / "shards").iterdir())
    sizes = [f.stat().st_size for f in files]
    assert sum(sizes) > store_files.MAX_FILE_BYTES                 # one file would have been refused
    assert len(files) >= 2 and max(sizes) <= store_files.MAX_FILE_BYTES
    ranges = [tuple(int(x) for x in f.stem.split("-")) for f in files]
    assert ranges[0][0] == 0 and ranges[-1][1] == 128 and all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))


# -- retyped and hostile documents: a StoreError naming the file -------------------------------------
def test_a_retyped_manifest_range_and_a_deep_state_are_store_errors_naming_the_file(tmp_path):
    job = _job()
    _store(tmp_path, job)
    mpath = tmp_path / "runs" / job.id / "manifest.json"
    _resign_manifest(mpath, lambda d: d.__setitem__("range", True))
    for call in (lambda: mc.replay(job.id, 0, str(tmp_path), job=job), lambda: mc.show(job.id, str(tmp_path)),
                 lambda: RunStore(str(tmp_path)).holdings(job)):
        with pytest.raises(StoreError, match=r"manifest.json: range is True; expected a pair \[lo, hi\]"):
            call()
    _resign_manifest(mpath, lambda d: d.__setitem__("range", [0.0, 1.0]))
    path = _shard_file(tmp_path, job)
    deep: object = 1.0
    for _ in range(600):
        deep = [deep]
    _resign_shards(path, lambda states: states.__setitem__("0", deep))
    for call in (lambda: mc.replay(job.id, 0, str(tmp_path), job=job), lambda: mc.show(job.id, str(tmp_path)),
                 lambda: RunStore(str(tmp_path)).holdings(job)):
        with pytest.raises(StoreError, match=rf"{path.name}: is nested more than 64 levels deep"):
            call()


def _manifest_paths(doc, prefix=()):
    if prefix:
        yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            if not prefix and k == "checksum":
                continue
            yield from _manifest_paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:3]):          # a few items of each list (cpu_features has dozens)
            yield from _manifest_paths(v, prefix + (i,))


WRONG = [True, 0, "x", [], {}, None]


@pytest.mark.slow
def test_every_manifest_field_retyped_is_a_store_error_naming_the_manifest(tmp_path):
    """The fuzzer's raw TypeError in replay (issue 26), as a regression test: each field of a real
    manifest set to each JSON type, checksum recomputed; replay, show and resume load it (a value
    the run could have written) or raise a StoreError naming manifest.json, never anything else."""
    job = _job()
    _store(tmp_path, job)
    mpath = tmp_path / "runs" / job.id / "manifest.json"
    pristine = mpath.read_text()
    loads = {"replay": lambda: mc.replay(job.id, 1, str(tmp_path), job=job),
             "show": lambda: mc.show(job.id, str(tmp_path)),
             "resume": lambda: RunStore(str(tmp_path)).holdings(job)}
    cases = refused = 0
    paths = list(_manifest_paths(json.loads(pristine)))
    assert ("range",) in paths and ("job", "partitioning", "shards") in paths and ("origin", "qualname") in paths
    for path in paths:
        for value in WRONG:
            doc = json.loads(pristine)
            node = doc
            for p in path[:-1]:
                node = node[p]
            if node[path[-1]] == value and type(node[path[-1]]) is type(value):
                continue
            node[path[-1]] = value
            doc["checksum"] = checksum({k: v for k, v in doc.items() if k != "checksum"})
            mpath.write_text(json.dumps(doc))
            for name, load in loads.items():
                cases += 1
                try:
                    load()
                except StoreError as e:
                    refused += 1
                    assert "manifest.json" in str(e), (path, value, name, str(e))
                except Exception as e:       # noqa: BLE001 - the point: nothing else, ever
                    raise AssertionError(f"{name} with {path}={value!r}: {type(e).__name__}: {e}") from None
    mpath.write_text(pristine)
    assert cases > 500 and refused > cases // 3
    for top in ("format", "run_id", "job", "range", "engine"):       # what every reader relies on
        for value in WRONG:
            doc = json.loads(pristine)
            doc[top] = value
            doc["checksum"] = checksum({k: v for k, v in doc.items() if k != "checksum"})
            mpath.write_text(json.dumps(doc))
            if top == "range" and value is None:
                continue                                            # a run without a recorded range
            for load in loads.values():
                with pytest.raises(StoreError, match="manifest.json"):
                    load()


# -- verification of reused shards: a sample, and said so ---------------------------------------------
@pytest.fixture
def client(loop):  # noqa: F811 - distributed's loop fixture
    from distributed import Client, LocalCluster

    with LocalCluster(loop=loop, n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=None) as cl, Client(cl, set_as_default=False) as c:
        yield c


@pytest.mark.timeout(300, method="thread")
def test_print_result_and_mc_show_say_how_many_reused_shards_were_re_run(tmp_path, client):
    import dask

    job, store = _job(shards=16), str(tmp_path / "store")
    mc.run(job, client=client, store=store, progress=False, verify=0, shards_per_task=4)
    again = mc.run(job, client=client, store=store, progress=False, verify=1)
    line = next(ln for ln in str(again).splitlines() if "reused shards" in ln)
    assert re.search(r"1 of 16 reused shards re-run at random( \(1 more re-run where the run's own checks fell, "
                     r"[^)]*\))?: a stored shard edited within every invariant is caught only if it is one of the 1 "
                     r"\(probability 1/16\); research.montecarlo.verify-reused: all re-runs every one", line), line
    out = CliRunner().invoke(main, ["mc", "show", job.id, "--store", store])
    assert out.exit_code == 0 and "reused shards 1 of 16 reused shards re-run" in out.output, out.output
    none = mc.run(job, client=client, store=store, progress=False, verify=0)
    assert "0 of 16 reused shards re-run (verify=0)" in str(none)
    with dask.config.set({"research.montecarlo.verify-reused": "all"}):
        every = mc.run(job, client=client, store=store, progress=False, verify=1)
    assert "16 of 16 reused shards re-run: every shard this result reuses from the store was recomputed" in str(every)
    # The two lines agree (a newcomer saw "8 stored by an earlier run, recomputed" beside "4 of 64"):
    four = mc.run(job, client=client, store=store, progress=False, verify=4)
    verified = next(ln for ln in str(four).splitlines() if "shards re-run, all match" in ln)
    reused = next(ln for ln in str(four).splitlines() if "reused shards" in ln)
    n_stored = int(re.search(r"(\d+) stored by an earlier run", verified).group(1))
    drawn = re.search(r"(\d+) of 16 reused shards re-run at random( \((\d+) more)?", reused)
    assert n_stored == int(drawn.group(1)) + int(drawn.group(3) or 0), (verified, reused)


def test_the_docs_say_what_verification_checks_of_reused_shards():
    text = (pathlib.Path(__file__).parents[2] / "docs" / "montecarlo.rst").read_text()
    flat = " ".join(text.split())
    assert "caught only with probability k/N" in flat and "verify-reused: all" in flat
    assert '"k of N reused shards re-run"' in flat


# -- a shard file is signed over the bytes it holds --------------------------------------------------
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**62, 2**62) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(states=st.dictionaries(st.integers(0, 200), _json_values, min_size=1, max_size=12))
def test_a_shard_file_is_signed_with_the_checksum_its_readers_recompute(tmp_path_factory, states):
    """The writer signs its own canonical entries (one encoding per state, not two): the
    signature must be the checksum of the states as a reader parses them back, for any state,
    any key order and any shard numbering ("10" sorts before "2")."""
    root = tmp_path_factory.mktemp("signed")
    path, signature = RunStore(str(root)).write_shard_file("a" * 64, states, "w", encoder=lambda v: v)
    doc = json.loads(pathlib.Path(path).read_bytes())
    assert doc["checksum"] == signature == checksum(doc["states"]) == checksum({str(k): v for k, v in states.items()})
