"""The security review of the Monte-Carlo store and replay: each finding reproduced on real files
and real processes (adapted from the reviewer's scripts).

1/12  a manifest names a builtin, a library function or a module ``__getattr__`` chain: replay never
      calls, imports or walks it (a fresh ``python`` process, and the CLI)
2     bound methods of different instances (and different methods) never share a content address
3     an edited shard (mean outside [min, max], wrapped histogram, M2 too large) is refused on resume
4     a forged lease (heartbeat in the future, NaN, another host) blocks a run for lease-timeout only
5     a FIFO or a device where a shard file or the lease should be is refused at once, never read
8     two takers of one stale lease: one wins; a writer that lost its lease stops writing
10    a ``shards/`` swapped for a link between the check and the write: nothing lands outside
11    a forged result.json: ``show`` (and ``mc show``) print what the shards hold, and say so
14    a run id with a trailing newline, non-ASCII digits in a shard name, a pipeline error on replay
"""
import functools
import json
import math
import os
import pathlib
import socket
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest

from dask_research import montecarlo as mc
from dask_research.exceptions import InputError, PipelineError, StoreError
from dask_research.montecarlo.address import pipeline_fingerprint
from dask_research.montecarlo.store import RunStore, StoreWarning, checksum
from dask_research.testing.processes import run_python, subprocess_env


@pytest.fixture
def client(loop):  # noqa: F811 - distributed's loop fixture
    from distributed import Client, LocalCluster

    with LocalCluster(loop=loop, n_workers=1, threads_per_worker=2, processes=False,
                      dashboard_address=None) as cl, Client(cl, set_as_default=False) as c:
        yield c


@pytest.fixture
def two_workers(loop):  # noqa: F811 - distributed's loop fixture
    from distributed import Client, LocalCluster

    with LocalCluster(loop=loop, n_workers=2, threads_per_worker=1, processes=False,
                      dashboard_address=None) as cl, Client(cl, set_as_default=False) as c:
        yield c


def pipe(a):
    return a * 2


def _job(shards=16):
    return mc.Job(pipe, {"a": mc.Normal(0.0, 1.0)}, shards=shards, samples_per_shard=256, seed=1, range=(-8, 8))


# -- 1, 12: a store never chooses the code that runs ---------------------------------------------
ATTACKER = '''
import importlib
import sys
import numpy as np
from dask_research import montecarlo as mc
from dask_research.montecarlo.job import ENGINE
from dask_research.montecarlo.store import RunStore

def decoy(**inputs):
    return inputs

store, module, qualname, name = sys.argv[1:5]
target = importlib.import_module(module)
for part in qualname.split("."):
    target = getattr(target, part)
kw = dict(shards=1, samples_per_shard=1, seed=0, bins=4, range=(0.0, 1.0))
try:   # the run id the victim's process would compute for the store-chosen callable
    job = mc.Job(target, {name: mc.Fixed(1.0)}, **kw)
    job.id
except Exception:   # this code refuses to give it an address: any id will do
    job = mc.Job(decoy, {name: mc.Fixed(1.0)}, **kw)
rs = RunStore(store).prepare()
rs.write_manifest(job.id, {"job": job.describe(), "name": "innocent", "range": [0.0, 1.0], "pilot": {},
                           "engine": dict(ENGINE), "origin": {"module": module, "qualname": qualname, "file": None}})
rs.write_shards(job.id, {0: mc.Moments.from_samples(np.array([0.5]), (0.0, 1.0), 4)}, worker="w")
print(job.id)
'''

VICTIM = '''
import sys
from dask_research import montecarlo as mc
run_id, store = sys.argv[1], sys.argv[2]
try:
    mc.replay(run_id, 0, store)
    print("REPLAYED")
except Exception as e:
    print("RAISED", type(e).__name__, str(e))
import json
print("JSON IS A", type(json).__name__, "| f2py imported:", "numpy.f2py" in sys.modules)
'''


@pytest.mark.slow
@pytest.mark.timeout(240, method="thread")
@pytest.mark.parametrize("module,qualname,name", [
    ("sys", "modules.update", "json"),                        # a builtin bound method: import json broke
    ("distributed.protocol.pickle", "loads", "x"),            # a library function: unpickles store bytes
    ("numpy", "f2py.main", "x"),                              # a module __getattr__ that imports
])
def test_a_manifest_never_makes_replay_call_a_builtin_or_library_function(tmp_path, module, qualname, name):
    store = tmp_path / "store"
    made = run_python(ATTACKER, tmp_path, str(store), module, qualname, name)
    assert made.returncode == 0, made.stderr
    rid = made.stdout.split()[-1]
    out = run_python(VICTIM, tmp_path, rid, str(store))
    assert out.returncode == 0, out.stderr
    # PipelineNotGiven: the StoreError that says the job must come from the caller
    assert "RAISED PipelineNotGiven" in out.stdout and "not the pipeline of any job built in this process" in out.stdout, \
        out.stdout
    assert "JSON IS A module | f2py imported: False" in out.stdout, out.stdout
    cli = subprocess.run([sys.executable, "-m", "dask_research.cli", "mc", "replay", rid, "--shard", "0",
                          "--store", str(store)], cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True,
                         timeout=120)
    assert cli.returncode == 2 and "a store never chooses the code that runs; give --job" in cli.stderr + cli.stdout


def test_only_pipelines_of_jobs_built_here_are_candidates_never_through_getattr(tmp_path, monkeypatch):
    """A function of an imported module is a candidate only once a Job was built on it; the walk
    that finds it never runs a module ``__getattr__``, and a library's functions never qualify."""
    import importlib

    replay = importlib.import_module("dask_research.montecarlo.audit")
    mod = tmp_path / "usermod.py"
    mod.write_text(textwrap.dedent('''
        CALLS = []
        def __getattr__(name):          # a module __getattr__ must never run on a manifest's word
            CALLS.append(name)
            return lambda **kw: kw
        def helper(a):
            return a + 1
        def pipeline(a):
            return a
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    import usermod

    find = replay._built_pipelines
    helper, pipeline = pipeline_fingerprint(usermod.helper), pipeline_fingerprint(usermod.pipeline)
    assert find(helper) == [] and find(pipeline) == []          # imported, but no job built on them
    job = mc.Job(usermod.pipeline, {"a": mc.Normal(0.0, 1.0)}, shards=2, samples_per_shard=8, seed=1)
    assert find(pipeline) == [usermod.pipeline] and find(helper) == []
    assert usermod.CALLS == []
    assert find(pipeline_fingerprint(os.path.join)) == [] and job.pipeline is usermod.pipeline


# -- 2: different jobs never share an address ----------------------------------------------------
class Model:
    def __init__(self, gain):
        self.gain = gain

    def simulate(self, a):
        return self.gain * a

    def other(self, a):
        return -a


class Scaled:
    def __init__(self, k):
        self.k = k

    def __call__(self, a):
        return self.k * a


@pytest.mark.timeout(240, method="thread")
def test_bound_methods_of_different_instances_are_different_runs(tmp_path, client):
    mk = lambda f: mc.Job(f, {"a": mc.Normal(1.0, 0.1)}, shards=4, samples_per_shard=256, seed=1,  # noqa: E731
                          range=(-50, 50))
    j2, j3, jo = mk(Model(2.0).simulate), mk(Model(3.0).simulate), mk(Model(2.0).other)
    assert len({j2.id, j3.id, jo.id}) == 3
    assert mk(Model(2.0).simulate).id == j2.id                      # still a content address
    assert len({mk(Scaled(2.0)).id, mk(Scaled(3.0)).id}) == 2
    store = str(tmp_path / "store")
    r2 = mc.run(j2, client=client, store=store, progress=False, verify=0)
    r3 = mc.run(j3, client=client, store=store, progress=False, verify=0)
    assert r3.reused_shards == 0 and abs(r3.mean - 3.0) < 0.05 and abs(r2.mean - 2.0) < 0.05


def test_builtins_ufuncs_and_partials_are_fingerprinted_by_what_they_are():
    fps = [pipeline_fingerprint(f) for f in (math.sin, math.cos, np.sin, np.cos, len, str.upper,
                                             functools.partial(np.add, 1.0), functools.partial(np.add, 2.0))]
    assert len({json.dumps(f, sort_keys=True) for f in fps}) == len(fps)
    assert fps[2] == {"ufunc": "numpy.sin"} and fps[4] == {"builtin": "builtins.len"}
    assert pipeline_fingerprint({"a": 1.0}.update) == {"builtin": "builtins.dict.update", "self": {"dict": {"a": 1.0}}}

    class Opaque:
        def __init__(self):
            self.rng = np.random.default_rng()

        def __call__(self, a):
            return a

    with pytest.raises(InputError, match="Generator"):       # no stable description: refused, not collided
        pipeline_fingerprint(Opaque())
    with pytest.raises(InputError, match="content address"):
        pipeline_fingerprint(sys.modules.update)


def test_the_scheme_1_address_of_a_plain_function_is_unchanged():
    # What main's address.py gave for this function before the review's fixes (a plain function
    # is described exactly as before in scheme 1, so the run ids of stores written then stay
    # checkable; scheme 2 describes it by its code, tests/montecarlo/test_address_everywhere.py).
    assert pipeline_fingerprint(pipe, scheme=1) == {"qualname": "pipe", "source": "def pipe(a):\n    return a * 2\n",
                                                    "defaults": []}


# -- 3: an edited shard is refused ---------------------------------------------------------------
def _edit(path, shard, change):
    doc = json.loads(pathlib.Path(path).read_text())
    change(doc["states"][str(shard)]["__moments__"])
    doc["checksum"] = checksum(doc["states"])
    pathlib.Path(path).write_text(json.dumps(doc))


@pytest.mark.timeout(300, method="thread")
@pytest.mark.parametrize("label", ["mean 1e6", "hist wraps int64", "m2 too large", "min outside its bins"])
def test_an_edited_shard_that_passed_the_old_checks_is_refused(tmp_path, client, label):
    job, store = _job(), str(tmp_path / "store")
    clean = mc.run(job, client=client, store=store, progress=False, verify=0, shards_per_task=16)
    stored = RunStore(store).read_shards(job.id)
    victim = 5
    path = stored[victim][2]
    edits = {
        "mean 1e6": lambda st: st.__setitem__("mean", 1e6.hex()),
        "hist wraps int64": lambda st: [st["hist"].__setitem__(i, st["hist"][i] + 2**62) for i in (1, 2, 3, 4)],
        "m2 too large": lambda st: st.__setitem__("m2", (float.fromhex(st["m2"]) * 1e3).hex()),
        "min outside its bins": lambda st: st.__setitem__("min", (-7.99).hex()),
    }
    _edit(path, victim, edits[label])
    os.remove(f"{store}/runs/{job.id}/result.json")
    with pytest.raises(StoreError, match=rf"{os.path.basename(path)}: shard {victim} cannot be decoded: .*"
                                         "invalid accumulator"):
        mc.run(job, client=client, store=store, progress=False, verify=4)
    assert clean.n == job.total_samples


# -- 4: a forged lease blocks for lease-timeout, not forever -------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(180, method="thread")
@pytest.mark.parametrize("heartbeat", ["1e12", "NaN", "-1e300", "null"])
def test_a_forged_lease_is_taken_over_after_lease_timeout_of_our_own_clock(tmp_path, client, heartbeat):
    import dask

    job, store = _job(4), str(tmp_path / "store")
    run_dir = pathlib.Path(store) / "runs" / job.id
    run_dir.mkdir(parents=True)
    (run_dir / "lease.json").write_text('{"owner":"mallory","host":"elsewhere","pid":1,"started":0,'
                                        f'"heartbeat":{heartbeat}}}')
    said = []
    t0 = time.monotonic()
    with dask.config.set({"research.montecarlo.lease-timeout": 1.0}):
        lease = RunStore(store).lease(job.id, announce=said.append)
        with lease:
            pass
    assert time.monotonic() - t0 < 60
    assert "is held by mallory" in said[0] and "heartbeat unknown" in said[0], said
    assert "taking over the lease of run" in said[1] and "held by mallory" in said[1], said
    assert "has not changed for 1 s by this process's clock" in said[1], said
    with dask.config.set({"research.montecarlo.lease-timeout": 1.0}):
        (run_dir / "lease.json").write_text('{"owner":"mallory","host":"elsewhere","pid":1,"heartbeat":1e12}')
        res = mc.run(job, client=client, store=store, progress=False, verify=0)
    assert res.computed_shards == 4 and not (run_dir / "lease.json").exists()


# -- 5: FIFOs and devices are refused at once ----------------------------------------------------
@pytest.mark.timeout(120, method="thread")
@pytest.mark.parametrize("what", ["shard-fifo", "shard-devzero", "lease-fifo", "manifest-fifo"])
def test_a_fifo_or_device_in_the_store_is_refused_at_once(tmp_path, client, what):
    job, store = _job(4), str(tmp_path / "store")
    mc.run(job, client=client, store=store, progress=False, verify=0)
    run_dir = pathlib.Path(store) / "runs" / job.id
    target = {"shard-fifo": run_dir / "shards" / "000000000005-000000000006.json",
              "shard-devzero": run_dir / "shards" / "000000000005-000000000006.json",
              "lease-fifo": run_dir / "lease.json", "manifest-fifo": run_dir / "manifest.json"}[what]
    if target.exists():
        target.unlink()
    if what == "shard-devzero":
        os.symlink("/dev/zero", target)
    else:
        os.mkfifo(target)
    problem = "is a symbolic link; links inside it are refused" if what == "shard-devzero" else \
        "is a FIFO, not a regular file"
    with pytest.raises(StoreError, match=rf"{target.name}: {problem}"):
        if what == "lease-fifo":
            mc.run(job, client=client, store=store, progress=False, verify=0)
        else:
            mc.show(job.id, store)


# -- 8: one writer wins a takeover; a writer that lost its lease stops ---------------------------
def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_two_takers_of_one_stale_lease_leave_one_holder(tmp_path):
    rs = RunStore(str(tmp_path / "store")).prepare()
    rid = "ab" * 32
    run_dir = tmp_path / "store" / "runs" / rid
    run_dir.mkdir(parents=True)
    (run_dir / "lease.json").write_text(json.dumps({"owner": "crashed", "host": socket.gethostname(),
                                                    "pid": _dead_pid(), "started": 0, "heartbeat": 0}))
    a, b = rs.lease(rid, announce=print), rs.lease(rid, announce=print)
    # Both find the same lease and judge it stale (its process is dead) ...
    seen = {}
    for lease in (a, b):
        assert not lease._try_create()
        seen[lease] = lease._raw()
        assert "is gone" in lease._stale(lease._parse(seen[lease]), seen[lease])
    # ... A takes it over and creates its own; B's takeover must not remove A's fresh lease.
    assert a._take_over(seen[a]) and a._try_create()
    assert not b._take_over(seen[b])
    assert not b._try_create()
    assert a.holder()["token"] == a.token
    assert sorted(p.name for p in run_dir.iterdir()) == ["lease.json", "lease.lock"]


def test_a_writer_that_lost_its_lease_stops_writing(tmp_path):
    rs = RunStore(str(tmp_path / "store")).prepare()
    rid = "cd" * 32
    states = {0: mc.Moments.from_samples(np.array([0.5]), (0.0, 1.0), 4)}
    with rs.lease(rid, announce=lambda m: None) as lease:
        rs.write_shards(rid, states, worker="w")                       # holds it: written
        # Presumed dead and taken over by another run (the whole file replaced at once):
        tmp = pathlib.Path(lease.path).with_name("lease.swap")
        tmp.write_text(json.dumps({**lease.holder(), "token": "thief", "owner": "bob"}))
        os.replace(tmp, lease.path)
        with pytest.raises(StoreError, match=r"000000000001-000000000002.json: not written: this writer lost the "
                                             r"lease of run cdcdcdcdcdcd .*held now by bob"):
            rs.write_shards(rid, {1: states[0]}, worker="w")
        with pytest.raises(StoreError, match="lost the lease"):
            rs.write_result(rid, {"mean": 1.0})
    assert sorted(rs.read_shards(rid)) == [0]
    assert not (tmp_path / "store" / "runs" / rid / "result.json").exists()


# -- 10: a link swapped in after the check -------------------------------------------------------
def test_a_shards_dir_swapped_for_a_link_mid_write_writes_nothing_outside(tmp_path, monkeypatch):
    store, outside = tmp_path / "store", tmp_path / "outside"
    outside.mkdir()
    rs = RunStore(str(store)).prepare()
    rid = "ef" * 32
    shards = store / "runs" / rid / "shards"
    shards.mkdir(parents=True)
    real_open = os.open
    swapped = []

    def racing_open(path, flags, *args, **kwargs):
        # The attacker wins the race: right before the temporary shard file is created.
        if ".tmp-" in str(path) and not swapped:
            swapped.append(path)
            os.rename(shards, shards.with_name("shards.moved"))
            os.symlink(outside, shards)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", racing_open)
    try:
        rs.write_shards(rid, {0: mc.Moments.from_samples(np.array([0.5]), (0.0, 1.0), 4)}, worker="w")
    except StoreError:
        pass   # refusing is fine too; writing outside is not
    monkeypatch.undo()
    assert swapped and os.listdir(outside) == []
    with pytest.raises(StoreError, match="shards: is a symbolic link; links inside it are refused"):
        rs.write_shards(rid, {1: mc.Moments.from_samples(np.array([0.5]), (0.0, 1.0), 4)}, worker="w")


# -- 11: result.json is a copy, the shards are the record ----------------------------------------
@pytest.mark.timeout(240, method="thread")
def test_a_forged_result_json_is_shown_as_what_the_shards_hold(tmp_path, client):
    from dask_research.montecarlo.result import mean_text

    job, store = _job(4), str(tmp_path / "store")
    res = mc.run(job, client=client, store=store, progress=False, verify=1)
    info = mc.show(job.id, store)
    assert "result_mismatch" not in info["result"] and info["result"]["verification"]
    assert math.isclose(info["result"]["mean"], res.mean, rel_tol=1e-12)
    p = pathlib.Path(store) / "runs" / job.id / "result.json"
    d = json.loads(p.read_text())
    d.update(mean=42.0, sd=0.001, stderr=1e-5)
    p.write_text(json.dumps(d))
    with pytest.warns(StoreWarning, match="result.json disagrees with the stored shards: mean 42.0"):
        info = mc.show(job.id, store)
    assert math.isclose(info["result"]["mean"], res.mean, rel_tol=1e-12)
    assert info["result"]["verification"] is None and "mean 42.0" in info["result"]["result_mismatch"]
    cli = subprocess.run([sys.executable, "-m", "dask_research.cli", "mc", "show", job.id[:10], "--store", store],
                         env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr
    assert "mean 42" not in cli.stdout and "verified" not in cli.stdout and f"mean {mean_text(res.mean, res.stderr)}" in cli.stdout
    assert "disagrees with the stored shards" in cli.stderr


# -- 14: names and replay errors ------------------------------------------------------------------
def test_names_are_matched_whole_and_in_ascii_digits(tmp_path):
    rs = RunStore(str(tmp_path / "store")).prepare()
    with pytest.raises(StoreError, match="is not a run id"):
        rs.run_dir("ab" * 32 + "\n")
    rid = "12" * 32
    rs.write_shards(rid, {0: mc.Moments.from_samples(np.array([0.5]), (0.0, 1.0), 4)}, worker="w")
    digits = "\u0661" * 12        # ARABIC-INDIC DIGIT ONE: \d matched it
    (tmp_path / "store" / "runs" / rid / "shards" / f"{digits}-{digits}.json").write_text("not a shard")
    with pytest.warns(StoreWarning, match="not a shard file"):
        assert sorted(rs.read_shards(rid)) == [0]


BREAKS_ON_REPLAY = '''
import os
import numpy as np

def fragile(a):
    if os.environ.get("MC_BREAK"):
        raise ZeroDivisionError("the pipeline broke")
    return a * 2
'''


@pytest.mark.timeout(240, method="thread")
def test_a_pipeline_error_on_replay_names_the_shard(tmp_path, client, monkeypatch):
    from dask_research.cli import load_object

    path = tmp_path / "fragile_job.py"
    path.write_text(BREAKS_ON_REPLAY)
    fn = load_object(f"{path}:fragile")
    job = mc.Job(fn, {"a": mc.Normal(0.0, 1.0)}, shards=4, samples_per_shard=64, seed=1, range=(-8, 8))
    store = str(tmp_path / "store")
    mc.run(job, client=client, store=store, progress=False, verify=0)
    monkeypatch.setenv("MC_BREAK", "1")
    with pytest.raises(PipelineError, match=r"shard 3: .*raised ZeroDivisionError: the pipeline broke") as e:
        mc.replay(job.id, 3, store, job=job)
    assert isinstance(e.value.__cause__, ZeroDivisionError)


warnings.filterwarnings("default", category=StoreWarning)


# -- 3, second half: reused shards are verified, picked unpredictably -----------------------------
@pytest.mark.timeout(300, method="thread")
def test_an_edited_reused_shard_within_its_bounds_is_caught_by_reused_verification(tmp_path, two_workers):
    client = two_workers
    import dask

    job, store = _job(), str(tmp_path / "store")
    clean = mc.run(job, client=client, store=store, progress=False, verify=0, shards_per_task=4)
    stored = RunStore(store).read_shards(job.id)
    # A subtle edit that every invariant allows: the mean moved a little, inside [min, max].
    _edit(stored[5][2], 5, lambda st: st.__setitem__("mean", (float.fromhex(st["mean"]) + 0.01).hex()))
    os.remove(f"{store}/runs/{job.id}/result.json")
    with dask.config.set({"research.montecarlo.verify-reused": "all"}):
        again = mc.run(job, client=client, store=store, progress=False, verify=1)
    v = again.verification
    assert v["reused_checked"] == list(range(16))
    assert [m["shard"] for m in v["mismatches"]] == [5] and v["recomputed_shards"] >= 1
    assert again.state == clean.state


def test_reused_picks_are_not_a_function_of_the_run_id():
    from dask_research.montecarlo.verify import choose_reused, reused_count

    draws = {tuple(choose_reused(range(1000), 4)) for _ in range(20)}
    assert len(draws) > 1                                   # not the public hash order
    assert choose_reused(range(10), 10) == list(range(10)) and choose_reused([], 4) == []
    assert reused_count(None, 4, 100) == 4 and reused_count("all", 4, 100) == 100 and reused_count(0, 4, 9) == 0
    with pytest.raises(InputError, match="verify-reused"):
        reused_count("some", 4, 100)
