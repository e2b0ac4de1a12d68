"""Fuzzed replay checkpoints: a correct restore or a CheckpointError naming the checkpoint."""
import io
import json
import pathlib
import shutil
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dask_research import replay
from dask_research.exceptions import ResearchError
from dask_research.testing import corruption

SPEC = {"obs": ((4,), "float32"), "action": ((), "int64"), "reward": ((), "float32")}
CASES = {"count": 0}


# Its tests share a module-scoped fixture: under -n they run on one worker, which builds it once.
pytestmark = pytest.mark.xdist_group("fuzz_replay")


@pytest.fixture(scope="module")
def pristine():
    root = pathlib.Path(tempfile.mkdtemp(prefix="fuzz-replay-"))
    plane = replay.ExperiencePlane(SPEC, capacity=256, sampler=replay.PrioritizedSampler(alpha=0.6, beta=0.4))
    rng = np.random.default_rng(0)
    for _ in range(2):                      # wraps the ring once
        plane.ingest({"obs": rng.random((150, 4), dtype=np.float32), "action": rng.integers(0, 2, 150),
                      "reward": rng.random(150, dtype=np.float32)})
    plane.checkpoint(root / "ckpt")
    plane.close()
    yield root / "ckpt"
    shutil.rmtree(root, ignore_errors=True)


def _pickle_npz(path: pathlib.Path) -> None:
    class Boom:
        def __reduce__(self):
            return (pathlib.Path.write_text, (path.parent / "pwned", "x"))

    buf = io.BytesIO()
    np.savez(buf, obs=np.array([Boom()], dtype=object))
    path.write_bytes(buf.getvalue())


json_values = corruption.json_values()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.sampled_from(["meta.json", "data.npz"]),
       st.sampled_from(["truncate", "bitflip", "replace", "retype", "pickle", "delete"]),
       st.randoms(use_true_random=False), json_values)
def test_fuzzed_replay_checkpoint(pristine, target, how, rnd, value):
    work = pathlib.Path(tempfile.mkdtemp(prefix="fuzz-replay-case-")) / "ckpt"
    try:
        shutil.copytree(pristine, work)
        path = replay.checkpoints.current(work) / target   # the committed version's file
        if how == "retype" and target == "meta.json":
            doc = json.loads(path.read_bytes())
            key = rnd.choice(sorted(doc))
            doc[key] = value
            path.write_text(json.dumps(doc))
        elif how == "pickle":
            _pickle_npz(path.parent / "data.npz")
        else:                                     # truncate, bitflip, replace, delete
            corruption.mutate(path, how, rnd, value)
        try:
            plane = replay.ExperiencePlane.restore(work)
        except ResearchError as e:
            assert "ckpt" in str(e), str(e)
        else:
            assert len(plane) <= plane.capacity
            plane.close()
        assert not (work.parent / "pwned").exists()
        CASES["count"] += 1
    finally:
        shutil.rmtree(work.parent, ignore_errors=True)


def test_fuzz_case_count_is_reported():
    print(f"\nfuzzed replay checkpoint cases: {CASES['count']}")
    assert CASES["count"] == 0 or CASES["count"] >= 200  # 0 when run alone with -k
