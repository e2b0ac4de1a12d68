"""``batches(to="tensordict")`` on both planes: TensorDicts out, the same batches as ``to="torch"``."""
import sys

import numpy as np
import pytest

from dask_research import replay
from dask_research.exceptions import InputError

torch = pytest.importorskip("torch")
tensordict = pytest.importorskip("tensordict")

SPEC = {"obs": ((3,), "float32"), "action": ((), "int64"), "reward": ((), "float32"), "done": ((), "bool")}


def _fill(plane, n=64):
    rng = np.random.default_rng(0)
    plane.ingest({"obs": rng.normal(size=(n, 3)).astype("float32"), "action": rng.integers(0, 4, n),
                  "reward": rng.normal(size=n).astype("float32"), "done": rng.random(n) < 0.1})


@pytest.mark.parametrize("prefetch", [0, 2])
def test_the_local_plane_delivers_tensordicts_equal_to_its_torch_batches(prefetch):
    a = replay.ExperiencePlane(SPEC, capacity=128, seed=7)
    b = replay.ExperiencePlane(SPEC, capacity=128, seed=7)
    _fill(a), _fill(b)
    with a.batches(batch_size=16, prefetch=prefetch, to="tensordict", max_batches=3) as tds, \
            b.batches(batch_size=16, prefetch=prefetch, to="torch", max_batches=3) as ts:
        pairs = list(zip(tds, ts))
    assert len(pairs) == 3
    for td, batch in pairs:
        assert isinstance(td, tensordict.TensorDict) and tuple(td.batch_size) == (16,)
        for name in SPEC:
            assert torch.equal(td[name], batch[name]) and td[name].dtype == batch[name].dtype
        assert torch.equal(td["index"], torch.as_tensor(np.asarray(batch.indices, dtype=np.int64)))
    a.close(), b.close()


def test_without_tensordict_the_output_is_refused_in_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensordict", None)       # import tensordict -> ImportError
    monkeypatch.delitem(sys.modules, "dask_research.replay.integrations.tensordict", raising=False)
    plane = replay.ExperiencePlane(SPEC, capacity=16, seed=0)
    _fill(plane, 8)
    with pytest.raises(InputError, match=r"to='tensordict' is invalid; .*pip install tensordict"):
        plane.batches(batch_size=4, to="tensordict")
    plane.close()


@pytest.mark.timeout(120, method="thread")
def test_the_cluster_plane_delivers_tensordicts():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cl, \
            Client(cl, set_as_default=False) as client:
        plane = replay.ClusterPlane(SPEC, client=client, capacity_per_worker=64, seed=3)
        try:
            _fill(plane, 64)
            with plane.batches(batch_size=8, to="tensordict", max_batches=2) as it:
                tds = list(it)
            assert len(tds) == 2
            for td in tds:
                assert tuple(td.batch_size) == (8,) and td["obs"].shape == (8, 3)
                assert td["index"].dtype == torch.int64
        finally:
            plane.close()
