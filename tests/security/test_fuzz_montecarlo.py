"""Fuzzed Monte-Carlo store files: the only outcomes are a correct load or a StoreError naming the file.

Reproducible: the store fuzzed is the same bytes on every run in one environment (the fields a
write stamps with the clock, the pilot's timing and the checkout's path are fixed, and the
documents signed again), and the fuzzer draws the same 300 cases each run (``derandomize``),
so a failure seen once is seen again by rerunning the test. ``--hypothesis-profile=explore``
draws new cases (tests/conftest.py).
"""
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
from dask_research.montecarlo.store import RunStore, checksum, store_files
from dask_research.montecarlo.store.manifest import build_manifest
from dask_research.testing import corruption

#: Cases per run, every one of them run (a deterministic count: no case is skipped or lost).
CASES = 300
TARGETS = ["manifest.json", "shards/000000000000-000000000003.json", "result.json"]
HOWS = ["truncate", "bitflip", "replace", "retype", "retype-signed", "oversize"]


def pipeline(a, b):
    return np.tanh(a * b)


JOB = mc.Job(pipeline, {"a": mc.Normal(1, 0.1), "b": mc.Normal(2, 0.2)}, shards=6, samples_per_shard=64,
             seed=1, bins=8, range=(0.0, 1.0))


def _fix_volatile_fields(run: pathlib.Path) -> None:
    """Give the fields that differ from write to write fixed values, and sign again.

    The manifest's creation time, pilot measurements and the pipeline's source path, and each shard
    file's write time, differ between two writes of the same run; the fuzzer's byte offsets and
    field choices then land elsewhere. Fixed, the store is the same bytes on every run here.
    """
    path = run / "manifest.json"
    doc = json.loads(path.read_bytes())
    doc["created"] = "2026-01-01T00:00:00Z"
    doc["pilot"]["shard_seconds"] = 0.001              # measured: the pilot's time and pickled size
    doc["pilot"]["shard_bytes"] = 4096
    if isinstance(doc.get("origin"), dict) and "file" in doc["origin"]:
        doc["origin"]["file"] = "tests/security/test_fuzz_montecarlo.py"
    doc["checksum"] = checksum({k: v for k, v in doc.items() if k != "checksum"})
    path.write_text(json.dumps(doc, separators=(",", ":")))
    for path in sorted((run / "shards").iterdir()):
        doc = json.loads(path.read_bytes())
        doc["written"] = 1767225600.0            # the states, which the checksum signs, are unchanged
        path.write_text(json.dumps(doc, separators=(",", ":")))


# Its tests share a module-scoped fixture: under -n they run on one worker, which builds it once.
pytestmark = pytest.mark.xdist_group("fuzz_montecarlo")


@pytest.fixture(scope="module")
def pristine():
    """A complete, valid store written through the public store API (no cluster needed), the
    same bytes on every run (see :func:`_fix_volatile_fields`)."""
    root = pathlib.Path(tempfile.mkdtemp(prefix="fuzz-mc-"))
    rs = RunStore(str(root))
    rs.write_manifest(JOB.id, build_manifest(JOB, mc.pilot(JOB)))
    states = {s: mc.compute_shard(JOB, s) for s in range(6)}
    rs.write_shards(JOB.id, {s: states[s] for s in range(3)}, "tcp://w1")
    rs.write_shards(JOB.id, {s: states[s] for s in range(3, 6)}, "tcp://w2")
    rs.write_result(JOB.id, {"mean": 0.5, "stderr": 0.01, "sd": 0.1, "n": 384})
    _fix_volatile_fields(root / "runs" / JOB.id)
    assert sorted(RunStore(str(root)).read_shards(JOB.id)) == list(range(6))     # still whole and valid
    assert mc.replay(JOB.id, 4, str(root), job=JOB).match
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _digest(root: pathlib.Path) -> str:
    import hashlib

    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


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
    target = draw(st.sampled_from(TARGETS))
    how = draw(st.sampled_from(HOWS))
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


def _one_case(pristine: pathlib.Path, mutation) -> None:
    target, how, rnd, value = mutation
    work = pathlib.Path(tempfile.mkdtemp(prefix="fuzz-case-"))
    try:
        shutil.copytree(pristine, work, dirs_exist_ok=True)
        path = work / "runs" / JOB.id / target
        with pytest.MonkeyPatch.context() as m:
            _apply(path, how, rnd, value, m)
            rs = RunStore(str(work))
            for load in (lambda: rs.holdings(JOB), lambda: mc.show(JOB.id[:8], str(work)),
                         lambda: mc.replay(JOB.id, 4, str(work), job=JOB)):
                try:
                    load()
                except ResearchError as e:
                    assert target.split("/")[-1] in str(e) or JOB.id in str(e), (how, str(e))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _fuzz(pristine: pathlib.Path) -> list[tuple[str, str]]:
    """Run the fuzzer once over ``pristine``; the (target, how) of every case run, in order."""
    ran: list[tuple[str, str]] = []

    @settings(max_examples=CASES, derandomize=True, database=None, deadline=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(mutations())
    def case(mutation):
        _one_case(pristine, mutation)
        ran.append(mutation[:2])

    case()
    return ran


@pytest.mark.filterwarnings("ignore:.*disagrees with the stored shards")   # a mutated result.json
def test_fuzzed_store_files(pristine):
    ran = _fuzz(pristine)
    print(f"\nfuzzed Monte-Carlo store cases: {len(ran)}")
    assert len(ran) == CASES                              # every case ran, none was lost
    assert {t for t, _ in ran} == set(TARGETS) and {h for _, h in ran} == set(HOWS)


def test_the_fuzzer_draws_the_same_cases_on_the_same_store(pristine, tmp_path):
    """The same store bytes however often it is written; the same cases however often it is fuzzed."""
    again = tmp_path / "again"
    rs = RunStore(str(again))
    rs.write_manifest(JOB.id, build_manifest(JOB, mc.pilot(JOB)))
    states = {s: mc.compute_shard(JOB, s) for s in range(6)}
    rs.write_shards(JOB.id, {s: states[s] for s in range(3)}, "tcp://w1")
    rs.write_shards(JOB.id, {s: states[s] for s in range(3, 6)}, "tcp://w2")
    rs.write_result(JOB.id, {"mean": 0.5, "stderr": 0.01, "sd": 0.1, "n": 384})
    _fix_volatile_fields(again / "runs" / JOB.id)
    assert _digest(again) == _digest(pristine)
    drawn = []

    @settings(max_examples=40, derandomize=True, database=None, deadline=None)
    @given(mutations())
    def draw(mutation):
        target, how, rnd, value = mutation
        drawn.append((target, how, rnd.random(), repr(value)))

    draw()
    first, drawn[:] = list(drawn), []
    draw()
    assert drawn == first and len(first) == 40


def test_every_fuzzer_of_the_suite_draws_derandomized_examples():
    """tests/conftest.py loads the ``suite`` profile: no property or fuzz test depends on luck."""
    if settings.get_current_profile_name() == "explore":
        pytest.skip("--hypothesis-profile=explore draws new examples on purpose")
    assert settings.default.derandomize is True and settings.default.database is None
