"""A store never chooses the code that runs: replay, replay_many, load_job and the CLI.

Each test runs the reader in a real ``python`` subprocess in a fresh working directory, so
nothing the test process imported can help it, and a planted file would be found the way the
old code found it (under the working directory, importable from ``sys.path[0]``).
"""
import json
import pathlib
import subprocess
import sys

import pytest

from dask_research import montecarlo as mc
from dask_research.montecarlo.store import checksum
from dask_research.testing.processes import run_python, subprocess_env

JOB_SOURCE = '''
import numpy as np
from dask_research import montecarlo as mc


def sat(a, b, c):
    return np.tanh(a * b / (c + 1))


job = mc.Job(sat, {"a": mc.Normal(1.0, 0.1), "b": mc.Normal(2.0, 0.3), "c": mc.Normal(0.5, 0.05)},
             shards=8, samples_per_shard=512, seed=9, bins=16, name="trusted")
'''

HOSTILE = '''import pathlib
pathlib.Path({marker!r}).write_text("the store chose the code that runs")
def sat(a, b, c):
    return a
'''


def _cli(cwd, *args, timeout=120):
    return subprocess.run([sys.executable, "-m", "dask_research.cli", *args], cwd=cwd, env=subprocess_env(),
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def stored(tmp_path):
    """A real run of a job loaded from a file, in a store; returns (job file, store, run id)."""
    from distributed import Client, LocalCluster

    from dask_research.cli import load_object

    path = tmp_path / "trusted_job.py"
    path.write_text(JOB_SOURCE)
    job = load_object(f"{path}:job")
    store = tmp_path / "store"
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cl, \
            Client(cl, set_as_default=False) as c:
        mc.run(job, client=c, store=str(store), progress=False, verify=0)
    return path, store, job.id


def _plant(store: pathlib.Path, run_id: str, origin: dict) -> None:
    mpath = store / "runs" / run_id / "manifest.json"
    doc = json.loads(mpath.read_text())
    doc["origin"] = origin
    doc["checksum"] = checksum({k: v for k, v in doc.items() if k != "checksum"})
    mpath.write_text(json.dumps(doc))


@pytest.mark.slow
@pytest.mark.timeout(240, method="thread")
@pytest.mark.parametrize("module", [None, "evil"])
def test_a_hostile_manifest_never_runs_its_file(tmp_path, stored, module):
    """The old code exec'd (module None) or imported (module 'evil') a file under the cwd."""
    _, store, rid = stored
    cwd = tmp_path / "project"
    cwd.mkdir()
    marker = tmp_path / "MARKER"
    (cwd / "evil.py").write_text(HOSTILE.format(marker=str(marker)))
    _plant(store, rid, {"module": module, "qualname": "sat", "file": str(cwd / "evil.py")})
    out = run_python(f"""
        from dask_research import montecarlo as mc
        from dask_research.exceptions import StoreError
        for call in (lambda: mc.replay({rid!r}, 2, {str(store)!r}),
                     lambda: mc.replay_many({rid!r}, {str(store)!r}, k=2),
                     lambda: mc.load_job({rid!r}, {str(store)!r})):
            try:
                call()
            except StoreError as e:
                print("REFUSED", e)
            else:
                print("ACCEPTED")
        """, cwd)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 3 and all(line.startswith("REFUSED") for line in lines), out.stdout
    assert "job=" in lines[0] and "--job FILE:JOB" in lines[0] and "--trust-origin" in lines[0]
    assert not marker.exists()
    for cmd in (["mc", "replay", rid, "--shard", "2", "--store", str(store)],
                ["mc", "verify", rid, "--store", str(store)]):
        res = _cli(cwd, *cmd)
        assert res.returncode == 2 and "--trust-origin" in res.stdout + res.stderr, (res.stdout, res.stderr)
        assert "Traceback" not in res.stdout + res.stderr
        assert not marker.exists()


@pytest.mark.slow
@pytest.mark.timeout(240, method="thread")
def test_the_pipeline_comes_from_the_caller(tmp_path, stored):
    """job=/--job, a job this process built, or trust_origin=True; the id is checked in each."""
    path, store, rid = stored
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    out = run_python(f"""
        import importlib.util, sys
        from dask_research import montecarlo as mc
        from dask_research.exceptions import StoreError
        try:
            mc.replay({rid!r}, 1, {str(store)!r})
        except StoreError as e:
            print("not imported:", "not the pipeline of any job built in this process" in str(e))
        # The caller imports the file under a name of its own: its job is built, so its pipeline is found.
        spec = importlib.util.spec_from_file_location("mine", {str(path)!r})
        m = importlib.util.module_from_spec(spec); sys.modules["mine"] = m; spec.loader.exec_module(m)
        print("imported:", mc.replay({rid!r}, 1, {str(store)!r}).match)
        print("job=:", mc.replay({rid!r}, 3, {str(store)!r}, job=m.job).match)
        """, cwd)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["not", "imported:", "True", "imported:", "True", "job=:", "True"], out.stdout
    out = run_python(f"""
        from dask_research import montecarlo as mc
        print("trusted:", mc.replay({rid!r}, 1, {str(store)!r}, trust_origin=True).match)
        """, cwd)
    assert out.returncode == 0 and out.stdout.split() == ["trusted:", "True"], out.stderr
    res = _cli(cwd, "mc", "replay", rid, "--shard", "4", "--store", str(store), "--job", f"{path}:job")
    assert res.returncode == 0 and "identical" in res.stdout, (res.stdout, res.stderr)
    # Trusted, but the file changed since the run: refused by the content address.
    path.write_text(JOB_SOURCE.replace("np.tanh(a * b", "np.tanh(a * b * 1.0"))
    out = run_python(f"""
        from dask_research import montecarlo as mc
        mc.replay({rid!r}, 1, {str(store)!r}, trust_origin=True)
        """, cwd)
    assert out.returncode == 1 and "is not the one that ran" in out.stderr


SCRIPT = '''
import sys
import numpy as np
from dask_research import montecarlo as mc


def ratio(a, b, c):
    return a * b / (c + 1)


job = mc.Job(ratio, inputs={"a": mc.Normal(1.0, 0.1), "b": mc.LogNormal(0.7, 0.15), "c": mc.Uniform(0.4, 0.6)},
             shards=8, samples_per_shard=1024, seed=2026)
if sys.argv[1] == "run":
    result = mc.run(job, store="runs/", progress=False, verify=0)
    print("RUN", result.run_id)
    print(mc.replay(result.run_id, shard=5, store="runs/").match)
else:   # a later process: its own __main__ defines the pipeline; no job= given, and no run done here
    rid = sys.argv[2]
    del job
    print(mc.replay(rid, shard=6, store="runs/").match)
'''


@pytest.mark.slow
@pytest.mark.timeout(300, method="thread")
def test_a_main_script_is_never_run_again(tmp_path):
    """Replaying a job defined in a __main__ script: the old code re-ran the script (RecursionError)."""
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    res = subprocess.run([sys.executable, str(script), "run"], cwd=tmp_path, env=subprocess_env(), capture_output=True,
                         text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.split()
    assert lines.count("RUN") == 1 and lines[-1] == "True", res.stdout
    rid = lines[lines.index("RUN") + 1]
    other = tmp_path / "later.py"
    other.write_text(SCRIPT)
    res = subprocess.run([sys.executable, str(other), "replay", rid], cwd=tmp_path, env=subprocess_env(),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.split() == ["True"], (res.stdout, res.stderr[-3000:])
