"""Sharded, verified, replayable Monte-Carlo on Dask.

A vectorised pipeline over uncertain inputs becomes a content-addressed :class:`Job`, split
into shards; each shard draws from its own Philox counter range of one root seed, so any shard
can be recomputed alone, bit for bit. Shards return fixed-size accumulators that Dask folds in
a fixed tree, so the result is the same bits for any number of workers or task size.

Examples
--------
>>> from dask_research import montecarlo as mc
>>> def ratio(a, b, c):
...     return a * b / (c + 1)
>>> job = mc.Job(ratio, {"a": mc.Normal(1.0, 0.1), "b": mc.LogNormal(0.7, 0.15),
...                      "c": mc.Uniform(0.4, 0.6)}, shards=16, samples_per_shard=8192, seed=2026)
>>> pilot = mc.pilot(job)
>>> result = mc.run(job, progress=False)       # doctest: +SKIP
>>> result.mean, result.stderr, result.interval(0.95), result.linearized   # doctest: +SKIP
"""
from .accumulators import Moments, MomentsReducer, Reducer, merge_moments
from .audit import ReplayReport, load_job, replay, replay_many, show
from .distributions import (
                            Beta,
                            Distribution,
                            Fixed,
                            LogNormal,
                            MultivariateNormal,
                            Normal,
                            Triangular,
                            TruncatedNormal,
                            Uniform,
)
from .job import Job
from .linearize import Linearized, linearize
from .mergers import MergerReport, check_merger
from .pilot import Pilot, Plan, pilot
from .power import PowerPolicy, power_state
from .result import Interval, Result
from .run import run
from .shard_compute import compute_shard
from .store import RunStore

__all__ = [
    "Job", "run", "pilot", "Pilot", "Plan", "Result", "Interval", "compute_shard",
    "Normal", "LogNormal", "Uniform", "Triangular", "TruncatedNormal", "Beta", "Fixed",
    "MultivariateNormal", "Distribution",
    "Moments", "merge_moments", "Reducer", "MomentsReducer", "check_merger", "MergerReport",
    "linearize", "Linearized", "RunStore", "replay", "replay_many", "ReplayReport", "load_job", "show",
    "PowerPolicy", "power_state",
]
