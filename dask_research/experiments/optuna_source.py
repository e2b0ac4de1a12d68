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

import math
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from ..exceptions import InputError, ResearchError
from .sources import HypothesisSource
from .types import ExperimentResult

__all__ = ["OptunaSource"]


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

    Notes
    -----
    Results the source did not propose (hypotheses you queued yourself on the branch, or
    results restored from a checkpoint after :meth:`IterationScheduler.resume`) are added to
    the study as completed trials when ``space`` is a dict and the payload holds its
    parameters, so a resumed search continues from what it knew.
    """

    def __init__(self, space: Mapping[str, Any] | Callable[[Any], Any], *, seed: int = 0,
                 sampler: Any = None, startup: int = 5, max_trials: int | None = None,
                 minimize: bool = False) -> None:
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

    def propose(self, branch: str) -> Any:
        """One payload from a new trial of the study (``None`` after ``max_trials``)."""
        if self.max_trials is not None and self._asked >= self.max_trials:
            return None
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
