"""GPU paths: DeviceStorage on a CUDA device, DeviceTier placement, CuPy and torch-CUDA delivery.
Skipped cleanly without CuPy or a device; the same logic runs on CPU in test_storages.py
(``xp`` fixture) and test_delivery.py."""
import numpy as np
import pytest

cupy = pytest.importorskip("cupy")
try:
    cupy.cuda.runtime.getDeviceCount()
except Exception:  # pragma: no cover
    pytest.skip("CuPy finds no CUDA device", allow_module_level=True)

from replay_helpers import CARTPOLE, make_batch  # noqa: E402

from dask_research.replay import DeviceTier, ExperiencePlane, HostTier  # noqa: E402


@pytest.fixture
def plane():
    p = ExperiencePlane(CARTPOLE, tiers=[DeviceTier("4KiB"), HostTier("64KiB", bandwidth=1.0)],
                        migrate="manual", seed=0)
    p.ingest(make_batch(500))
    p.rebalance()
    yield p
    p.close()


def test_device_tier_holds_the_newest(plane):
    assert plane.storage.tiers[0].name == "device"
    slots, keys = plane.ring.stored()
    on_dev = keys[plane.storage.tier_of[slots] == 0]
    assert set(on_dev.tolist()) == set(range(500 - plane.storage.storages[0].rows, 500))


def test_cupy_delivery(plane):
    with plane.batches(batch_size=64, prefetch=2, to="cupy", device="cuda:0", max_batches=5) as it:
        for b in it:
            assert isinstance(b.obs, cupy.ndarray)
            np.testing.assert_array_equal(b.action.get(), b.indices)


def test_torch_cuda_delivery(plane):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    with plane.batches(batch_size=64, prefetch=2, to="torch", device="cuda", max_batches=5) as it:
        for b in it:
            assert b.obs.is_cuda and b.obs.dtype == torch.float32
            np.testing.assert_array_equal(b.action.cpu().numpy(), b.indices)


@pytest.mark.parametrize("to", ["cupy", "torch"])
def test_device_resident_plane_gathers_on_the_gpu(to):
    if to == "torch":
        torch = pytest.importorskip("torch")
        if not torch.cuda.is_available():
            pytest.skip("torch without CUDA")
    plane = ExperiencePlane(CARTPOLE, tiers=[DeviceTier("1MiB")], migrate="manual", seed=0)
    plane.ingest(make_batch(1000))
    with plane.batches(batch_size=64, prefetch=2, to=to, device="cuda:0", max_batches=4) as it:
        for b in it:
            action = b.action.get() if to == "cupy" else b.action.cpu().numpy()
            np.testing.assert_array_equal(action, b.indices)
            assert b.info["gather"] > 0
    plane.close()
