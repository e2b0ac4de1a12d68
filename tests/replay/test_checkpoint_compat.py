"""Checkpoints written by dask-research before the ring/snapshot split (commit 0a13b29) still
restore, with the same contents and the same seeded batches afterwards.

``data/checkpoints_v1`` holds one 16-slot plane per built-in sampler, checkpointed after 23
transitions (the ring wrapped) by the old code; ``expected.json`` is what the old code read back
from them: the stored actions, the counters and the first seeded batch after the restore.
"""
import json
import pathlib
import shutil

import numpy as np
import pytest

from dask_research.replay import ExperiencePlane, PrioritizedSampler, RecentSampler, UniformSampler

DATA = pathlib.Path(__file__).parent / "data" / "checkpoints_v1"
EXPECTED = json.loads((DATA / "expected.json").read_text())
CLASSES = {"prioritized": PrioritizedSampler, "uniform": UniformSampler, "recent": RecentSampler}


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_old_checkpoint_restores_with_the_same_seeded_batches(tmp_path, name):
    ck = shutil.copytree(DATA / name, tmp_path / name)
    want = EXPECTED[name]
    plane = ExperiencePlane.restore(ck)
    try:
        assert type(plane.sampler) is CLASSES[name]
        assert plane.total == want["total"] and len(plane) == 16
        assert plane.contents()["action"].tolist() == want["action"]
        b = plane.sample(6)
        assert b.indices.tolist() == want["keys"]
        np.testing.assert_array_equal(b.action, b.indices)
        if want["weights"] is None:
            assert b.weights is None
        else:
            np.testing.assert_allclose(b.weights, want["weights"], rtol=1e-6)
    finally:
        plane.close()
