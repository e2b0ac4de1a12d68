"""A hypothesis source that proposes within a branch by an Optuna sampler fitted to its results.

The scheduler picks *branches* (UCB, or a max-bandit policy with ``objective="max"``); an
:class:`OptunaSource` picks *points within one branch*: each branch has its own Optuna study,
asked for a trial when the scheduler picks the branch with nothing queued, and told every
result (or failure) of the branch. Optuna is an optional extra (``pip install
dask-research[optuna]``), imported when the first source is created.

Examples
--------
>>> import optuna
>>> from dask_research.experiments import Branch, IterationScheduler, OptunaSource
>>> space = {"x": optuna.distributions.FloatDistribution(0.0, 1.0)}
>>> sched = IterationScheduler(lambda h: 1 - (h.payload["x"] - 0.3) ** 2, slots=1,
...                            objective="max", max_experiments=12, progress=False)
>>> sched.add([Branch("quad", propose=OptunaSource(space, seed=0))])
>>> report = sched.run()
>>> report.total_runs, report.best
(12, 'quad')
"""
from __future__ import annotations

import itertools
import math
import random
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from ..exceptions import InputError, ResearchError
from .sources import HypothesisSource
from .types import ExperimentResult

__all__ = ["OptunaSource"]


def _key(params: Mapping[str, Any]) -> tuple:
    return tuple(sorted(params.items()))


def _grid(space: Any, optuna: Any) -> list[dict[str, Any]]:
    """Every configuration of a finite dict space (``OptunaSource(unique=True)``)."""
    if not isinstance(space, Mapping):
        raise InputError("space", space, "a dict of IntDistribution / CategoricalDistribution "
                         "with unique=True", where="OptunaSource")
    axes = []
    for name, d in space.items():
        if isinstance(d, optuna.distributions.IntDistribution):
            axes.append([(name, v) for v in range(d.low, d.high + 1, d.step)])
        elif isinstance(d, optuna.distributions.CategoricalDistribution):
            axes.append([(name, v) for v in d.choices])
        else:
            raise InputError("space", name, "IntDistribution or CategoricalDistribution with "
                             "unique=True (a finite space)", where="OptunaSource")
    return [dict(p) for p in itertools.product(*axes)]


def _optuna() -> Any:
    try:
        import optuna
    except ImportError as exc:     # pragma: no cover - depends on the environment
        raise ResearchError("OptunaSource needs the optional dependency optuna; install it with "
                            "`pip install dask-research[optuna]`") from exc
    return optuna


class OptunaSource(HypothesisSource):
    """Propose a branch's hypotheses with an Optuna sampler (ask/tell on one study).

    Parameters
    ----------
    space : dict or callable
        ``{parameter: optuna.distributions.BaseDistribution}`` (the payload is the dict of
        sampled values), or a define-by-run function ``trial -> payload`` that calls
        ``trial.suggest_*``.
    seed : int
        Seed of the default sampler; the same seed and the same sequence of results give the
        same proposals.
    sampler : optuna.samplers.BaseSampler, optional
        Default: ``TPESampler(seed=seed, n_startup_trials=startup, multivariate=True,
        constant_liar=True)`` (the constant liar keeps parallel asks of one branch apart).
    startup : int
        Random trials before the default TPE sampler models the results.
    max_trials : int, optional
        Proposals before the source is exhausted (``None``: never).
    minimize : bool
        The reward is to be minimised (rewards of the scheduler are maximised: default False).
    unique : bool
        Never propose a configuration twice (a dict ``space`` of ``IntDistribution`` and
        ``CategoricalDistribution`` only): a repeat the sampler asks for is told the known
        result without an experiment (or failed, while it is in flight) and the sampler is
        asked again, 20 times, then an unseen configuration is drawn uniformly; the source
        is exhausted once every configuration was proposed. For deterministic rewards on a
        grid, where a repeat is a wasted experiment.

    Notes
    -----
    Results the source did not propose (hypotheses you queued yourself on the branch, or
    results restored from a checkpoint after :meth:`IterationScheduler.resume`) are added to
    the study as completed trials when ``space`` is a dict and the payload holds its
    parameters, so a resumed search continues from what it knew.
    """

    def __init__(self, space: Mapping[str, Any] | Callable[[Any], Any], *, seed: int = 0,
                 sampler: Any = None, startup: int = 5, max_trials: int | None = None,
                 minimize: bool = False, unique: bool = False) -> None:
        optuna = _optuna()
        if not callable(space) and not isinstance(space, Mapping):
            raise InputError("space", space, "a dict {name: optuna distribution} or a function "
                             "trial -> payload", where="OptunaSource")
        if isinstance(space, Mapping):
            bad = [k for k, v in space.items()
                   if not isinstance(v, optuna.distributions.BaseDistribution)]
            if bad:
                raise InputError("space", bad, "optuna.distributions objects for every "
                                 "parameter, e.g. FloatDistribution(1e-3, 1e3, log=True)",
                                 where="OptunaSource")
        if sampler is None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")          # multivariate/constant_liar: experimental
                sampler = optuna.samplers.TPESampler(seed=int(seed), n_startup_trials=startup,
                                                     multivariate=True, constant_liar=True)
        self.space = space
        self.max_trials = max_trials
        direction = "minimize" if minimize else "maximize"
        verbosity = optuna.logging.get_verbosity()
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        try:
            self.study = optuna.create_study(direction=direction, sampler=sampler)
        finally:
            optuna.logging.set_verbosity(verbosity)
        self._trials: dict[str, Any] = {}
        self._asked = 0
        self.unique = bool(unique)
        self._grid = _grid(space, optuna) if self.unique else []
        self._known: dict[tuple, float | None] = {}      # unique: None while in flight
        self._rng = random.Random(seed)

    def propose(self, branch: str) -> Any:
        """One payload from a new trial of the study (``None`` after ``max_trials``, or with
        ``unique`` once every configuration was proposed)."""
        if self.max_trials is not None and self._asked >= self.max_trials:
            return None
        if not self.unique:
            return self._ask(branch)
        if len(self._known) >= len(self._grid):
            return None
        optuna = _optuna()
        for _ in range(20):
            h = self._ask(branch)
            key = _key(h.payload)
            if key not in self._known:
                self._known[key] = None
                return h
            trial, value = self._trials.pop(h.id), self._known[key]
            self._asked -= 1
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if value is None:
                    self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
                else:
                    self.study.tell(trial, value)
        unseen = [p for p in self._grid if _key(p) not in self._known]
        self.study.enqueue_trial(self._rng.choice(unseen))
        h = self._ask(branch)
        self._known[_key(h.payload)] = None
        return h

    def _ask(self, branch: str) -> Any:
        optuna = _optuna()
        verbosity = optuna.logging.get_verbosity()
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if isinstance(self.space, Mapping):
                    trial = self.study.ask(dict(self.space))
                    payload: Any = dict(trial.params)
                else:
                    trial = self.study.ask()
                    payload = self.space(trial)
        finally:
            optuna.logging.set_verbosity(verbosity)
        self._asked += 1
        from .types import Hypothesis

        hid = f"{branch}:optuna-{trial.number}"
        self._trials[hid] = trial
        return Hypothesis(hid, branch, payload)

    def renamed(self, old: str, new: str) -> None:
        """The scheduler gave the hypothesis ``old`` the id ``new`` (``old`` was taken)."""
        if old in self._trials:
            self._trials[new] = self._trials.pop(old)

    def observe(self, result: ExperimentResult) -> None:
        """Tell the study the outcome of one hypothesis of the branch."""
        optuna = _optuna()
        h = result.hypothesis
        ok = result.ok and isinstance(result.reward, (int, float)) and math.isfinite(
            result.reward)
        if self.unique and ok and isinstance(h.payload, Mapping):
            self._known[_key(h.payload)] = float(result.reward)
        trial = self._trials.pop(h.id, None)
        verbosity = optuna.logging.get_verbosity()
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        try:
            if trial is not None:
                if ok:
                    self.study.tell(trial, float(result.reward))
                else:
                    self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
                return
            if ok and isinstance(self.space, Mapping) and isinstance(h.payload, Mapping) and all(
                    k in h.payload for k in self.space):
                params = {k: h.payload[k] for k in self.space}
                try:
                    self.study.add_trial(optuna.trial.create_trial(
                        params=params, distributions=dict(self.space),
                        value=float(result.reward)))
                except ValueError:
                    pass              # the payload is outside the space: not a trial of it
        finally:
            optuna.logging.set_verbosity(verbosity)
