"""A run's manifest: what it is built from (the job, its pilot, the versions) and how it is checked.

``manifest.json`` records everything in the job's content address, the pilot's findings and
the frozen histogram range, the versions that computed it and where the pipeline was defined
(so :func:`~dask_research.montecarlo.load_job` can look it up again; never to import it
unasked). The store signs it (:meth:`~.runstore.RunStore.write_manifest`); a run resumed from it
must be the same job, computed by the same engine. A manifest written before content-address
scheme 2 (no ``"address"`` in its job) is compared with the job's scheme-1 description
(:meth:`~dask_research.montecarlo.Job.describe`), so old stores are still checked, not refused.

Examples
--------
>>> from dask_research.montecarlo import Job, Normal, pilot
>>> job = Job(lambda a: a + 1, {"a": Normal(0.0, 1.0)}, shards=2, samples_per_shard=256, seed=1)
>>> manifest = build_manifest(job, pilot(job))
>>> manifest["job"] == job.describe() and manifest["range"] == list(pilot(job).range)
True
>>> from dask_research.montecarlo.store.layout import MANIFEST_FILE
>>> check_manifest(manifest, job, MANIFEST_FILE)
>>> check_manifest({**manifest, "range": [1.0, 0.0]}, job, MANIFEST_FILE)
Traceback (most recent call last):
...
dask_research.exceptions.StoreError: manifest.json: has range [1.0, 0.0]; expected [lo, hi] with finite lo < hi
"""
from __future__ import annotations

import inspect
import math
import platform
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from ..._version import __version__
from ...exceptions import StoreError
from ..address import scheme_of
from ..job import ENGINE

if TYPE_CHECKING:
    from ..job import Job
    from ..pilot import Pilot

__all__ = ["build_manifest", "check_manifest"]


def build_manifest(job: Job, pilot: Pilot) -> dict[str, Any]:
    """The manifest of a new run of ``job`` whose pilot is ``pilot`` (the store adds format, id, checksum)."""
    import dask
    import distributed

    try:
        from numpy._core._multiarray_umath import __cpu_features__ as feats

        features = sorted(k for k, v in feats.items() if v)
    except Exception:  # pragma: no cover - numpy internals moved
        features = []
    return {
        "job": job.describe(),
        "name": job.name,
        "range": list(pilot.range) if pilot.range else None,
        "pilot": pilot.to_dict(),
        "engine": dict(ENGINE),
        "versions": {"dask_research": __version__, "numpy": np.__version__, "dask": dask.__version__,
                     "distributed": distributed.__version__, "python": platform.python_version()},
        "cpu_features": features,
        "origin": _origin(job),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _origin(job: Job) -> dict[str, Any]:
    """Where the pipeline is defined: module, qualified name and file, as they are named here."""
    fn = job.pipeline
    try:
        path = inspect.getsourcefile(fn)
    except TypeError:
        path = None
    return {"module": getattr(fn, "__module__", None), "qualname": getattr(fn, "__qualname__", None),
            "file": path}


def check_manifest(manifest: dict, job: Job, where: str) -> None:
    """Raise :class:`StoreError` (naming ``where``) unless ``manifest`` is one of ``job``'s, by this engine."""
    if manifest["engine"] != ENGINE:
        raise StoreError(where, f"was written by engine {manifest['engine']}; this is {ENGINE}: "
                         "results of different engines are never mixed (use another store)")
    scheme = scheme_of(manifest["job"], where)     # a store written before scheme 2: its own description
    if manifest["job"] != job.describe(scheme):
        raise StoreError(where, "describes a different job than the one with this id (edited or corrupt)")
    rng = manifest["range"]
    if rng is not None and not (isinstance(rng, list) and len(rng) == 2
                                and all(isinstance(v, (int, float)) and math.isfinite(v) for v in rng)
                                and rng[0] < rng[1]):
        raise StoreError(where, f"has range {rng!r}; expected [lo, hi] with finite lo < hi")
