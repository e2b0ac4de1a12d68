"""Batch-system clusters through dask-jobqueue, by name (``slurm``, ``pbs``, ...).

The command line's ``--cluster NAME --jobs N`` comes here. dask-jobqueue reads its own
configuration (``jobqueue.<name>.*`` in ``~/.config/dask/jobqueue.yaml`` or the environment,
e.g. ``DASK_JOBQUEUE__SLURM__QUEUE``); the keyword arguments given here (the command line's
``--queue``, ``--cores``, ``--memory``, ``--walltime``, ``--account``) override it.

Examples
--------
>>> sorted(JOBQUEUE_CLUSTERS)
['htcondor', 'lsf', 'moab', 'oar', 'pbs', 'sge', 'slurm']
>>> with jobqueue_client("slurm", jobs=2, cores=1, memory="2GB") as client:   # doctest: +SKIP
...     mc.run(job, client=client)
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from .exceptions import InputError, ResearchError

__all__ = ["JOBQUEUE_CLUSTERS", "jobqueue_cluster_class", "jobqueue_client"]

#: dask-jobqueue's cluster classes by the name of their configuration section.
JOBQUEUE_CLUSTERS = {
    "slurm": "SLURMCluster",
    "pbs": "PBSCluster",
    "sge": "SGECluster",
    "lsf": "LSFCluster",
    "htcondor": "HTCondorCluster",
    "moab": "MoabCluster",
    "oar": "OARCluster",
}


def jobqueue_cluster_class(name: str) -> type:
    """The dask-jobqueue class for ``name`` (case-insensitive), e.g. ``SLURMCluster`` for ``slurm``."""
    key = str(name).lower()
    if key not in JOBQUEUE_CLUSTERS:
        raise InputError("cluster", name, f"one of {', '.join(sorted(JOBQUEUE_CLUSTERS))} (dask-jobqueue)")
    try:
        import dask_jobqueue
    except ImportError:
        raise ResearchError(f"--cluster {key} needs dask-jobqueue: pip install 'dask-research[hpc]'") from None
    return getattr(dask_jobqueue, JOBQUEUE_CLUSTERS[key])


@contextlib.contextmanager
def jobqueue_client(name: str, jobs: int, **options: Any) -> Iterator:
    """Start a dask-jobqueue cluster of ``jobs`` batch jobs, yield a client, close both after.

    Parameters
    ----------
    name : str
        ``slurm``, ``pbs``, ``sge``, ``lsf``, ``htcondor``, ``moab`` or ``oar``.
    jobs : int
        Batch jobs to submit (``cluster.scale(jobs=jobs)``); each runs the job's workers.
    **options
        Keyword arguments of the cluster class (``queue``, ``cores``, ``memory``, ``walltime``,
        ``account``, ...). ``None`` values are dropped, so dask-jobqueue's configuration
        ``jobqueue.<name>.*`` applies to them.

    The client does not wait for workers: a Monte-Carlo run starts as soon as the first job
    starts, and the others join as the batch system starts them.
    """
    from distributed import Client

    cls = jobqueue_cluster_class(name)
    if int(jobs) < 1:
        raise InputError("jobs", jobs, "a positive number of batch jobs")
    kwargs = {k: v for k, v in options.items() if v is not None}
    try:
        cluster = cls(**kwargs)
    except ValueError as e:     # e.g. "You must specify how much cores and memory per job"
        raise ResearchError(f"cannot configure a {cls.__name__}: {e} (set jobqueue.{name.lower()}.* "
                            "or pass --cores/--memory)") from None
    try:
        cluster.scale(jobs=int(jobs))
        with Client(cluster) as client:
            yield client
    finally:
        cluster.close()
