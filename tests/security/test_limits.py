"""Work that cannot fit is refused up front, with the figure it would need."""
import numpy as np
import pytest

from dask_research import replay
from dask_research.exceptions import CapacityError


def test_a_plane_larger_than_memory_is_refused_before_allocating():
    with pytest.raises(CapacityError, match=r"a host tier of 1,000,000,000,000 transitions needs 8,000,000,000,000 bytes"):
        replay.ExperiencePlane({"x": ((2,), "float32")}, capacity=10**12)


def test_a_batch_larger_than_the_plane_is_refused_and_nothing_is_written():
    plane = replay.ExperiencePlane({"x": ((2,), "float32")}, capacity=100)
    plane.ingest({"x": np.zeros((10, 2), np.float32)})
    with pytest.raises(CapacityError, match=r"a batch of 150 transitions .* needs 1,200 bytes but only 800"):
        plane.ingest({"x": np.ones((150, 2), np.float32)})
    assert len(plane) == 10 and plane.stats()["inserted"] == 10
    assert (plane.contents()["x"] == 0).all()


def test_a_hypothesis_batch_beyond_the_declared_memory_is_refused():
    import dask

    from dask_research.experiments import Hypothesis, IterationScheduler, make_deterministic_runner

    sched = IterationScheduler(make_deterministic_runner({"a": 0.5}, delay_ms=0), progress=False)
    big = [Hypothesis(f"h{i}", "a", payload={"w": np.zeros(10_000)}) for i in range(20)]
    with dask.config.set({"research.experiments.max-batch-bytes": "1MiB"}):
        with pytest.raises(CapacityError, match=r"queueing 20 hypotheses .* needs 1,6\d\d,\d{3} bytes but only 1,048,576"):
            sched.add(big)
        sched.add(big[:5])                       # a smaller batch fits
    assert sched.ledger.ids == {f"h{i}" for i in range(5)} and sched.ledger.total_queued == 5


def test_a_shard_too_large_for_any_store_file_is_refused_with_its_size_and_nothing_is_written(tmp_path, monkeypatch):
    from dask_research import montecarlo as mc
    from dask_research.exceptions import StoreError
    from dask_research.montecarlo.store import store_files

    job = mc.Job(lambda a: a, {"a": mc.Normal(0.0, 1.0)}, shards=2, samples_per_shard=64, seed=1, bins=4096,
                 range=(-5.0, 5.0))
    state = mc.compute_shard(job, 0)
    monkeypatch.setattr(store_files, "MAX_FILE_BYTES", 4096)        # what the readers accept, here
    store = mc.RunStore(str(tmp_path))
    with pytest.raises(StoreError, match=r"shard 0's accumulator alone makes a [\d,]+-byte shard file, more than "
                                         r"the 4,096 the store's readers accept; use fewer bins"):
        store.write_shards(job.id, {0: state}, "w")
    assert not (tmp_path / "runs").exists()
