"""The run store: a manifest, accepted shard accumulators as they arrive, and the result.

One module per job: :mod:`.layout` (what the files are called and how documents are signed),
:mod:`.store_files` (reading and writing them through the durability layer,
:mod:`dask_research.durable`, without trusting the store), :mod:`.documents` (what each
document may hold: its schema), :mod:`.run_lease` (one writer per run, a
:class:`~dask_research.durable.Lease`), :mod:`.manifest` (what a run's manifest says),
:mod:`.holdings` (what a store holds of a job, asked once before a run), :mod:`.runstore`
(the :class:`RunStore` that ties them), :mod:`.held_run` (a run whose lease this process holds:
the one way a running run reaches its store) and :mod:`.worker_writes` (the
:class:`StoreTarget` through which block tasks write on the workers).

Examples
--------
>>> import tempfile
>>> from dask_research.montecarlo.store import RunStore
>>> store = RunStore(tempfile.mkdtemp())
>>> store.list_runs()
[]
"""
from .held_run import HeldRun
from .holdings import Holdings
from .layout import MANIFEST_FORMAT, RESULT_FORMAT, SHARDS_FORMAT, StoreWarning, checksum, redact
from .run_lease import Lease
from .runstore import BadRunId, RunStore
from .store_files import Exists, StoreFiles
from .worker_writes import StoreTarget, Unwritable

__all__ = ["RunStore", "BadRunId", "HeldRun", "StoreTarget", "Unwritable", "Lease", "Holdings", "StoreFiles", "Exists", "StoreWarning", "MANIFEST_FORMAT",
           "SHARDS_FORMAT", "RESULT_FORMAT", "checksum", "redact"]
