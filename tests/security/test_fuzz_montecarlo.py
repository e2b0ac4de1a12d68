"""Fuzzed Monte-Carlo store files: the only outcomes are a correct load or a StoreError naming the file."""
import json
import pathlib
import random
import shutil
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dask_research import montecarlo as mc
from dask_research.exceptions import ResearchError
from dask_research.montecarlo.store import RunStore, checksum
from dask_research.montecarlo.store import files as store_files
from dask_research.montecarlo.store.manifest import build_manifest
from dask_research.testing import corruption

CASES = {"count": 0}


def pipeline(a, b):
    return np.tanh(a * b)


JOB = mc.Job(pipeline, {"a": mc.Normal(1, 0.1), "b": mc.Normal(2, 0.2)}, shards=6, samples_per_shard=64,
             seed=1, bins=8, range=(0.0, 1.0))


@pytest.fixture(scope="module")
def pristine():
    """A complete, valid store written through the public store API (no cluster needed)."""
    root = pathlib.Path(tempfile.mkdtemp(prefix="fuzz-mc-"))
    rs = RunStore(str(root))
    rs.write_manifest(JOB.id, build_manifest(JOB, mc.pilot(JOB)))
    states = {s: mc.compute_shard(JOB, s) for s in range(6)}
    rs.write_shards(JOB.id, {s: states[s] for s in range(3)}, "tcp://w1")
    rs.write_shards(JOB.id, {s: states[s] for s in range(3, 6)}, "tcp://w2")
    rs.write_result(JOB.id, {"mean": 0.5, "stderr": 0.01, "sd": 0.1, "n": 384})
    yield root
    shutil.rmtree(root, ignore_errors=True)


json_values = corruption.json_values(max_int=2**70, allow_nan=False, max_text=20, max_size=4,
                                     max_key=8, max_leaves=12)


def _paths(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, prefix + (i,))


def _set(doc, path, value):
    if not path:
        return value
    node = doc
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    return doc


@st.composite
def mutations(draw):
    target = draw(st.sampled_from(["manifest.json", "shards/000000000000-000000000003.json", "result.json"]))
    how = draw(st.sampled_from(["truncate", "bitflip", "replace", "retype", "retype-signed", "oversize"]))
    return target, how, draw(st.randoms(use_true_random=False)), draw(json_values)


def _apply(path: pathlib.Path, how: str, rnd: random.Random, value, monkeypatch) -> None:
    if corruption.mutate(path, how, rnd, value):        # truncate, bitflip, replace
        return
    raw = path.read_bytes()
    if how in ("retype", "retype-signed"):
        doc = json.loads(raw)
        paths = [p for p in _paths(doc) if p and p[0] != "checksum"]
        doc = _set(doc, rnd.choice(paths), value)
        if how == "retype-signed" and isinstance(doc, dict):  # an attacker who recomputes checksums
            if "states" in doc:
                doc["checksum"] = checksum(doc["states"]) if isinstance(doc["states"], dict) else "x"
            else:
                doc["checksum"] = checksum({k: v for k, v in doc.items() if k != "checksum"})
        path.write_text(json.dumps(doc))
    elif how == "oversize":
        monkeypatch.setattr(store_files, "MAX_FILE_BYTES", len(raw) // 2)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutations())
def test_fuzzed_store_files(pristine, monkeypatch, mutation):
    target, how, rnd, value = mutation
    work = pathlib.Path(tempfile.mkdtemp(prefix="fuzz-case-"))
    try:
        shutil.copytree(pristine, work, dirs_exist_ok=True)
        path = work / "runs" / JOB.id / target
        with monkeypatch.context() as m:
            _apply(path, how, rnd, value, m)
            rs = RunStore(str(work))
            for load in (lambda: rs.holdings(JOB), lambda: mc.show(JOB.id[:8], str(work)),
                         lambda: mc.replay(JOB.id, 4, str(work), job=JOB)):
                try:
                    load()
                except ResearchError as e:
                    assert target.split("/")[-1] in str(e) or JOB.id in str(e), (how, str(e))
        CASES["count"] += 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_fuzz_case_count_is_reported():
    print(f"\nfuzzed Monte-Carlo store cases: {CASES['count']}")
    assert CASES["count"] >= 300 or CASES["count"] == 0  # 0 when run alone with -k
