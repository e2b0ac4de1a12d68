"""Plain value types of the experiment scheduler: what runs, what comes back, per-branch state.

A :class:`Hypothesis` is one experiment to run; several hypotheses share a ``branch``, and the
branch is the key of the UCB statistics. A runner turns a hypothesis into an
:class:`ExperimentResult` (also importable as ``Result``, its former name, kept as an alias for
existing code; ``dask_research.montecarlo.Result`` is another thing, a Monte-Carlo estimate).
:class:`BranchStats` is the read-only summary of one branch that reports and callbacks see.

Examples
--------
>>> from dask_research.experiments import ExperimentResult, Hypothesis
>>> h = Hypothesis(id="h1", branch="attention", payload={"lr": 3e-4})
>>> r = ExperimentResult(h, reward=0.8, metrics={"loss": 0.2}, duration=1.5)
>>> r.ok, r.hypothesis.branch
(True, 'attention')
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Hypothesis", "ExperimentResult", "Result", "BranchStats"]


@dataclass(frozen=True)
class Hypothesis:
    """One experiment to run.

    Parameters
    ----------
    id : str
        Unique over the whole scheduler run (duplicates raise :class:`ExperimentError`).
    branch : str
        Research branch; the key of the UCB statistics. Branches are ordered by the first time
        a hypothesis of theirs was added, and ties between equal scores go to the earlier one.
    payload : Any
        Whatever the runner needs (a config dict, a prompt, a path). Must pickle when a Dask
        client runs the experiments.
    features : tuple of float, optional
        Numeric description of the hypothesis (for feature-aware policies; unused by UCB1).
    parent : str, optional
        Id of the hypothesis whose result produced this one (set by expanders).
    generation : int
        0 for hypotheses you add; ``parent.generation + 1`` for follow-ups.

    Examples
    --------
    >>> Hypothesis("h1", "attention", {"heads": 8})  # doctest: +NORMALIZE_WHITESPACE
    Hypothesis(id='h1', branch='attention', payload={'heads': 8}, features=None,
               parent=None, generation=0)
    """

    id: str
    branch: str
    payload: Any = None
    features: tuple[float, ...] | None = None
    parent: str | None = None
    generation: int = 0

    def followup(self, suffix: str, payload: Any = None) -> Hypothesis:
        """A follow-up on the same branch with id ``f"{self.id}{suffix}"``.

        >>> Hypothesis("h1", "a").followup(".1").id
        'h1.1'
        """
        return Hypothesis(
            id=f"{self.id}{suffix}",
            branch=self.branch,
            payload=self.payload if payload is None else payload,
            features=self.features,
            parent=self.id,
            generation=self.generation + 1,
        )


@dataclass(frozen=True)
class ExperimentResult:
    """What one experiment produced.

    Parameters
    ----------
    hypothesis : Hypothesis
        The hypothesis that was run.
    reward : float or sequence of float
        The number UCB maximises; a vector (tuple, or a ``{objective: value}`` dict) when the
        scheduler declares ``objectives``. With bounded rewards
        (``research.experiments.bounded-rewards``, the default) it must lie in [0, 1]
        (every component). ``nan`` for failed experiments.
    metrics : dict
        Anything else worth keeping (losses, paths, seeds).
    duration : float, optional
        Seconds the runner took; filled in by the scheduler when the runner leaves it ``None``.
    error : str, optional
        ``"TypeName: message"`` when the experiment failed; then ``reward`` is ``nan``.

    Examples
    --------
    >>> ExperimentResult(Hypothesis("h1", "a"), 0.5).ok
    True
    >>> ExperimentResult.failure(Hypothesis("h1", "a"), ValueError("diverged")).error
    'ValueError: diverged'
    """

    hypothesis: Hypothesis
    reward: Any
    metrics: dict[str, Any] = field(default_factory=dict)
    duration: float | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """``True`` unless the experiment failed."""
        return self.error is None

    @classmethod
    def failure(
        cls, hypothesis: Hypothesis, error: BaseException | str, duration: float | None = None
    ) -> ExperimentResult:
        """A failed result carrying ``error`` (an exception or a sentence)."""
        if isinstance(error, BaseException):
            text = f"{type(error).__name__}: {error}"
        else:
            text = str(error)
        return cls(hypothesis, math.nan, {}, duration, text)

    def with_duration(self, duration: float) -> ExperimentResult:
        """This result with ``duration`` filled in if it was ``None``."""
        if self.duration is not None:
            return self
        return dataclasses.replace(self, duration=duration)


Result = ExperimentResult
"""The name of :class:`ExperimentResult` before it was renamed (it collided with
``dask_research.montecarlo.Result``); kept so existing code keeps working."""


@dataclass(frozen=True)
class BranchStats:
    """Summary of one research branch at one moment.

    ``runs`` counts completed (successful) experiments, ``reward_sum`` their cumulative reward and
    ``mean`` their average (``nan`` before the first result); ``pending`` counts experiments in
    flight, ``queued`` hypotheses still waiting, ``failures`` experiments that raised. ``pruned``
    is ``None`` or the reason (``"low-mean"``, ``"failures"``); ``paper_emitted`` says whether
    the branch triggered the paper stage. ``best`` is the branch's best (scalar) reward and
    ``best_hypothesis`` the id of the hypothesis that produced it. With vector rewards ``means`` is ``{objective: mean}``
    as reported, and ``mean``/``reward_sum`` are the weighted scalarisation (``"min"``
    objectives flipped: ``1 - x`` for bounded rewards, ``-x`` otherwise).

    Examples
    --------
    >>> BranchStats(runs=2, reward_sum=1.5, mean=0.75, pending=1, pruned=None,
    ...             paper_emitted=True).mean
    0.75
    """

    runs: int
    reward_sum: float
    mean: float
    pending: int
    pruned: str | None
    paper_emitted: bool
    queued: int = 0
    failures: int = 0
    means: dict[str, float] | None = None
    best: float = math.nan
    best_hypothesis: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (``mean`` is ``None`` before the first result)."""
        d = dataclasses.asdict(self)
        if math.isnan(self.mean):
            d["mean"] = None
        if math.isnan(self.best):
            d["best"] = None
        if self.means is None:
            d.pop("means")
        else:
            d["means"] = {k: (None if math.isnan(v) else v) for k, v in self.means.items()}
        return d
