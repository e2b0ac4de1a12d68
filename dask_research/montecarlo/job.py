"""A Monte-Carlo job: pipeline, inputs, partitioning and seed, with a content address.

Examples
--------
>>> from dask_research.montecarlo import Job, Normal, Uniform
>>> def f(a, b):
...     return a * b
>>> job = Job(f, {"a": Normal(1.0, 0.1), "b": Uniform(0.5, 1.5)}, shards=8,
...           samples_per_shard=1024, seed=7)
>>> job.names
('a', 'b')
>>> job.id == Job(f, {"a": Normal(1.0, 0.1), "b": Uniform(0.5, 1.5)}, shards=8,
...               samples_per_shard=1024, seed=7).id
True
>>> job.id == job.replace(seed=8).id
False
>>> job.range_margin == job.replace(seed=8).range_margin      # read from the config once, when built
True
"""
from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import numpy as np

from .. import config
from .._version import __version__
from ..exceptions import InputError
from . import philox
from .accumulators import MomentsReducer, Reducer
from .address import SCHEME, address_header, pipeline_fingerprint, sha256_hex
from .distributions import Distribution
from .gpu import device_choice as gpu_placement
from .gpu import draws as gpu_draws
from .gpu import tolerance as gpu_tolerance
from .job_registry import remember_job

__all__ = ["Job", "ENGINE", "job_factory", "is_job_factory"]

_FACTORY_MARK = "__dask_research_job_factory__"
_F = TypeVar("_F", bound=Callable[..., Any])


def job_factory(fn: _F) -> _F:
    """Mark a zero-argument function that returns a :class:`Job`, so ``--job FILE:NAME`` may call it.

    The command line calls nothing else it is pointed at: ``FILE:main`` or the pipeline itself
    is refused in one line, before anything runs.

    >>> from dask_research.montecarlo import Normal
    >>> @job_factory
    ... def small_job():
    ...     return Job(lambda a: a, {"a": Normal(0, 1)}, shards=2, samples_per_shard=8)
    >>> is_job_factory(small_job), is_job_factory(lambda: None)
    (True, False)
    """
    from ..exceptions import InputError

    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        raise InputError("factory", fn, "a function", where="job_factory") from None
    required = [p.name for p in sig.parameters.values()
                if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if required:
        raise InputError("factory", fn, f"a function callable without arguments (it requires {required})",
                         where="job_factory")
    setattr(fn, _FACTORY_MARK, True)
    return fn


def is_job_factory(obj: Any) -> bool:
    """Whether ``obj`` was marked with :func:`job_factory`."""
    return callable(obj) and getattr(obj, _FACTORY_MARK, False) is True

#: What the content address pins besides the job itself (and, in scheme 2, the Python bytecode
#: its pipeline is described by: ``describe()["address"]``).
ENGINE = {"dask_research": __version__, "numpy": np.__version__, "bit_generator": philox.ALGORITHM}

#: Pilot rule recorded in the address of a job whose histogram range is not given.
PILOT_RULE = "pilot shard on counter 1<<128, range = [min, max] widened by margin and rounded out"


def _positive_int(name: str, value: Any, limit: int | None = None) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InputError(name, value, "a positive integer", where="Job")
    if limit is not None and value > limit:
        raise InputError(name, value, f"a positive integer no larger than {limit:,}", where="Job")
    return int(value)


class Job:
    """A content-addressed Monte-Carlo job.

    Parameters
    ----------
    pipeline : callable
        Vectorised: called with one keyword array per input name (``len == samples``), returns
        one value per sample (shape ``(samples,)``; a user ``reducer`` may accept more).
    inputs : mapping
        Input name -> :class:`Distribution`, in the order the inputs are drawn. A correlated
        block is a :class:`MultivariateNormal` under a tuple of names.
    shards, samples_per_shard : int
        Partitioning: ``shards * samples_per_shard`` draws in all. Defaults from
        ``research.montecarlo.shards`` / ``samples-per-shard``.
    seed : int, SeedSequence, Generator or None
        Root seed, as NumPy's ``default_rng`` takes it (a SeedSequence gives its entropy, a
        Generator one number drawn from it, ``None`` fresh entropy); ``job.seed`` records the int.
        Shard ``i`` draws from Philox counter ``i << 64`` under a key derived from it.
    bins : int
        Histogram bins (default ``research.montecarlo.bins``).
    range : (float, float), optional
        Histogram range. ``None``: frozen by the pilot (a deterministic function of the job).
    reducer : Reducer, optional
        A user reducer (``init``, ``update``, ``merge``, ``finalize``) instead of the built-in
        moments + histogram accumulator.
    name : str, optional
        A label for people; not part of the address.
    range_margin : float, optional
        How far the pilot widens its [min, max] into the histogram range, as a fraction of the
        width per side (default ``research.montecarlo.range-margin``, read once, here). Part of
        the address of a job whose ``range`` is not given.
    device : {"cpu", "gpu", "any"}
        Where shards may run (see :mod:`dask_research.montecarlo.gpu.device_choice`). ``"cpu"``
        (default) is the exact NumPy path; ``"gpu"`` and ``"any"`` use the portable draw
        algorithm, which the address records with its tolerance class.
    """

    def __init__(self, pipeline: Callable, inputs: Mapping, shards: int | None = None,
                 samples_per_shard: int | None = None, seed: Any = 0, bins: int | None = None,
                 range: tuple[float, float] | None = None, reducer: Reducer | None = None,
                 name: str | None = None, device: str = "cpu", range_margin: float | None = None):
        if not callable(pipeline):
            raise InputError("pipeline", pipeline, "a callable taking one array per input", where="Job")
        self.pipeline = pipeline
        self.inputs = self._check_inputs(inputs)
        self.shards = _positive_int("shards", config.resolve("montecarlo.shards", shards), philox.MAX_SHARDS - 1)
        self.samples_per_shard = _positive_int(
            "samples_per_shard", config.resolve("montecarlo.samples-per-shard", samples_per_shard), 2**31)
        self.seed = philox.check_seed(seed)
        self.bins = _positive_int("bins", config.resolve("montecarlo.bins", bins), 1 << 20)
        self.range = self._check_range(range)
        self.range_margin = self._check_margin(config.resolve("montecarlo.range-margin", range_margin))
        if reducer is not None and not isinstance(reducer, Reducer):
            raise InputError("reducer", reducer, "an object with init, update, merge and finalize",
                             where="Job")
        self.reducer = reducer
        self.name: str = name if name else str(getattr(pipeline, "__name__", "pipeline"))
        # -- device (issue 19): where shards may run; non-cpu jobs need portable draws
        self.device = gpu_placement.check_device(device)
        if self.device != "cpu":
            gpu_draws.check_portable(self.inputs)
        self._check_signature()
        self._id: str | None = None
        remember_job(self)    # the jobs built here: the only pipelines replay may pick unasked

    # -- validation -------------------------------------------------------------------------
    @staticmethod
    def _check_inputs(inputs: Mapping) -> dict:
        if not isinstance(inputs, Mapping) or not inputs:
            raise InputError("inputs", inputs, "a non-empty mapping of name -> distribution", where="Job")
        seen: set[str] = set()
        out = {}
        for key, dist in inputs.items():
            names = key if isinstance(key, tuple) else (key,)
            label = f"input {key!r}"
            if not names or not all(isinstance(n, str) and n.isidentifier() for n in names):
                raise InputError("input name", key, "a Python identifier or a tuple of them", where="Job")
            if not isinstance(dist, Distribution):
                raise InputError("distribution", dist, "a dask_research.montecarlo distribution "
                                 "(Normal, LogNormal, Uniform, ...)", where=label)
            dist.validate(where=label)
            if dist.dim != len(names):
                raise InputError("names", key, f"{dist.dim} names for a {dist.dim}-dimensional "
                                 f"{type(dist).__name__}", where=label)
            dup = seen.intersection(names)
            if dup:
                raise InputError("input name", sorted(dup)[0], "names that appear once", where="Job")
            seen.update(names)
            out[key] = dist
        return out

    @staticmethod
    def _check_range(range) -> tuple[float, float] | None:
        if range is None:
            return None
        try:
            lo, hi = (float(v) for v in range)
        except (TypeError, ValueError):
            raise InputError("range", range, "a pair (lo, hi) of finite numbers with lo < hi", where="Job") from None
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise InputError("range", range, "a pair (lo, hi) of finite numbers with lo < hi", where="Job")
        return (lo, hi)

    @staticmethod
    def _check_margin(margin: Any) -> float:
        try:
            value = float(margin) if not isinstance(margin, (bool, np.bool_)) else math.nan
        except (TypeError, ValueError):
            value = math.nan
        if not (math.isfinite(value) and value >= 0):
            raise InputError("range_margin", margin, "a finite, non-negative fraction of the range's width",
                             where="Job")
        return value

    def _check_signature(self) -> None:
        try:
            sig = inspect.signature(self.pipeline)
        except (TypeError, ValueError):
            return
        params = list(sig.parameters.values())
        if any(p.kind is p.VAR_KEYWORD for p in params):
            return
        accepted = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        if getattr(self, "device", "cpu") != "cpu":  # issue 19: device jobs pass the namespace
            accepted.discard("xp")  # as `xp`, never as an input
            params = [p for p in params if p.name != "xp"]
        unknown = [n for n in self.names if n not in accepted]
        if unknown:
            raise InputError("inputs", unknown, f"names the pipeline accepts: {sorted(accepted)}",
                             where=f"Job({self.name!s})" if hasattr(self, "name") else "Job")
        required = [p.name for p in params if p.default is p.empty
                    and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in self.names]
        if required:
            raise InputError("inputs", sorted(self.names), f"an input for every required pipeline "
                             f"argument; missing {required}", where="Job")

    # -- derived ----------------------------------------------------------------------------
    @property
    def names(self) -> tuple[str, ...]:
        """Input names in draw order (a correlated block contributes all its names)."""
        out: list[str] = []
        for key in self.inputs:
            out.extend(key if isinstance(key, tuple) else (key,))
        return tuple(out)

    @property
    def total_samples(self) -> int:
        return self.shards * self.samples_per_shard

    @property
    def key(self) -> np.ndarray:
        """The job's 128-bit Philox key."""
        return philox.root_key(self.seed)

    @property
    def frozen(self) -> bool:
        """Whether the histogram range is fixed (or not needed, with a user reducer)."""
        return self.range is not None or self.reducer is not None

    def describe(self, scheme: int = SCHEME) -> dict[str, Any]:
        """Everything in the content address, as a JSON-able dict.

        ``scheme`` is the content-address scheme (:mod:`~dask_research.montecarlo.address`):
        2, the default, describes the pipeline by its code and records the Python bytecode it
        depends on under ``"address"``; 1 is the description stores written before recorded
        (the pipeline's source text), kept to check a job against such a store.

        >>> from dask_research.montecarlo import Job, Normal
        >>> def g(a):
        ...     return a + 1
        >>> job = Job(g, {"a": Normal(0.0, 1.0)}, shards=2, samples_per_shard=8, seed=1)
        >>> job.describe()["address"]["scheme"], "address" in job.describe(scheme=1)
        (2, False)
        >>> job.describe(scheme=1)["pipeline"]["source"]
        'def g(a):\\n    return a + 1\\n'
        """
        inputs = []
        for key, dist in self.inputs.items():
            inputs.append({"names": list(key) if isinstance(key, tuple) else [key], **dist.spec()})
        if self.reducer is not None:
            accumulate: dict[str, Any] = {"reducer": pipeline_fingerprint(self.reducer, scheme=scheme)}
        elif self.range is not None:
            accumulate = {"bins": self.bins, "range": list(self.range)}
        else:
            accumulate = {"bins": self.bins, "range": {"rule": PILOT_RULE, "margin": self.range_margin}}
        out = {
            "pipeline": pipeline_fingerprint(self.pipeline, scheme=scheme),
            "inputs": inputs,
            "partitioning": {"scheme": "by_seed", "shards": self.shards,
                             "samples_per_shard": self.samples_per_shard,
                             "counter": "shard << 64", "pilot_counter": "1 << 128"},
            "seed": self.seed,
            "key": philox.key_hex(self.key),
            "accumulate": accumulate,
            "engine": dict(ENGINE),
        }
        if getattr(self, "device", "cpu") != "cpu":  # issue 19: the draw algorithm changes results, "gpu"/"any" do not
            out["draws"] = {"algorithm": gpu_draws.ALGORITHM, "tolerance": gpu_tolerance.GPU_TOLERANCE}
        if scheme >= 2:
            out["address"] = address_header()
        return out

    @property
    def id(self) -> str:
        """sha256 content address of :meth:`describe` (64 hex characters)."""
        if self._id is None:
            self._id = sha256_hex(self.describe())
        return self._id

    def address(self, scheme: int = SCHEME) -> str:
        """The content address under ``scheme``: :attr:`id` for the current one; 1 gives the id
        this job had in stores written before scheme 2 (to replay or verify their runs)."""
        return self.id if scheme == SCHEME else sha256_hex(self.describe(scheme))

    def replace(self, **changes: Any) -> Job:
        """A copy with some constructor arguments changed."""
        kwargs: dict[str, Any] = dict(pipeline=self.pipeline, inputs=self.inputs, shards=self.shards,
                      samples_per_shard=self.samples_per_shard, seed=self.seed, bins=self.bins,
                      range=self.range, reducer=self.reducer, name=self.name, device=self.device,
                      range_margin=self.range_margin)
        kwargs.update(changes)
        return Job(**kwargs)

    def make_reducer(self, range: tuple[float, float] | None = None) -> Reducer:
        """The reducer shards use: the user's, or moments + histogram on the frozen range."""
        if self.reducer is not None:
            return self.reducer
        rng = self.range if self.range is not None else range
        if rng is None:
            raise InputError("range", None, "a frozen histogram range; run mc.pilot(job) first", where="Job")
        return MomentsReducer((rng[0], rng[1]), self.bins)

    def __repr__(self) -> str:
        return (f"Job({self.name}, inputs={list(self.names)}, shards={self.shards}, "
                f"samples_per_shard={self.samples_per_shard:,}, seed={self.seed}, id={self.id[:12]})")
