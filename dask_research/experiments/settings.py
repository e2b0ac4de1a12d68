"""The scheduler's settings: every keyword, its ``research.experiments.*`` default, validated once.

:meth:`SchedulerSettings.parse` reads each keyword that is ``None`` from ``dask.config`` and
checks it (an :class:`~dask_research.exceptions.InputError` or
:class:`~dask_research.exceptions.ExperimentError` names the keyword); :meth:`~SchedulerSettings.
header` is what a checkpoint records so :meth:`~.loop.IterationScheduler.resume` can rebuild the
scheduler; :meth:`~SchedulerSettings.make_policy` builds the :class:`~.policies.Policy`.

Examples
--------
>>> from dask_research.experiments.settings import SchedulerSettings
>>> s = SchedulerSettings.parse(slots=4, c=0.5)
>>> s.slots, s.c, s.apply_order, s.make_policy().name
(4, 0.5, 'completion', 'ucb1')
>>> SchedulerSettings.parse(slots=0)
Traceback (most recent call last):
...
dask_research.exceptions.InputError: IterationScheduler: slots=0 is invalid; expected an ...
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import config, events
from ..durable import schema
from ..exceptions import ExperimentError, InputError
from .execute import is_async_callable
from .objectives import check_objective
from .options import number as _number
from .options import parse_objectives, parse_threshold, parse_weights
from .policies.base import Policy, ScoreFn
from .policies.factory import make_policy
from .policies.maxbandit import MAX_POLICY_NAMES, make_max_policy

__all__ = ["SchedulerSettings", "SettingAttributes", "check_functions", "check_header", "MAX_SLOTS"]

_WHERE = "IterationScheduler"
#: Most experiments in flight at once (a local pool starts a thread per slot, the driver keeps
#: a list of them): more is a mistake, or a damaged checkpoint header.
MAX_SLOTS = 65_536


def check_functions(runner: Any, expander: Any, paper_writer: Any) -> None:
    """The scheduler's functions are callables (``runner`` may be ``None`` for ask/tell) and
    the expander is a plain function (it runs on the loop between decisions).

    >>> check_functions(None, None, print)
    >>> check_functions(None, 3, None)
    Traceback (most recent call last):
    ...
    dask_research.exceptions.ExperimentError: expander must be callable or None, got int
    """
    if runner is not None and not callable(runner):
        raise ExperimentError(
            f"runner must be callable (Hypothesis -> Result), got {type(runner).__name__}",
            value=runner)
    for name, fn in (("expander", expander), ("paper_writer", paper_writer)):
        if fn is not None and not callable(fn):
            raise ExperimentError(f"{name} must be callable or None, got "
                                  f"{type(fn).__name__}", value=fn)
    if expander is not None and is_async_callable(expander):
        raise ExperimentError(
            "expander must be a plain function Result -> list[Hypothesis] (it runs on the "
            "loop between decisions); put slow or async work in the runner or the "
            "paper_writer", value=expander)


def _trace_scores(value: Any) -> int | None:
    """``research.experiments.trace-scores``: an int >= 1, or None / "all" for every score."""
    value = config.get("experiments.trace-scores", value)
    if value is None or value == "all":
        return None
    _number("trace_scores", value, 'an integer >= 1, or "all" (every branch\'s score)',
            lambda v: v >= 1 and v == int(v))
    return int(value)


def _int(name: str, key: str, value: Any, expected: str, ok: Callable[[Any], bool]) -> int:
    return int(_number(name, config.get(key, value), expected, ok))


def _float(name: str, key: str, value: Any, expected: str, ok: Callable[[Any], bool]) -> float:
    return float(_number(name, config.get(key, value), expected, ok))


def _finite_nonneg(v: Any) -> bool:
    return math.isfinite(v) and v >= 0


@dataclass
class SchedulerSettings:
    """Validated settings of one :class:`~.loop.IterationScheduler` (see its parameters).

    Mutable: a setting changed on the scheduler (``sched.timeout = 1.5``) changes it here, and
    the next journal header records it.
    """

    slots: int
    c: float
    prune_after_runs: int
    bounded: bool
    objectives: dict[str, str] | None
    weights: list[float] | None
    prune_floor: Any
    paper_threshold: Any
    failure_limit: int | None
    max_experiments: int | None
    max_seconds: float | None
    timeout: float | None
    cancel_grace: float
    trace_scores: int | None
    progress: bool
    log_events: bool
    topic: str
    apply_order: str
    gamma: float
    alpha: float
    seed: int
    objective: str
    max_quantile: float
    max_c: float
    policy_arg: str | Policy | ScoreFn | None
    checkpoint: str | os.PathLike[str] | None

    @classmethod
    def parse(cls, slots: Any = None, c: Any = None, prune_after_runs: Any = None,  # noqa: C901
              prune_floor: Any = None, paper_threshold: Any = None,
              max_experiments: Any = None, max_seconds: Any = None,
              failure_limit: Any = None, bounded: Any = None, progress: Any = None,
              policy: Any = None, log_events: Any = None, checkpoint: Any = None,
              gamma: Any = None, alpha: Any = None, seed: Any = None, objectives: Any = None,
              weights: Any = None, apply_order: Any = None, timeout: Any = None,
              cancel_grace: Any = None, trace_scores: Any = None, objective: Any = None,
              max_policy: Any = None, max_quantile: Any = None,
              max_c: Any = None) -> SchedulerSettings:
        """Settings from the scheduler's keywords (``None``: ``research.experiments.*``),
        checked in the order of the scheduler's parameters."""
        n_slots = _int("slots", "experiments.slots", slots, f"an integer in [1, {MAX_SLOTS}]",
                       lambda v: 1 <= v <= MAX_SLOTS and v == int(v))
        c_ = _float("c", "experiments.c", c, "a finite number >= 0 (sqrt 2 is the UCB1 default)",
                    _finite_nonneg)
        after = _int("prune_after_runs", "experiments.prune-after-runs", prune_after_runs,
                     "an integer >= 1", lambda v: v >= 1 and v == int(v))
        bounded = bool(config.get("experiments.bounded-rewards", bounded))
        pairs = parse_objectives(objectives)
        dirs: dict[str, str] | None = dict(pairs) if pairs else None
        weights = parse_weights(weights, dirs)
        in_range = (lambda v: 0.0 <= v <= 1.0) if bounded else math.isfinite
        expected = ("a number in [0, 1] (rewards are bounded; pass bounded=False for other "
                    "reward scales)") if bounded else "a finite number"
        floor = parse_threshold("prune_floor", config.get("experiments.prune-floor", prune_floor),
                                dirs, expected, in_range)
        threshold = parse_threshold(
            "paper_threshold", config.get("experiments.paper-threshold", paper_threshold), dirs,
            expected, in_range)
        limit = _int("failure_limit", "experiments.failure-limit", failure_limit,
                     "an integer >= 0 (0: no limit)", lambda v: v >= 0 and v == int(v))
        if max_experiments is not None:
            _number("max_experiments", max_experiments, "an integer >= 0 or None",
                    lambda v: v >= 0 and v == int(v))
        if max_seconds is not None:
            _number("max_seconds", max_seconds, "a number > 0 or None", lambda v: v > 0)
        timeout = config.get("experiments.timeout", timeout)
        if timeout is not None:
            _number("timeout", timeout, "a number of seconds > 0, or None for no limit",
                    lambda v: math.isfinite(v) and v > 0)
        grace = _float("cancel_grace", "experiments.cancel-grace", cancel_grace,
                       "a number of seconds >= 0", _finite_nonneg)
        n_scores = _trace_scores(trace_scores)
        show = bool(config.get("experiments.progress", progress))
        log = bool(config.get("experiments.log-events", log_events))
        order = config.get("experiments.apply-order", apply_order)
        if order not in ("completion", "dispatch"):
            raise InputError("apply_order", order, '"completion" or "dispatch"', where=_WHERE)
        settings = cls(
            slots=n_slots, c=c_, prune_after_runs=after, bounded=bounded, objectives=dirs,
            weights=weights, prune_floor=floor, paper_threshold=threshold,
            failure_limit=limit or None, max_experiments=max_experiments,
            max_seconds=max_seconds, timeout=None if timeout is None else float(timeout),
            cancel_grace=grace, trace_scores=n_scores, progress=show, log_events=log,
            topic=events.topic("experiments"), apply_order=order,
            gamma=_float("gamma", "experiments.gamma", gamma, "a number in (0, 1]",
                         lambda v: 0 < v <= 1),
            alpha=_float("alpha", "experiments.alpha", alpha, "a finite number >= 0",
                         _finite_nonneg),
            seed=_int("seed", "experiments.seed", seed, "an integer", lambda v: v == int(v)),
            objective=check_objective(config.get("experiments.objective", objective)),
            max_quantile=_float("max_quantile", "experiments.max-quantile", max_quantile,
                                "a number in (0, 1)", lambda v: 0 < v < 1),
            max_c=_float("max_c", "experiments.max-c", max_c, "a finite number >= 0",
                         _finite_nonneg),
            policy_arg=None, checkpoint=checkpoint)
        if settings.objective == "max" and policy is None:
            policy = config.get("experiments.max-policy", max_policy)
            if policy not in MAX_POLICY_NAMES:
                raise InputError("max_policy", policy, "one of " + ", ".join(
                    map(repr, MAX_POLICY_NAMES)), where=_WHERE)
        if settings.objective == "max" and dirs is not None:
            raise InputError("objective", "max", '"mean" with vector rewards (objectives=); '
                             "the best-of-branch objective needs scalar rewards", where=_WHERE)
        settings.policy_arg = config.get("experiments.policy", policy)
        if checkpoint is not None and not isinstance(checkpoint, (str, os.PathLike)):
            raise InputError("checkpoint", checkpoint, "a file path (str or os.PathLike), an "
                             "fsspec URL, or None", where=_WHERE)
        return settings

    def make_policy(self) -> Policy:
        """The :class:`~.policies.Policy` these settings name (a new one each call)."""
        arg = self.policy_arg
        if isinstance(arg, Policy):
            return arg
        if isinstance(arg, str) and arg in MAX_POLICY_NAMES:
            return make_max_policy(arg, tau=self.max_quantile, c=self.max_c,
                                   bounded=self.bounded)
        return make_policy(arg, c=self.c, gamma=self.gamma, alpha=self.alpha, seed=self.seed,
                           bounded=self.bounded)

    def header(self) -> dict[str, Any]:
        """What a checkpoint records of these settings (for :meth:`~.loop.IterationScheduler.
        resume`: constructor keywords; a custom policy is recorded as ``"custom"``)."""
        arg = self.policy_arg
        return {
            "slots": self.slots, "c": self.c, "prune_after_runs": self.prune_after_runs,
            "prune_floor": self.prune_floor, "paper_threshold": self.paper_threshold,
            "failure_limit": self.failure_limit or 0, "bounded": self.bounded,
            "max_experiments": self.max_experiments, "max_seconds": self.max_seconds,
            "policy": arg if isinstance(arg, str) else "custom",
            "gamma": self.gamma, "alpha": self.alpha, "seed": self.seed,
            "objectives": list(map(list, self.objectives.items())) if self.objectives else None,
            "weights": self.weights, "apply_order": self.apply_order,
            "timeout": self.timeout, "cancel_grace": self.cancel_grace,
            "objective": self.objective, "max_quantile": self.max_quantile, "max_c": self.max_c,
        }


def _threshold(value: Any) -> str | None:
    """A journaled threshold: a finite number, or a non-empty ``{objective: finite number}``."""
    def finite(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    if finite(value) or (isinstance(value, dict) and value and all(
            isinstance(k, str) and finite(v) for k, v in value.items())):
        return None
    return "a finite number, or an object {objective: finite number}"


_NUMBER, _INT = schema.Maybe(schema.Float()), schema.Maybe(schema.Int())
_TEXT = schema.Maybe(schema.Str(max_len=64))
_THRESHOLD = schema.Maybe(schema.Where(_threshold))
#: What :meth:`SchedulerSettings.header` writes, by JSON type (``null``: the default). The
#: values are then checked by :meth:`SchedulerSettings.parse`, as the constructor's keywords.
HEADER = schema.Obj({}, optional={
    "slots": _INT, "c": _NUMBER, "prune_after_runs": _INT, "prune_floor": _THRESHOLD,
    "paper_threshold": _THRESHOLD, "failure_limit": _INT, "bounded": schema.Maybe(schema.Bool()),
    "max_experiments": _NUMBER, "max_seconds": _NUMBER, "policy": _TEXT, "gamma": _NUMBER,
    "alpha": _NUMBER, "seed": _INT,
    "objectives": schema.Maybe(schema.List(schema.List(schema.Str(max_len=256), length=2), max_len=1024)),
    "weights": schema.Maybe(schema.List(schema.Float(), max_len=1024)), "apply_order": _TEXT,
    "timeout": _NUMBER, "cancel_grace": _NUMBER, "objective": _TEXT, "max_quantile": _NUMBER,
    "max_c": _NUMBER,
})


def check_header(settings: dict[str, Any]) -> dict[str, Any]:
    """The settings of a journal's header if each has the JSON type :meth:`SchedulerSettings.
    header` writes; else :class:`~dask_research.durable.schema.Invalid` naming the setting.

    A name the header never holds is refused too. The values themselves are the constructor's
    to judge (a resume passes them to it).

    >>> check_header({"slots": 2, "apply_order": "dispatch"})
    {'slots': 2, 'apply_order': 'dispatch'}
    >>> check_header({"slots": 1e9})
    Traceback (most recent call last):
    ...
    dask_research.durable.schema.Invalid: slots is 1000000000.0; expected a whole number
    """
    return schema.check(settings, HEADER)


class _Setting:
    """An attribute that reads and writes ``obj.settings.<name>``."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else getattr(obj.settings, self.name)

    def __set__(self, obj: Any, value: Any) -> None:
        setattr(obj.settings, self.name, value)


class SettingAttributes:
    """Every setting of ``self.settings`` as an attribute of its own (``sched.slots``,
    ``sched.timeout = 1.5``): the scheduler's settings read as they always did.

    >>> class Holder(SettingAttributes):
    ...     def __init__(self):
    ...         self.settings = SchedulerSettings.parse(slots=2)
    >>> h = Holder(); h.timeout = 1.5
    >>> h.slots, h.settings.timeout
    (2, 1.5)
    """

    settings: SchedulerSettings

    slots = _Setting()
    c = _Setting()
    prune_after_runs = _Setting()
    prune_floor = _Setting()
    paper_threshold = _Setting()
    max_experiments = _Setting()
    max_seconds = _Setting()
    failure_limit = _Setting()
    bounded = _Setting()
    progress = _Setting()
    log_events = _Setting()
    topic = _Setting()
    checkpoint = _Setting()
    gamma = _Setting()
    alpha = _Setting()
    seed = _Setting()
    objectives = _Setting()
    weights = _Setting()
    apply_order = _Setting()
    timeout = _Setting()
    cancel_grace = _Setting()
    trace_scores = _Setting()
    objective = _Setting()
    max_quantile = _Setting()
    max_c = _Setting()

