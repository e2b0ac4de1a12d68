"""Where a shard may run: the job's ``device``, Dask resources, and the array namespace.

Workers with a GPU advertise it as a Dask resource (``dask worker ... --resources GPU=1``).
A job says where its shards may run:

``"cpu"`` (default)
    today's path: numpy ``Generator`` draws, bit-identical results, tolerance class ``exact``;
    any worker.
``"gpu"``
    the portable algorithm (:mod:`.draws`) on a CUDA device; tasks ask for one unit of the
    ``GPU`` resource, so only GPU workers take them. Verification re-runs shards on CPU with
    ``xp=numpy`` and compares within :data:`~.tolerance.GPU_TOLERANCE`.
``"any"``
    the portable algorithm wherever the task lands: CuPy when the worker has a usable CUDA
    device, NumPy otherwise. Same content address and tolerance class as ``"gpu"``.

Examples
--------
>>> from dask_research import montecarlo as mc
>>> job = mc.Job(lambda a: a, {"a": mc.Normal(0, 1)}, shards=2, samples_per_shard=4, device="gpu")
>>> is_portable(job), submit_kwargs(job)
(True, {'resources': {'GPU': 1}})
>>> select_xp(job, prefer="cpu").__name__             # verification re-runs on NumPy
'numpy'
>>> check_device("tpu")
Traceback (most recent call last):
    ...
dask_research.exceptions.InputError: ...
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ...exceptions import InputError, ResearchError

__all__ = ["DEVICES", "GPU_RESOURCE", "check_device", "is_portable", "submit_kwargs", "select_xp",
           "device_of_description"]

#: Accepted values of ``Job(device=...)``.
DEVICES = ("cpu", "gpu", "any")
#: The Dask resource a GPU worker advertises (``--resources GPU=1``).
GPU_RESOURCE = "GPU"


def check_device(device: Any) -> str:
    """Return ``device`` or raise :class:`InputError` naming the valid values."""
    if device not in DEVICES:
        raise InputError("device", device, "one of 'cpu', 'gpu', 'any'", where="Job")
    return device


def is_portable(job) -> bool:
    """Whether ``job`` uses the portable (device) draw algorithm."""
    return getattr(job, "device", "cpu") != "cpu"


def submit_kwargs(job) -> dict[str, Any]:
    """Extra ``client.submit`` keyword arguments for a shard task of ``job``.

    ``{"resources": {"GPU": 1}}`` for ``device="gpu"``, ``{}`` otherwise. Verification
    re-runs are CPU work and must *not* use these.
    """
    if getattr(job, "device", "cpu") == "gpu":
        return {"resources": {GPU_RESOURCE: 1}}
    return {}


def select_xp(job, prefer: str | None = None) -> Any:
    """The array namespace a shard task of ``job`` computes with on this process.

    ``prefer="cpu"`` forces NumPy (verification re-runs); otherwise ``"gpu"`` jobs need CuPy
    and a CUDA device (:class:`ResearchError` if missing: the worker advertised a GPU it
    cannot use), ``"any"`` jobs use CuPy if usable, and ``"cpu"`` jobs use NumPy.
    """
    device = getattr(job, "device", "cpu")
    if prefer == "cpu" or device == "cpu":
        return np
    from .kernel import cupy_or_none

    cp = cupy_or_none()
    if cp is not None:
        return cp
    if device == "gpu":
        raise ResearchError("job device='gpu' but this worker has no usable CuPy/CUDA device; "
                            "start GPU workers with --resources GPU=1 only where "
                            "`python -c 'import cupy; cupy.cuda.runtime.getDeviceCount()'` works")
    return np


def device_of_description(description: dict) -> str:
    """The ``device=`` that rebuilds a job from its :meth:`Job.describe` (e.g. a manifest).

    ``"any"`` when the address records the portable draws (``"gpu"`` and ``"any"`` have the
    same address; a replay runs wherever it can), ``"cpu"`` otherwise.
    """
    return "any" if "draws" in description else "cpu"
