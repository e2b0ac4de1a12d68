"""Fuzzed experiment journals: a correct resume or a CheckpointError naming the journal."""
import json
import pathlib
import random
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dask_research.exceptions import ResearchError
from dask_research.experiments import Hypothesis, IterationScheduler, make_deterministic_runner
from dask_research.testing import corruption

CASES = {"count": 0}
RUNNER = make_deterministic_runner({"a": 0.9, "b": 0.4, "c": 0.1}, delay_ms=0)


# Its tests share a module-scoped fixture: under -n they run on one worker, which builds it once.
pytestmark = pytest.mark.xdist_group("fuzz_experiments")


@pytest.fixture(scope="module")
def pristine():
    root = pathlib.Path(tempfile.mkdtemp(prefix="fuzz-exp-"))
    path = root / "loop.jsonl"
    sched = IterationScheduler(RUNNER, slots=2, checkpoint=str(path), progress=False, max_experiments=8)
    sched.add([Hypothesis(f"{b}{k}", b, payload={"k": k, "tag": b}) for k in range(5) for b in "abc"])
    sched.run()
    yield path
    shutil.rmtree(root, ignore_errors=True)


json_values = corruption.json_values()


def _mutate(raw: bytes, how: str, rnd: random.Random, value) -> bytes:
    lines = raw.decode().splitlines()
    if how == "truncate":
        return corruption.truncate(raw, rnd)
    if how == "bitflip":
        return corruption.flip_bit(raw, rnd)
    if how == "replace-line":
        lines[rnd.randrange(len(lines))] = json.dumps(value)
    elif how == "retype":
        i = rnd.randrange(len(lines))
        doc = json.loads(lines[i])
        key = rnd.choice(sorted(doc)) if isinstance(doc, dict) and doc else None
        if key is not None:
            doc[key] = value
        lines[i] = json.dumps(doc)
    elif how == "pickle":
        import pickle

        return pickle.dumps({"kind": "hyps"})
    elif how == "duplicate-line":
        i = rnd.randrange(len(lines))
        lines.insert(i, lines[i])
    return ("\n".join(lines) + "\n").encode()


@pytest.mark.slow
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.sampled_from(["truncate", "bitflip", "replace-line", "retype", "pickle", "duplicate-line"]),
       st.randoms(use_true_random=False), json_values)
def test_fuzzed_journal(pristine, how, rnd, value):
    work = pathlib.Path(tempfile.mkdtemp(prefix="fuzz-exp-case-"))
    try:
        path = work / "loop.jsonl"
        path.write_bytes(_mutate(pristine.read_bytes(), how, rnd, value))
        try:
            sched = IterationScheduler.resume(str(path), RUNNER, progress=False)
            report = sched.run()
        except ResearchError as e:
            assert "loop.jsonl" in str(e) or "hypothes" in str(e), str(e)
        else:
            assert report.total_runs >= 0 and report.stop_reason
        CASES["count"] += 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_fuzz_case_count_is_reported():
    print(f"\nfuzzed experiment journal cases: {CASES['count']}")
    assert CASES["count"] == 0 or CASES["count"] >= 200  # 0 when run alone with -k
