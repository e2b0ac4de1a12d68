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
import logging
import time
from collections.abc import Iterator
from typing import Any

from . import config
from ._signals import terminate_as_interrupt
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
    import signal

    ctrl_c = signal.getsignal(signal.SIGINT)
    try:
        import dask_jobqueue
    except ImportError:
        raise ResearchError(f"--cluster {key} needs dask-jobqueue: pip install 'dask-research[hpc]'") from None
    finally:
        # dask_jobqueue.runner sets SIGINT to sys.exit() on import: Ctrl-C was a silent exit 0
        if ctrl_c is not None and signal.getsignal(signal.SIGINT) is not ctrl_c:
            signal.signal(signal.SIGINT, ctrl_c)
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
    if name.lower() == "slurm":
        slurm_check_request(kwargs)
        kwargs.update(slurm_job_size(kwargs))
    try:
        cluster = cls(**kwargs)
    except ValueError as e:     # e.g. "You must specify how much cores and memory per job"
        first = str(e).strip().splitlines()[0].rstrip(":").removesuffix(", for example").rstrip(",. ")
        raise ResearchError(f"cannot configure a {cls.__name__}: {first}; pass --cores N --memory 4GB, or set "
                            f"jobqueue.{name.lower()}.cores and .memory (~/.config/dask/jobqueue.yaml)") from None
    with terminate_as_interrupt():
        try:
            _submit(cluster, name.lower(), int(jobs))
            with Client(cluster) as client:
                yield client
        finally:
            cluster.close()


def slurm_job_size(given: dict[str, Any], sinfo: str = "sinfo") -> dict[str, Any]:
    """Cores and memory per SLURM job from what ``sinfo`` reports for the partition's nodes, where
    neither the command line nor ``jobqueue.slurm.cores`` / ``.memory`` says (a new account).

    Returns what it chose (``{}`` when nothing was missing) and says so in one line on stderr,
    with how to override it; where SLURM cannot tell, a :class:`ResearchError` line keeps the hint.

    >>> slurm_job_size({"cores": 2, "memory": "4GB"})
    {}
    """
    import subprocess
    import sys

    import dask

    missing = [k for k in ("cores", "memory") if given.get(k) is None and dask.config.get(f"jobqueue.slurm.{k}", None) is None]
    if not missing:
        return {}
    queue = given.get("queue") or dask.config.get("jobqueue.slurm.queue", None)
    hint = "pass --cores N --memory 4GB, or set jobqueue.slurm.cores and .memory (~/.config/dask/jobqueue.yaml)"
    cmd = [sinfo, "-h", "-o", "%c %m", *(["-p", str(queue)] if queue else [])]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        sizes = [tuple(int(x.rstrip("+")) for x in line.split()[:2]) for line in out.stdout.splitlines() if line.strip()]
    except (OSError, subprocess.TimeoutExpired, ValueError):
        sizes, out = [], None
    if not sizes:
        why = (out.stderr.strip().splitlines() or ["no nodes"])[-1] if out is not None else f"{sinfo} did not run"
        where = f"partition {queue!r}" if queue else "the default partition"
        raise ResearchError(f"cannot tell the cores and memory of a SLURM job: sinfo says nothing of {where}'s "
                            f"nodes ({why.strip()}); {hint}")
    cores, mem_mb = min(c for c, _ in sizes), min(m for _, m in sizes)
    chosen: dict[str, Any] = {}
    if "cores" in missing:
        chosen["cores"] = cores
    if "memory" in missing:
        # whole GiB, rounded down: dask-jobqueue rounds --mem up to GiB, past the node's memory otherwise
        chosen["memory"] = _mib(mem_mb)
    where = f"partition {queue}" if queue else "the default partition"
    said = ", ".join(f"{k} {v}" for k, v in chosen.items())
    print(f"--cluster slurm: {said} per job, from sinfo for {where}'s smallest node; {hint} to change it",
          file=sys.stderr, flush=True)
    return chosen


def slurm_check_request(given: dict[str, Any], sinfo: str = "sinfo") -> None:
    """Refuse, before anything is submitted, a partition this SLURM does not have, and a job
    that no node of its partition can hold (SLURM would keep it pending for ever, and the run
    would wait without a word). :class:`InputError` names the option and what would fit.

    Cores and memory are the given ones, else ``jobqueue.slurm.cores`` / ``.memory``; memory is
    rounded up as dask-jobqueue asks SLURM for it (whole GiB from 1 GiB). Where ``sinfo`` cannot
    answer, nothing is checked: the submission says what is wrong.

    >>> slurm_check_request({"queue": "debug"}, sinfo="/nonexistent/sinfo")    # no SLURM to ask
    """
    import math
    import subprocess

    import dask
    from dask.utils import parse_bytes

    try:
        out = subprocess.run([sinfo, "-h", "-o", "%P %c %m"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return
    partitions: dict[str, list[tuple[int, int]]] = {}
    default = None
    for line in out.stdout.splitlines() if out.returncode == 0 else []:
        fields = line.split()
        if len(fields) < 3:
            continue
        name = fields[0].rstrip("*")
        default = name if fields[0].endswith("*") else default
        try:
            partitions.setdefault(name, []).append((int(fields[1].rstrip("+")), int(fields[2].rstrip("+"))))
        except ValueError:
            continue
    if not partitions:
        return
    where = "--cluster slurm"
    queue = given.get("queue") or dask.config.get("jobqueue.slurm.queue", None)
    if queue is not None and str(queue) not in partitions:
        raise InputError("queue", queue, f"a partition of this SLURM cluster: {', '.join(sorted(partitions))}",
                         where=where)
    partition = str(queue) if queue is not None else default
    if partition is None or partition not in partitions:
        return
    nodes = partitions[partition]
    cores = given.get("cores") or dask.config.get("jobqueue.slurm.cores", None)
    memory = given.get("memory") or dask.config.get("jobqueue.slurm.memory", None)
    try:
        need_cores = int(cores) if cores is not None else 0
        n = parse_bytes(memory) if memory is not None else 0
    except (TypeError, ValueError):
        return                    # dask-jobqueue refuses it in its own words
    need_mb = math.ceil(n / 2**30) * 1024 if n >= 2**30 else math.ceil(n / 2**20)
    if any(c >= need_cores and m >= need_mb for c, m in nodes):
        return
    most_cores, most_mb = max(c for c, _ in nodes), max(m for _, m in nodes)
    never = f"partition {partition}'s nodes"
    if need_cores > most_cores:
        raise InputError("cores", cores, f"at most {most_cores}, the most CPUs of {never} (a larger job "
                         "would wait in the queue for ever)", where=where)
    if need_mb > most_mb:
        raise InputError("memory", memory, f"at most {_mib(most_mb)}, the most memory of {never} "
                         "(a larger job would wait in the queue for ever)", where=where)
    raise InputError("memory", memory, f"a size that fits beside {cores} cores on one of {never}: none has "
                     "both (a larger job would wait in the queue for ever)", where=where)


def _mib(mb: int) -> str:
    return f"{mb // 1024}GiB" if mb >= 1024 else f"{mb}MiB"


class _SubmitErrors(logging.Filter):
    """Keeps (and hides) the errors of dask-jobqueue's job submissions, which Dask's event loop
    would otherwise log as tracebacks from a background callback."""

    def __init__(self) -> None:
        super().__init__()
        self.errors: list[BaseException] = []

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None:     # (only while jobs are being submitted: the filter is removed after)
            self.errors.append(exc)
            return False
        return True


def _submit(cluster, name: str, jobs: int) -> None:
    """``cluster.scale(jobs=jobs)`` and wait until the batch system accepted every job; a
    refused submission (no batch system, a bad queue or account) raises ResearchError with
    the submit command's own last line."""
    keep = _SubmitErrors()
    loggers = [logging.getLogger(n) for n in ("tornado.application", "asyncio", "distributed.deploy.spec")]
    for lg in loggers:
        lg.addFilter(keep)
    try:
        cluster.scale(jobs=jobs)
        deadline = time.monotonic() + float(config.resolve("cluster.submit-timeout"))
        while not keep.errors:
            submitted = [w for w in cluster.workers.values() if getattr(w, "job_id", None)]
            if len(submitted) >= jobs:
                return
            if time.monotonic() > deadline:
                raise ResearchError(f"the {name} batch system accepted {len(submitted)} of {jobs} jobs within "
                                    f"{config.resolve('cluster.submit-timeout'):g} s (research.cluster.submit-timeout); "
                                    "is its submit command hanging?")
            time.sleep(0.05)
        # Forget the jobs that were never submitted, so that closing the cluster can work.
        from ._compat import forget_unsubmitted_jobs  # Dask only when a cluster runs: the CLI's --help stays light

        forget_unsubmitted_jobs(cluster, lambda w: bool(getattr(w, "job_id", None)))
        err = keep.errors[0]
        text = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
        if "Command:" in text[:-1]:     # dask-jobqueue's message: the command, its stdout and stderr
            command = text[text.index("Command:") + 1].split()[0]
            reason = f"{command} said {text[-1]!r}"
        else:
            reason = f"{type(err).__name__}: {text[0] if text else ''}"
        raise ResearchError(f"could not submit the {name} jobs: {reason}")
    finally:
        for lg in loggers:
            lg.removeFilter(keep)
