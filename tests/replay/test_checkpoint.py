"""Checkpoints: .npz without pickle + JSON; a restored plane samples the same contents."""
import json
import threading
import zipfile

import numpy as np
import pytest
from replay_helpers import CARTPOLE, make_batch

from dask_research.exceptions import CheckpointError
from dask_research.replay import (
    DiskTier,
    ExperiencePlane,
    HostTier,
    PrioritizedSampler,
    RecentSampler,
    UniformSampler,
    checkpoints,
)


@pytest.mark.parametrize("sampler", [UniformSampler, lambda: PrioritizedSampler(0.6, 0.4),
                                     lambda: RecentSampler(window=50)])
def test_restored_plane_samples_the_same(tmp_path, sampler):
    plane = ExperiencePlane(CARTPOLE, capacity=300, sampler=sampler(), seed=11)
    for s in range(0, 700, 70):                       # wrapped ring
        plane.ingest(make_batch(70, start=s, seed=s))
    if plane.sampler.prioritized:
        b = plane.sample(100)
        plane.update_priorities(b.indices, np.abs(b.reward) * 3 + 0.01)
    plane.checkpoint(tmp_path / "ck")
    other = ExperiencePlane.restore(tmp_path / "ck")
    assert type(other.sampler) is type(plane.sampler)
    assert (other.total, len(other), other.capacity) == (plane.total, len(plane), plane.capacity)
    a, b = plane.contents(), other.contents()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    for _ in range(5):                                # same generator state, same slots
        x, y = plane.sample(64), other.sample(64)
        np.testing.assert_array_equal(x.indices, y.indices)
        np.testing.assert_array_equal(x.obs, y.obs)
        if plane.sampler.prioritized:
            np.testing.assert_allclose(x.weights, y.weights)


def test_no_pickle_anywhere(tmp_path):
    plane = ExperiencePlane(CARTPOLE, capacity=50, sampler=PrioritizedSampler(), seed=0)
    plane.ingest(make_batch(20))
    plane.checkpoint(tmp_path)
    v = checkpoints.current(tmp_path)
    meta = json.loads((v / "meta.json").read_text())
    assert meta["format"] == "dask-research-replay" and meta["count"] == 20
    with np.load(v / "data.npz", allow_pickle=False) as z:
        assert all(z[k].dtype != object for k in z.files)
    with zipfile.ZipFile(v / "data.npz") as zf:
        assert all(n.endswith(".npy") for n in zf.namelist())


def test_restore_into_tiers_and_a_smaller_plane(tmp_path):
    plane = ExperiencePlane(CARTPOLE, capacity=100, seed=0)
    plane.ingest(make_batch(100))
    plane.checkpoint(tmp_path / "ck")
    tiered = ExperiencePlane.restore(tmp_path / "ck", tiers=[HostTier(30 * 48, bandwidth=1e10),
                                                             DiskTier(tmp_path / "d", 70 * 48,
                                                                      bandwidth=1e9)],
                                     migrate="manual")
    tiered.rebalance()
    np.testing.assert_array_equal(tiered.contents()["action"], np.arange(100))
    tiered.close()
    small = ExperiencePlane(CARTPOLE, capacity=40)
    meta, arrays = plane.snapshot()
    small.load_snapshot(meta, arrays)
    np.testing.assert_array_equal(small.contents()["action"], np.arange(60, 100))


def test_corrupt_and_foreign_checkpoints(tmp_path):
    with pytest.raises(CheckpointError, match="meta.json: is missing"):
        ExperiencePlane.restore(tmp_path)
    (tmp_path / "meta.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        ExperiencePlane.restore(tmp_path)
    (tmp_path / "meta.json").write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(CheckpointError, match="not a dask-research-replay checkpoint"):
        ExperiencePlane.restore(tmp_path)
    plane = ExperiencePlane(CARTPOLE, capacity=10)
    plane.ingest(make_batch(5))
    plane.checkpoint(tmp_path / "ok")
    data = checkpoints.current(tmp_path / "ok") / "data.npz"
    good = data.read_bytes()
    data.write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="v000001/data.npz: does not match its meta.json"):
        ExperiencePlane.restore(tmp_path / "ok")
    meta_file = data.parent / "meta.json"
    doc = json.loads(meta_file.read_text())
    del doc["data"]                       # a version must name its data's digest
    meta_file.write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match="v000001/meta.json: has no 'data' record"):
        ExperiencePlane.restore(tmp_path / "ok")
    legacy = tmp_path / "legacy"          # the layout before versions has no digest: parsed
    legacy.mkdir()
    (legacy / "meta.json").write_text(json.dumps(doc))
    (legacy / "data.npz").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="legacy/data.npz: is unreadable"):
        ExperiencePlane.restore(legacy)
    (legacy / "data.npz").write_bytes(good)
    assert len(ExperiencePlane.restore(legacy)) == 5
    other = ExperiencePlane({"x": ((), "float32")}, capacity=10)
    meta, arrays = plane.snapshot()
    with pytest.raises(CheckpointError, match="differs from the plane's"):
        other.load_snapshot(meta, arrays)


def test_checkpoint_while_ingesting_is_consistent(tmp_path):
    """Ingest keeps running; the checkpoint holds a contiguous run of whole transitions."""
    plane = ExperiencePlane(CARTPOLE, capacity=20_000, seed=0)
    plane.ingest(make_batch(20_000))
    stop = threading.Event()

    def actor():
        s = 20_000
        while not stop.is_set():
            plane.ingest(make_batch(512, start=s, seed=s))
            s += 512

    t = threading.Thread(target=actor)
    t.start()
    try:
        for _ in range(3):
            plane.checkpoint(tmp_path / "ck", chunk=1024)
            restored = ExperiencePlane.restore(tmp_path / "ck")
            keys = restored.contents()["action"]
            assert len(keys) > 0
            np.testing.assert_array_equal(keys, np.arange(keys[0], keys[0] + len(keys)))
            assert keys[-1] == restored.total - 1
            b = restored.sample(256)
            np.testing.assert_array_equal(b.action, b.indices)
    finally:
        stop.set()
        t.join()


def test_restored_partly_filled_prioritized_plane_keeps_its_weights(tmp_path):
    """The empty slots of a restored plane leave the min-tree alone (before the split they
    were loaded as 0 there, so every importance weight of a restored, not yet full prioritized
    plane came out 0)."""
    plane = ExperiencePlane({"x": ((), "int64")}, capacity=10,
                            sampler=PrioritizedSampler(0.6, 0.4), seed=0)
    plane.ingest({"x": np.arange(5)})
    before = plane.sample(4).weights
    plane.checkpoint(tmp_path)
    again = ExperiencePlane.restore(tmp_path)
    try:
        np.testing.assert_array_equal(again.sample(4).weights, before)
        assert again.sampler.min_leaf() == plane.sampler.min_leaf()
    finally:
        plane.close()
        again.close()
