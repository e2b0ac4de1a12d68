"""Checkpoints written by dask-research before the ring/snapshot split (commit 0a13b29) still
restore, with the same contents and the same seeded batches afterwards.

``data/checkpoints_v1`` holds one 16-slot plane per built-in sampler, checkpointed after 23
transitions (the ring wrapped) by the old code; ``expected.json`` is what the old code read back
from them: the stored actions, the counters and the first seeded batch after the restore.
"""
import json
import os
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


# --- checkpoints written before the durable layer ------------------------------------------------
DATA2 = pathlib.Path(__file__).parent / "data" / "checkpoints_v2"
EXPECTED2 = json.loads((DATA2 / "expected.json").read_text())


@pytest.mark.parametrize("name", sorted(EXPECTED2))
def test_checkpoints_of_the_flock_writer_restore_the_same_and_take_new_writes(tmp_path, name, caplog):
    """``data/checkpoints_v2`` (see its HOW-WRITTEN.txt): versioned checkpoints written by the
    code before the durable layer (an empty ``.lock`` left by its flock writer, a rate limiter,
    ``extra``, a shard) and one in the layout before versions. Each restores with the contents,
    counters and first seeded batch that code read back; a new writer then takes the directory
    (no lease there: no take-over, no warning; ``.lock`` stays the lock file) and commits."""
    from dask_research.replay import checkpoints
    from dask_research.replay.cluster.worker_shard import WorkerShard

    want = EXPECTED2[name]
    src = DATA2 / ("shards/shard" if name == "shard" else name)
    ck = shutil.copytree(src, tmp_path / name)
    if want["kind"] == "shard":
        shard = WorkerShard("p", {"obs": ((2,), "float32"), "action": ((), "int64"), "done": ((), "bool")},
                            capacity=16, sampler=PrioritizedSampler(0.6, 0.4), seed=5)
        assert shard.restore(ck) == 16
        plane = shard.plane
    else:
        plane = ExperiencePlane.restore(ck)
    try:
        assert plane.total == want["total"] and plane.contents()["action"].tolist() == want["action"]
        b = plane.sample(6)
        assert b.indices.tolist() == want["keys"]
        if want["weights"] is None:
            assert b.weights is None
        else:
            np.testing.assert_allclose(b.weights, want["weights"], rtol=1e-6)
        with caplog.at_level("WARNING", logger="dask_research.replay.checkpoints"):
            plane.checkpoint(ck)
        assert not [r for r in caplog.records if r.levelname == "WARNING"], caplog.text
        names = sorted(p.name for p in ck.iterdir())
        assert [n for n in names if n not in (checkpoints.LEASE, checkpoints.LOCK)] == [
            "CURRENT", checkpoints.current(ck).name]
        assert json.loads((ck / checkpoints.LEASE).read_text())["pid"] == os.getpid()    # this plane's lease
    finally:
        plane.close()
    again = ExperiencePlane.restore(ck)
    try:
        assert again.contents()["action"].tolist() == want["action"] and again.total == want["total"]
    finally:
        again.close()
