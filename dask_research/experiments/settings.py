"""The scheduler's settings: one table, one object, validated once, journaled as itself.

Every setting of :class:`~.loop.IterationScheduler` is one row of :data:`SETTINGS`: its
keyword, its ``research.experiments.*`` default, how it is checked, whether and how the
journal header records it, and the line the scheduler's docstring shows. Everything else is
built from the table: :meth:`SchedulerSettings.parse` (keywords + ``dask.config``, checked in
table order, so a check may read the settings before it), the scheduler's signature and the
``Parameters`` of its docstring, its attributes (``sched.slots``, ``sched.timeout = 1.5``,
checked again on assignment), the journal header (:meth:`SchedulerSettings.header`) and its
check on resume (:meth:`SchedulerSettings.from_header`: the header's JSON types, then the same
checks as the keywords). Adding a setting is one row here plus its line in ``research.yaml``
and ``research-schema.yaml``.

Examples
--------
>>> from dask_research.experiments.settings import SchedulerSettings
>>> s = SchedulerSettings.parse(slots=4, c=0.5)
>>> s.slots, s.c, s.apply_order, s.make_policy().name
(4, 0.5, 'completion', 'ucb1')
>>> SchedulerSettings.from_header(s.header()) == s
True
>>> SchedulerSettings.parse(slots=0)
Traceback (most recent call last):
...
dask_research.exceptions.InputError: IterationScheduler: slots=0 is invalid; expected an integer in [1, 65536]
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .. import config, events
from ..durable import schema
from ..exceptions import ExperimentError, InputError
from ..seeds import seed_int
from .execute import is_async_callable
from .objectives import OBJECTIVES, check_objective
from .options import number as _number
from .options import parse_objectives, parse_threshold, parse_weights
from .policies.base import Policy
from .policies.factory import make_policy
from .policies.maxbandit import MAX_POLICY_NAMES, make_max_policy

__all__ = ["SchedulerSettings", "Setting", "SETTINGS", "check_functions", "check_header", "MAX_SLOTS", "HEADER"]

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


# --- checks: (value after the config default, settings so far) -> the value kept ------------
Check = Callable[[str, Any, Mapping[str, Any]], Any]


def _integer(lo: int, hi: int | None = None) -> tuple[Check, str]:
    expected = f"an integer in [{lo}, {hi}]" if hi is not None else f"an integer >= {lo}"

    def check(name: str, v: Any, _: Mapping[str, Any]) -> int:
        return int(_number(name, v, expected, lambda x: x >= lo and (hi is None or x <= hi) and x == int(x)))
    return check, expected


def _real(ok: Callable[[float], bool], expected: str) -> Check:
    def check(name: str, v: Any, _: Mapping[str, Any]) -> float:
        return float(_number(name, v, expected, ok))
    return check


def _finite_nonneg(v: float) -> bool:
    return math.isfinite(v) and v >= 0


def _optional(inner: Check) -> Check:
    def check(name: str, v: Any, so_far: Mapping[str, Any]) -> Any:
        return None if v is None else inner(name, v, so_far)
    return check


def _flag(name: str, v: Any, _: Mapping[str, Any]) -> bool:
    return bool(v)


def _choice(*options: str) -> Check:
    def check(name: str, v: Any, _: Mapping[str, Any]) -> str:
        if v not in options:
            raise InputError(name, v, " or ".join(f'"{o}"' for o in options), where=_WHERE)
        return str(v)
    return check


def _objectives(name: str, v: Any, _: Mapping[str, Any]) -> dict[str, str] | None:
    pairs = parse_objectives(v)
    return dict(pairs) if pairs else None


def _weights(name: str, v: Any, so_far: Mapping[str, Any]) -> list[float] | None:
    return parse_weights(v, so_far["objectives"])


def _threshold_check(name: str, v: Any, so_far: Mapping[str, Any]) -> Any:
    bounded = so_far["bounded"]
    ok: Callable[[float], bool] = (lambda x: 0.0 <= x <= 1.0) if bounded else math.isfinite
    expected = ("a number in [0, 1] (rewards are bounded; pass bounded=False for other reward scales)"
                if bounded else "a finite number")
    return parse_threshold(name, v, so_far["objectives"], expected, ok)


def _failure_limit(name: str, v: Any, so_far: Mapping[str, Any]) -> int | None:
    return _integer(0)[0](name, v, so_far) or None


def _trace_scores(name: str, v: Any, _: Mapping[str, Any]) -> int | None:
    if v is None or v == "all":
        return None
    _number(name, v, 'an integer >= 1, or "all" (every branch\'s score)', lambda x: x >= 1 and x == int(x))
    return int(v)


def _objective(name: str, v: Any, so_far: Mapping[str, Any]) -> str:
    objective = check_objective(v)
    if objective == "max" and so_far["objectives"] is not None:
        raise InputError("objective", "max", '"mean" with vector rewards (objectives=); the best-of-branch '
                         "objective needs scalar rewards", where=_WHERE)
    return objective


def _max_policy(name: str, v: Any, _: Mapping[str, Any]) -> str:
    if v not in MAX_POLICY_NAMES:
        raise InputError(name, v, "one of " + ", ".join(map(repr, MAX_POLICY_NAMES)), where=_WHERE)
    return str(v)


def _policy(name: str, v: Any, so_far: Mapping[str, Any]) -> Any:
    # objective="max" with no policy of the user's own: the max-bandit policy it names; else
    # research.experiments.policy.
    if v is None:
        return so_far["max_policy"] if so_far["objective"] == "max" else config.resolve("experiments.policy", None)
    return v


def _seed(name: str, v: Any, _: Mapping[str, Any]) -> int:
    return int(seed_int(v, where=_WHERE) or 0)


def _queue_ahead(name: str, v: Any, _: Mapping[str, Any]) -> int | str:
    if v == "auto":
        return "auto"
    return int(_number(name, v, '"auto" or an integer in [0, 64] (decided experiments queued behind each running one)',
                       lambda x: 0 <= x <= 64 and x == int(x)))


def _queue_ahead_json(value: Any) -> str | None:
    """A journaled ``queue_ahead``: ``"auto"`` or a whole number."""
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool)):
        return None
    return '"auto" or a whole number'


def _checkpoint(name: str, v: Any, _: Mapping[str, Any]) -> Any:
    if v is not None and not isinstance(v, (str, os.PathLike)):
        raise InputError(name, v, "a file path (str or os.PathLike), an fsspec URL, or None", where=_WHERE)
    return v


def _threshold_json(value: Any) -> str | None:
    """A journaled threshold: a finite number, or a non-empty ``{objective: finite number}``."""
    def finite(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    if finite(value) or (isinstance(value, dict) and value and all(
            isinstance(k, str) and finite(v) for k, v in value.items())):
        return None
    return "a finite number, or an object {objective: finite number}"


_NUMBER, _INT = schema.Maybe(schema.Float()), schema.Maybe(schema.Int())
_TEXT = schema.Maybe(schema.Str(max_len=64))
_THRESHOLD = schema.Maybe(schema.Where(_threshold_json))
_PAIRS = schema.Maybe(schema.List(schema.List(schema.Str(max_len=256), length=2), max_len=1024))


def _as_is(v: Any) -> Any:
    return v


@dataclass(frozen=True)
class Setting:
    """One row of :data:`SETTINGS`.

    ``name`` is the keyword and attribute; ``key`` the ``research.experiments.*`` default (``None``:
    the keyword's default is ``None``); ``check(name, value, so_far)`` returns the value kept;
    ``journal`` is the JSON type of its header entry (``None``: not journaled) and ``to_json``
    what the header writes (its inverse is the keyword: a header entry is a keyword again);
    ``doc`` is its ``Parameters`` entry: the type on the first line, the description after.
    """

    name: str
    key: str | None
    check: Check
    doc: str
    journal: schema.Checker | None = None
    to_json: Callable[[Any], Any] = _as_is
    keyword: bool = True          # False: derived, not a keyword (the event topic)
    attribute: bool = True        # False: not an attribute of the scheduler (whose .policy is its Policy)


_slots, _slots_expected = _integer(1, MAX_SLOTS)

#: Every setting of the scheduler, in the order they are checked.
SETTINGS: tuple[Setting, ...] = (
    Setting("slots", "slots", _slots, f"int\n    Experiments in flight at once ({_slots_expected}).", _INT),
    Setting("c", "c", _real(_finite_nonneg, "a finite number >= 0 (sqrt 2 is the UCB1 default)"),
            "float\n    UCB1 exploration constant (``>= 0``; default sqrt 2).", _NUMBER),
    Setting("prune_after_runs", "prune-after-runs", _integer(1)[0],
            "int\n    Completed runs before the pruning gate looks at a branch.", _INT),
    Setting("bounded", "bounded-rewards", _flag,
            "bool\n    Rewards lie in [0, 1] (``research.experiments.bounded-rewards``). Then ``prune_floor``\n"
            "    and ``paper_threshold`` must lie in [0, 1] and rewards outside it are failures.",
            schema.Maybe(schema.Bool())),
    Setting("objectives", None, _objectives,
            'dict or list, optional\n    Vector rewards: ``{"accuracy": "max", "cost": "min"}``. The runner then returns a\n'
            "    vector (or a dict keyed by objective); ``prune_floor`` and ``paper_threshold`` may be\n"
            "    dicts of per-objective thresholds, or numbers applied to the weighted mean.",
            _PAIRS, lambda d: list(map(list, d.items())) if d else None),
    Setting("weights", None, _weights,
            "dict or sequence of float, optional\n    Weights of the objectives in the scalar mean (default equal).",
            schema.Maybe(schema.List(schema.Float(), max_len=1024))),
    Setting("prune_floor", "prune-floor", _threshold_check,
            "float\n    A branch whose mean is below this after ``prune_after_runs`` runs is pruned: it is\n"
            "    never selected again and its queued hypotheses are dropped (and listed in the report).",
            _THRESHOLD),
    Setting("paper_threshold", "paper-threshold", _threshold_check,
            "float\n    The first time a branch's mean exceeds this, ``paper.trigger`` is recorded and\n"
            "    ``paper_writer`` (if any) starts in parallel.", _THRESHOLD),
    Setting("failure_limit", "failure-limit", _failure_limit,
            "int, optional\n    Failed experiments a branch may have before it is pruned (``research.experiments.\n"
            "    failure-limit``; ``0`` disables the limit).", _INT, lambda v: v or 0),
    Setting("max_experiments", None, _optional(_integer(0)[0]),
            "int, optional\n    Stop dispatching after this many experiments (this run).", _NUMBER),
    Setting("max_seconds", None, _optional(_real(lambda v: v > 0, "a number > 0 or None")),
            "float, optional\n    Stop dispatching after this many seconds of wall clock (this run).", _NUMBER),
    Setting("timeout", "timeout", _optional(_real(lambda v: math.isfinite(v) and v > 0,
                                                  "a number of seconds > 0, or None for no limit")),
            "float, optional\n    Seconds one experiment may run (``research.experiments.timeout``; ``None``: no\n"
            "    limit). A longer one is cancelled and recorded as a failed experiment\n"
            "    (:mod:`~dask_research.experiments.timeouts`).", _NUMBER),
    Setting("cancel_grace", "cancel-grace", _real(_finite_nonneg, "a number of seconds >= 0"),
            "float, optional\n    With ``max_seconds``: experiments still in flight this many seconds after it passed\n"
            "    are cancelled, not counted, and listed in ``Report.cancelled``\n"
            "    (``research.experiments.cancel-grace``).", _NUMBER),
    Setting("queue_ahead", "queue-ahead", _queue_ahead,
            'int or "auto", optional\n    Decided experiments kept queued behind each running one, so a slot starts its next\n'
            "    experiment the moment one ends instead of idling one round trip to the driver\n"
            '    (``research.experiments.queue-ahead``; ``0``: off). ``"auto"`` (default) queues one ahead on\n'
            "    a Dask cluster from the first decision while the policy's pick does not depend on\n"
            "    results (an untried branch), and once the measured idle gap per experiment exceeds\n"
            "    ``queue_ahead_gap`` of the experiments' typical duration; a queued decision is made\n"
            "    without the results of the experiments running then (:mod:`~dask_research.experiments.ahead`).",
            schema.Maybe(schema.Where(_queue_ahead_json))),
    Setting("queue_ahead_gap", "queue-ahead-gap", _real(lambda v: 0 < v <= 1, "a number in (0, 1]"),
            'float, optional\n    ``queue_ahead="auto"`` queues ahead when the idle gap per experiment exceeds this\n'
            "    fraction of the typical experiment duration (``research.experiments.queue-ahead-gap``).",
            _NUMBER),
    Setting("transport", "transport", _choice("tasks", "actors"),
            '{"actors", "tasks"}, optional\n    How experiments reach a Dask cluster (``research.experiments.transport``):\n'
            "    ``\"actors\"`` (default), one long-lived actor per slot whose experiments run on the thread\n"
            "    of a task Dask counts busy, called directly (``direct_to_workers=True``, or an embedded\n"
            "    ``LocalCluster``) or through the scheduler: little or no scheduler CPU per experiment\n"
            "    (:mod:`~dask_research.experiments.actors`); ``\"tasks\"``, one Dask task each (each in Dask's\n"
            "    task stream, placed by its scheduler). Without a client experiments run in this process\n"
            "    either way.", _TEXT),
    Setting("trace_scores", "trace-scores", _trace_scores,
            'int or "all", optional\n    ``select`` events keep the scores of the best this many branches\n'
            '    (``research.experiments.trace-scores``); ``"all"`` keeps every branch\'s score.'),
    Setting("progress", "progress", _flag,
            "bool, optional\n    Show a progress bar (``research.experiments.progress``): its total is\n"
            "    ``max_experiments`` when given, it ends at 100 % whatever stops the run, and in a\n"
            "    notebook without ipywidgets it is tqdm's text bar (:mod:`.progress_bar`)."),
    Setting("log_events", "log-events", _flag,
            "bool, optional\n    With a client, forward events to the Dask event log under\n"
            "    ``research.experiments.event-topic`` (``research.experiments.log-events``)."),
    Setting("topic", None, lambda name, v, so_far: events.topic("experiments"), "", keyword=False),
    Setting("apply_order", "apply-order", _choice("completion", "dispatch"),
            '{"completion", "dispatch"}, optional\n    ``"completion"`` (default, ``research.experiments.apply-order``) '
            "counts each result\n    when it arrives; ``\"dispatch\"`` buffers early finishers and counts results in "
            "dispatch\n    order, and decision ``k`` waits for the result of decision ``k - slots``, so a run with\n"
            "    deterministic rewards makes the same decisions whatever the completion order (at a\n"
            "    cost in occupancy: see the docs).", _TEXT),
    Setting("gamma", "gamma", _real(lambda v: 0 < v <= 1, "a number in (0, 1]"),
            'float, optional\n    Discount of ``"discounted-ucb"`` per applied result (``research.experiments.gamma``).',
            _NUMBER),
    Setting("alpha", "alpha", _real(_finite_nonneg, "a finite number >= 0"),
            "float, optional\n    LinUCB confidence width (``research.experiments.alpha``).", _NUMBER),
    Setting("seed", "seed", _seed,
            "int, SeedSequence or Generator, optional\n    Seed of randomised policies: Thompson, Pareto UCB1 "
            "(``research.experiments.seed``; journaled as one int, :mod:`dask_research.seeds`).",
            _INT),
    Setting("objective", "objective", _objective,
            '{"mean", "max"}, optional\n    What a branch is worth (``research.experiments.objective``): ``"mean"`` '
            "its average\n    reward; ``\"max\"`` its best single result, for searches that keep only the best\n"
            "    (see :mod:`.objectives`). With ``\"max\"`` and no ``policy`` the policy is\n    ``max_policy``.",
            schema.Maybe(schema.OneOf(*OBJECTIVES))),
    Setting("max_policy", "max-policy", _max_policy,
            '{"threshold-ascent", "quantile-ucb"}, optional\n    Max-bandit policy of ``objective="max"`` '
            "(``research.experiments.max-policy``).", attribute=False),
    Setting("max_quantile", "max-quantile", _real(lambda v: 0 < v < 1, "a number in (0, 1)"),
            "float, optional\n    Quantile level of the quantile bound of ``objective=\"max\"``\n"
            "    (``research.experiments.max-quantile``; :mod:`.maxbandit`).", _NUMBER),
    Setting("max_c", "max-c", _real(_finite_nonneg, "a finite number >= 0"),
            "float, optional\n    Confidence width of the quantile bound of ``objective=\"max\"``\n"
            "    (``research.experiments.max-c``).", _NUMBER),
    Setting("policy", None, _policy,
            'str, Policy or callable, optional\n    ``"ucb1"`` (default, ``research.experiments.policy``), '
            '``"ucb1-tuned"``, ``"kl-ucb"``,\n    ``"thompson"``, ``"discounted-ucb"``, ``"pareto-ucb1"`` (vector '
            'rewards),\n    ``"linucb"`` / ``"linucb-hybrid"`` (hypothesis features), a\n'
            "    :class:`~.policies.Policy`, or ``policy(mean, n, c, total) -> scores`` over numpy\n"
            "    arrays in branch order (for baselines and experiments with policies).",
            _TEXT, lambda v: v if isinstance(v, str) else "custom", attribute=False),
    Setting("checkpoint", None, _checkpoint,
            "str, path or fsspec URL, optional\n    A journal (JSON lines) of the scheduler's state, appended after "
            "every decision; a\n    scheduler created with an existing journal continues from it (see\n"
            "    :meth:`resume` and :mod:`dask_research.experiments.checkpoint`). Its lease\n"
            "    (:mod:`~dask_research.experiments.lock`) makes it this scheduler's alone: a second driver\n"
            "    on it is refused with :class:`CheckpointError` naming the holder."),
)

_BY_NAME = {s.name: s for s in SETTINGS}
#: The scheduler keywords that are settings (in table order).
KEYWORDS = tuple(s.name for s in SETTINGS if s.keyword)

#: What :meth:`SchedulerSettings.header` writes, by JSON type (``null``: the default); the
#: values are then checked as the constructor's keywords are.
HEADER = schema.Obj({}, optional={s.name: s.journal for s in SETTINGS if s.journal is not None})


def check_header(settings: dict[str, Any]) -> dict[str, Any]:
    """The settings of a journal's header if each has the JSON type the header is written with;
    else :class:`~dask_research.durable.schema.Invalid` naming the setting (a name the header
    never holds included).

    >>> check_header({"slots": 2, "apply_order": "dispatch"})
    {'slots': 2, 'apply_order': 'dispatch'}
    >>> check_header({"slots": 1e9})
    Traceback (most recent call last):
    ...
    dask_research.durable.schema.Invalid: slots is 1000000000.0; expected a whole number
    """
    return schema.check(settings, HEADER)


class SchedulerSettings:
    """The validated settings of one :class:`~.loop.IterationScheduler`: one attribute per row
    of :data:`SETTINGS`.

    Built once (:meth:`parse`, :meth:`from_header`); an assignment (``settings.timeout = 1.5``,
    or ``sched.timeout = 1.5``) is checked like the keyword, and the next journal header records it.
    """

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, Any]):
        object.__setattr__(self, "_values", dict(values))

    @classmethod
    def parse(cls, **given: Any) -> SchedulerSettings:
        """Settings from the scheduler's keywords (``None``: ``research.experiments.*``), checked
        in table order; an unknown keyword is an :class:`InputError` naming it."""
        unknown = sorted(set(given) - set(KEYWORDS))
        if unknown:
            raise InputError(unknown[0], given[unknown[0]], "one of the scheduler's settings: " + ", ".join(KEYWORDS),
                             where=_WHERE)
        so_far: dict[str, Any] = {}
        for s in SETTINGS:
            value = given.get(s.name)
            if value is None and s.key is not None:
                value = config.resolve(f"experiments.{s.key}", None)
            so_far[s.name] = s.check(s.name, value, so_far)
        return cls(so_far)

    @classmethod
    def from_header(cls, header: Mapping[str, Any], overrides: Mapping[str, Any] | None = None) -> SchedulerSettings:
        """The settings a journal header records, with ``overrides`` (keywords) on top.

        The header must pass :func:`check_header`; then every value passes the same checks
        as a keyword. Raises :class:`~dask_research.durable.schema.Invalid` or the keyword's
        own error.
        """
        check_header(dict(header))
        given = {k: v for k, v in header.items() if v is not None or k in ("max_experiments", "max_seconds")}
        given.update(overrides or {})
        return cls.parse(**given)

    def header(self) -> dict[str, Any]:
        """What a checkpoint records of these settings: each journaled one as JSON (a custom
        policy is recorded as ``"custom"``)."""
        return {s.name: s.to_json(self._values[s.name]) for s in SETTINGS if s.journal is not None}

    def make_policy(self) -> Policy:
        """The :class:`~.policies.Policy` these settings name (a new one each call)."""
        arg = self.policy
        if isinstance(arg, Policy):
            return arg
        if isinstance(arg, str) and arg in MAX_POLICY_NAMES:
            return make_max_policy(arg, tau=self.max_quantile, c=self.max_c, bounded=self.bounded)
        return make_policy(arg, c=self.c, gamma=self.gamma, alpha=self.alpha, seed=self.seed, bounded=self.bounded)

    def as_dict(self) -> dict[str, Any]:
        """Every setting by name."""
        return dict(self._values)

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"SchedulerSettings has no setting {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        row = _BY_NAME.get(name)
        if row is None or not row.keyword:
            raise AttributeError(f"SchedulerSettings has no setting {name!r} to change")
        if value is None and row.key is not None:
            value = config.resolve(f"experiments.{row.key}", None)
        self._values[name] = row.check(name, value, self._values)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SchedulerSettings) and self._values == other._values

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return "SchedulerSettings(" + ", ".join(f"{k}={v!r}" for k, v in self._values.items()) + ")"


def parameters_doc() -> str:
    """The ``Parameters`` entries of the settings, in table order (for the scheduler's docstring)."""
    return "\n".join(f"{s.name} : {s.doc}" for s in SETTINGS if s.keyword)
