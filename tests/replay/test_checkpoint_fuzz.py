"""Fuzzed versioned checkpoints: a correct restore or a CheckpointError naming the checkpoint.

The committed version's ``meta.json`` and ``data.npz`` and the ``CURRENT`` pointer are
truncated, bit-flipped, replaced, re-typed, swapped for a pickle or deleted; nothing is ever
unpickled and nothing is read from outside the checkpoint directory.
"""
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
from dask_research.replay import checkpoints
from dask_research.testing import corruption

SPEC = {"obs": ((4,), "float32"), "action": ((), "int64"), "reward": ((), "float32")}


# Its tests share a module-scoped fixture: under -n they run on one worker, which builds it once.
pytestmark = pytest.mark.xdist_group("checkpoint_fuzz")


@pytest.fixture(scope="module")
def pristine():
    root = pathlib.Path(tempfile.mkdtemp(prefix="fuzz-ckpt-"))
    plane = replay.ExperiencePlane(SPEC, capacity=256, sampler=replay.PrioritizedSampler(0.6, 0.4))
    rng = np.random.default_rng(0)
    for _ in range(2):
        plane.ingest({"obs": rng.random((150, 4), dtype=np.float32), "action": rng.integers(0, 2, 150),
                      "reward": rng.random(150, dtype=np.float32)})
    plane.checkpoint(root / "ckpt")
    plane.checkpoint(root / "ckpt")              # a second version: v000002 is current
    plane.close()
    yield root / "ckpt"
    shutil.rmtree(root, ignore_errors=True)


def _pickle_npz(path):
    class Boom:
        def __reduce__(self):
            return (pathlib.Path.write_text, (path.parent / "pwned", "x"))

    buf = io.BytesIO()
    np.savez(buf, obs=np.array([Boom()], dtype=object))
    path.write_bytes(buf.getvalue())


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.sampled_from(["meta.json", "data.npz", "CURRENT"]),
       st.sampled_from(["truncate", "bitflip", "replace", "retype", "pickle", "delete"]),
       st.randoms(use_true_random=False), corruption.json_values())
def test_fuzzed_versioned_checkpoint(pristine, target, how, rnd, value):
    work = pathlib.Path(tempfile.mkdtemp(prefix="fuzz-ckpt-case-")) / "ckpt"
    try:
        shutil.copytree(pristine, work)
        path = work / target if target == "CURRENT" else checkpoints.current(work) / target
        if how == "retype" and target == "meta.json":
            doc = json.loads(path.read_bytes())
            doc[rnd.choice(sorted(doc))] = value
            path.write_text(json.dumps(doc))
        elif how == "pickle":
            _pickle_npz(path.parent / "data.npz" if target == "CURRENT" else checkpoints.current(work) / "data.npz")
        else:                                     # truncate, bitflip, replace, delete
            corruption.mutate(path, how, rnd, value)
        try:
            plane = replay.ExperiencePlane.restore(work)
        except ResearchError as e:
            assert "ckpt" in str(e) and "\n" not in str(e), str(e)
        else:
            assert len(plane) <= plane.capacity
            plane.close()
        assert not (work / "pwned").exists() and not (work.parent / "pwned").exists()
    finally:
        shutil.rmtree(work.parent, ignore_errors=True)
