"""Fixtures for the replay tests: the CartPole spec and an ``xp`` array module."""
import numpy as np
import pytest
from replay_helpers import CARTPOLE


@pytest.fixture
def cartpole():
    return dict(CARTPOLE)


@pytest.fixture(params=["numpy", "cupy"])
def xp(request):
    """Array module for DeviceStorage: numpy everywhere, CuPy where a GPU exists."""
    if request.param == "numpy":
        return np
    cupy = pytest.importorskip("cupy")
    try:
        cupy.cuda.runtime.getDeviceCount()
    except Exception:  # pragma: no cover - CuPy without a device
        pytest.skip("CuPy finds no CUDA device")
    return cupy
