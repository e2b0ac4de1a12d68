"""The driver: pick a branch, start an experiment, record the result, repeat.

:class:`IterationScheduler` owns a :class:`~.ledger.BranchLedger` (queues and statistics), asks
the policy for a branch whenever a slot is free, starts the branch's oldest queued hypothesis
on a backend (asyncio tasks, or Dask futures with a client), and on every result applies the
gates in order: pruning, paper trigger, expansion. It never blocks behind one experiment: it
sleeps until *any* experiment finishes and refills the freed slot at once.
"""
from __future__ import annotations

import asyncio
import heapq
import inspect
import math
import os
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from .. import config
from ..exceptions import CheckpointError, ExperimentError, InputError
from . import objectives as _objectives
from . import policies
from .asktell import AskTellSession
from .backends import DaskBackend, LocalBackend
from .checkpoint import Journal, hypothesis_to_json
from .events import Event, Trace, _jsonable, top_scores
from .execute import is_async_callable
from .ledger import BranchLedger, ScoreFn
from .limits import check_batch_memory
from .maxbandit import MAX_POLICY_NAMES, make_max_policy
from .options import number as _number
from .options import parse_objectives, parse_threshold, parse_weights
from .pareto import pareto_front
from .progress import ProgressBar
from .report import Report
from .resume import Restored, restore
from .scoring import Policy, make_policy
from .sources import Branch, SourceTable, add_branches
from .timeouts import Deadlines, ExperimentTimeout
from .types import BranchStats, Hypothesis, Result

__all__ = ["IterationScheduler"]

_LOG_TOP_SCORES = 32   # select events in the Dask event log carry the best 32 scores
_CANCELLED = object()  # outcome of an experiment cancelled at the run's deadline: not counted


def _trace_scores(value: Any) -> int | None:
    """``research.experiments.trace-scores``: an int >= 1, or None / "all" for every score."""
    value = config.get("experiments.trace-scores", value)
    if value is None or value == "all":
        return None
    _number("trace_scores", value, 'an integer >= 1, or "all" (every branch\'s score)',
            lambda v: v >= 1 and v == int(v))
    return int(value)


class IterationScheduler:
    """UCB iteration scheduler: hypotheses in branches feed ``slots`` parallel experiments.

    Every keyword that is ``None`` is read from ``research.experiments.*`` in ``dask.config``
    when the scheduler is created.

    Parameters
    ----------
    runner : callable or None
        ``Hypothesis -> Result``, sync or ``async def`` (``None`` for a scheduler used only
        by :meth:`ask` / :meth:`tell`). It may also return a bare reward
        (a number) or a ``(reward, metrics)`` pair; the scheduler wraps it and measures the
        duration. Exceptions and unusable returns become failed results; they never stop the
        loop. With a client the runner must pickle.
    slots : int
        Experiments in flight at once (``>= 1``).
    c : float
        UCB1 exploration constant (``>= 0``; default sqrt 2).
    prune_after_runs : int
        Completed runs before the pruning gate looks at a branch.
    prune_floor : float
        A branch whose mean is below this after ``prune_after_runs`` runs is pruned: it is
        never selected again and its queued hypotheses are dropped (and listed in the report).
    paper_threshold : float
        The first time a branch's mean exceeds this, ``paper.trigger`` is recorded and
        ``paper_writer`` (if any) starts in parallel.
    expander : callable, optional
        ``Result -> list[Hypothesis]``, called on every successful result; its hypotheses are
        queued (e.g. :data:`~.runners.deterministic_expander`). Keep it pure and cheap: it runs
        on the loop.
    paper_writer : callable, optional
        ``(branch, stats, best_result) -> anything``, sync or ``async def``; runs as a task
        (or a Dask future) and never blocks the loop. Its return values are in
        ``report.papers``; the run waits for unfinished writers before returning.
    max_experiments : int, optional
        Stop dispatching after this many experiments (this run).
    max_seconds : float, optional
        Stop dispatching after this many seconds of wall clock (this run).
    client : distributed.Client, optional
        Run experiments as Dask futures on this client (sync or asynchronous). Without one
        they run as asyncio tasks in this process (sync runners in a thread per slot).
    failure_limit : int, optional
        Failed experiments a branch may have before it is pruned (``research.experiments.
        failure-limit``; ``0`` disables the limit).
    bounded : bool, optional
        Rewards lie in [0, 1] (``research.experiments.bounded-rewards``). Then ``prune_floor``
        and ``paper_threshold`` must lie in [0, 1] and rewards outside it are failures.
    progress : bool, optional
        Show a progress bar (``research.experiments.progress``): its total is
        ``max_experiments`` when given, it ends at 100 % whatever stops the run, and in a
        notebook without ipywidgets it is tqdm's text bar (:mod:`.progress`).
    policy : callable, optional
        ``policy(mean, n, c, total) -> scores`` over numpy arrays in branch order
        (default :func:`~.policies.ucb1_scores`); for baselines and experiments with policies.
    log_events : bool, optional
        With a client, forward events to the Dask event log under
        ``research.experiments.event-topic`` (``research.experiments.log-events``).
    policy : str, Policy or callable, optional
        ``"ucb1"`` (default, ``research.experiments.policy``), ``"ucb1-tuned"``, ``"kl-ucb"``,
        ``"thompson"``, ``"discounted-ucb"``, ``"pareto-ucb1"`` (vector rewards),
        ``"linucb"`` / ``"linucb-hybrid"`` (hypothesis features), a
        :class:`~.scoring.Policy`, or ``policy(mean, n, c, total) -> scores`` over numpy
        arrays in branch order (for baselines and experiments with policies).
    gamma : float, optional
        Discount of ``"discounted-ucb"`` per applied result (``research.experiments.gamma``).
    alpha : float, optional
        LinUCB confidence width (``research.experiments.alpha``).
    seed : int, optional
        Seed of randomised policies: Thompson, Pareto UCB1 (``research.experiments.seed``).
    objectives : dict or list, optional
        Vector rewards: ``{"accuracy": "max", "cost": "min"}``. The runner then returns a
        vector (or a dict keyed by objective); ``prune_floor`` and ``paper_threshold`` may be
        dicts of per-objective thresholds, or numbers applied to the weighted mean.
    weights : dict or sequence of float, optional
        Weights of the objectives in the scalar mean (default equal).
    apply_order : {"completion", "dispatch"}, optional
        ``"completion"`` (default, ``research.experiments.apply-order``) counts each result
        when it arrives; ``"dispatch"`` buffers early finishers and counts results in dispatch
        order, and decision ``k`` waits for the result of decision ``k - slots``, so a run with
        deterministic rewards makes the same decisions whatever the completion order (at a
        cost in occupancy: see the docs).
    checkpoint : str, path or fsspec URL, optional
        A journal (JSON lines) of the scheduler's state, appended after every decision; a
        scheduler created with an existing journal continues from it (see
        :meth:`resume` and :mod:`dask_research.experiments.checkpoint`). A local journal is
        locked for this scheduler (:mod:`~dask_research.experiments.lock`): a second driver
        on it is refused with :class:`CheckpointError` naming the holder.
    timeout : float, optional
        Seconds one experiment may run (``research.experiments.timeout``; ``None``: no
        limit). A longer one is cancelled and recorded as a failed experiment
        (:mod:`~dask_research.experiments.timeouts`).
    cancel_grace : float, optional
        With ``max_seconds``: experiments still in flight this many seconds after it passed
        are cancelled, not counted, and listed in ``Report.cancelled``
        (``research.experiments.cancel-grace``).
    trace_scores : int or "all", optional
        ``select`` events keep the scores of the best this many branches
        (``research.experiments.trace-scores``); ``"all"`` keeps every branch's score.
    objective : {"mean", "max"}, optional
        What a branch is worth (``research.experiments.objective``): ``"mean"`` its average
        reward; ``"max"`` its best single result, for searches that keep only the best
        (see :mod:`.objectives`). With ``"max"`` and no ``policy`` the policy is
        ``max_policy``.
    max_policy : {"threshold-ascent", "quantile-ucb"}, optional
        Max-bandit policy of ``objective="max"`` (``research.experiments.max-policy``).
    max_quantile, max_c : float, optional
        Quantile level and confidence width of the quantile bound of ``objective="max"``
        (``research.experiments.max-quantile``, ``max-c``; :mod:`.maxbandit`).

    Examples
    --------
    >>> from dask_research.experiments import (Hypothesis, IterationScheduler,
    ...                                        make_deterministic_runner)
    >>> runner = make_deterministic_runner({"attention": 0.8, "recurrence": 0.1}, delay_ms=1)
    >>> sched = IterationScheduler(runner, slots=3, progress=False)
    >>> sched.add([Hypothesis(f"{b}-{k}", b) for k in range(4)
    ...            for b in ("attention", "recurrence")])
    >>> report = sched.run()                 # or: report = await sched.run_async()
    >>> report.stop_reason, report.branches["recurrence"].pruned, report.paper_triggers
    ('queue_empty', 'low-mean', ['attention'])
    """

    def __init__(
        self,
        runner: Callable[[Hypothesis], Any],
        slots: int | None = None,
        c: float | None = None,
        prune_after_runs: int | None = None,
        prune_floor: float | None = None,
        paper_threshold: float | None = None,
        expander: Callable[[Result], Iterable[Hypothesis]] | None = None,
        paper_writer: Callable[..., Any] | None = None,
        max_experiments: int | None = None,
        max_seconds: float | None = None,
        client: Any = None,
        failure_limit: int | None = None,
        bounded: bool | None = None,
        progress: bool | None = None,
        policy: str | Policy | ScoreFn | None = None,
        log_events: bool | None = None,
        checkpoint: str | os.PathLike[str] | None = None,
        gamma: float | None = None,
        alpha: float | None = None,
        seed: int | None = None,
        objectives: Any = None,
        weights: Any = None,
        apply_order: str | None = None,
        timeout: float | None = None,
        cancel_grace: float | None = None,
        trace_scores: int | str | None = None,
        objective: str | None = None,
        max_policy: str | None = None,
        max_quantile: float | None = None,
        max_c: float | None = None,
    ):
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
        self.runner = runner
        self.slots = int(_number("slots", config.get("experiments.slots", slots),
                                 "an integer >= 1", lambda v: v >= 1 and v == int(v)))
        self.c = float(_number("c", config.get("experiments.c", c),
                               "a finite number >= 0 (sqrt 2 is the UCB1 default)",
                               lambda v: math.isfinite(v) and v >= 0))
        self.prune_after_runs = int(_number(
            "prune_after_runs", config.get("experiments.prune-after-runs", prune_after_runs),
            "an integer >= 1", lambda v: v >= 1 and v == int(v)))
        self.bounded = bool(config.get("experiments.bounded-rewards", bounded))
        pairs = parse_objectives(objectives)
        self.objectives: dict[str, str] | None = dict(pairs) if pairs else None
        self.weights = parse_weights(weights, self.objectives)
        in_range = (lambda v: 0.0 <= v <= 1.0) if self.bounded else math.isfinite
        expected = ("a number in [0, 1] (rewards are bounded; pass bounded=False for other "
                    "reward scales)") if self.bounded else "a finite number"
        self.prune_floor = parse_threshold(
            "prune_floor", config.get("experiments.prune-floor", prune_floor), self.objectives,
            expected, in_range)
        self.paper_threshold = parse_threshold(
            "paper_threshold", config.get("experiments.paper-threshold", paper_threshold),
            self.objectives, expected, in_range)
        limit = config.get("experiments.failure-limit", failure_limit)
        self.failure_limit = int(_number("failure_limit", limit, "an integer >= 0 (0: no limit)",
                                         lambda v: v >= 0 and v == int(v))) or None
        if max_experiments is not None:
            _number("max_experiments", max_experiments, "an integer >= 0 or None",
                    lambda v: v >= 0 and v == int(v))
        if max_seconds is not None:
            _number("max_seconds", max_seconds, "a number > 0 or None", lambda v: v > 0)
        timeout = config.get("experiments.timeout", timeout)
        if timeout is not None:
            _number("timeout", timeout, "a number of seconds > 0, or None for no limit",
                    lambda v: math.isfinite(v) and v > 0)
        self.timeout: float | None = None if timeout is None else float(timeout)
        self.cancel_grace = float(_number(
            "cancel_grace", config.get("experiments.cancel-grace", cancel_grace),
            "a number of seconds >= 0", lambda v: math.isfinite(v) and v >= 0))
        self.trace_scores = _trace_scores(trace_scores)
        self.max_experiments = max_experiments
        self.max_seconds = max_seconds
        self.expander = expander
        self.paper_writer = paper_writer
        self.client = client
        self.progress = bool(config.get("experiments.progress", progress))
        self.log_events = bool(config.get("experiments.log-events", log_events))
        self.topic: str = config.get("experiments.event-topic")
        order = config.get("experiments.apply-order", apply_order)
        if order not in ("completion", "dispatch"):
            raise InputError("apply_order", order, '"completion" or "dispatch"',
                             where="IterationScheduler")
        self.apply_order: str = order
        self.gamma = float(_number("gamma", config.get("experiments.gamma", gamma),
                                   "a number in (0, 1]", lambda v: 0 < v <= 1))
        self.alpha = float(_number("alpha", config.get("experiments.alpha", alpha),
                                   "a finite number >= 0",
                                   lambda v: math.isfinite(v) and v >= 0))
        self.seed = int(_number("seed", config.get("experiments.seed", seed), "an integer",
                                lambda v: v == int(v)))
        self.objective = _objectives.check_objective(config.get("experiments.objective",
                                                                objective))
        self.max_quantile = float(_number(
            "max_quantile", config.get("experiments.max-quantile", max_quantile),
            "a number in (0, 1)", lambda v: 0 < v < 1))
        self.max_c = float(_number("max_c", config.get("experiments.max-c", max_c),
                                   "a finite number >= 0", lambda v: math.isfinite(v) and v >= 0))
        if self.objective == "max" and policy is None:
            policy = config.get("experiments.max-policy", max_policy)
            if policy not in MAX_POLICY_NAMES:
                raise InputError("max_policy", policy, "one of " + ", ".join(
                    map(repr, MAX_POLICY_NAMES)), where="IterationScheduler")
        if self.objective == "max" and self.objectives is not None:
            raise InputError("objective", "max", '"mean" with vector rewards (objectives=); '
                             "the best-of-branch objective needs scalar rewards",
                             where="IterationScheduler")
        self._policy_arg = config.get("experiments.policy", policy)
        self._sources = SourceTable()
        self._session: AskTellSession | None = None
        if checkpoint is not None and not isinstance(checkpoint, (str, os.PathLike)):
            raise InputError("checkpoint", checkpoint, "a file path (str or os.PathLike), an "
                             "fsspec URL, or None", where="IterationScheduler")
        self.checkpoint = checkpoint
        self.ledger = self._new_ledger()
        self.policy: Policy = self.ledger.policy
        self._journal: Journal | None = None
        self._restored: Restored | None = None
        self._known: dict[str, str] = {}          # ids restored from the checkpoint -> branch
        self._running = False
        self._dropped: list[str] = []
        self._trace: Trace | None = None
        self._t0 = 0.0
        self._carry: list[Hypothesis] = []        # cancelled at the last run's deadline
        if checkpoint is not None:                # a bad checkpoint raises before anything runs
            journal = Journal(checkpoint)
            journal.acquire()                     # one driver per journal: refused at once
            try:
                state = journal.load(lazy=True)   # one record at a time into the ledger
                if state is not None:
                    self._restored = restore(state, self.ledger, journal.url)
                    self._known = self._restored.ids
            except BaseException:
                journal.release()
                raise
            self._journal = journal
            weakref.finalize(self, journal.release)

    # -- construction helpers -----------------------------------------------------------
    def _new_ledger(self) -> BranchLedger:
        arg = self._policy_arg
        if isinstance(arg, Policy):
            pol = arg
        elif isinstance(arg, str) and arg in MAX_POLICY_NAMES:
            pol = make_max_policy(arg, tau=self.max_quantile, c=self.max_c, bounded=self.bounded)
        else:
            pol = make_policy(arg, c=self.c, gamma=self.gamma, alpha=self.alpha,
                              seed=self.seed, bounded=self.bounded)
        pairs = list(self.objectives.items()) if self.objectives else None
        if self.objectives is not None and isinstance(arg, str) and arg == "ucb1":
            pass               # scalarised UCB1 over the weighted mean is allowed
        return BranchLedger(self.c, pol, objectives=pairs, weights=self.weights,
                            bounded=self.bounded)

    def _settings(self) -> dict[str, Any]:
        """Constructor settings recorded in the checkpoint header (for :meth:`resume`)."""
        arg = self._policy_arg
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

    @classmethod
    def resume(cls, path: str | os.PathLike[str],
               runner: Callable[[Hypothesis], Any] | None = None,
               **kwargs: Any) -> IterationScheduler:
        """A scheduler continuing the run journaled at ``path`` (call ``.run()`` on it).

        Settings come from the checkpoint's header; keywords override them (pass the
        ``expander``, ``paper_writer`` or ``client`` again: functions are not journaled).
        Statistics, queues, prunes, paper flags and the trace are as at the last decision;
        experiments in flight at the crash run again first, once each; ``max_experiments``
        and ``max_seconds`` count what was already spent.

        Examples
        --------
        >>> sched = IterationScheduler.resume("runs/loop.jsonl", runner)   # doctest: +SKIP
        >>> report = sched.run()                                          # doctest: +SKIP
        """
        state = Journal(path).load(lazy=True)         # the header's settings only
        where = os.fspath(path)
        if state is None:
            raise CheckpointError(where, "does not exist or is empty; nothing to resume (start "
                                         "a run with IterationScheduler(..., checkpoint=path))")
        settings = {k: v for k, v in state.settings.items() if v is not None or k in (
            "max_experiments", "max_seconds")}
        if settings.get("policy") == "custom" and "policy" not in kwargs:
            raise CheckpointError(where, "was written with a custom policy object or function; "
                                         "pass it again: IterationScheduler.resume(path, runner, "
                                         "policy=my_policy)")
        settings.update(kwargs)
        known = set(inspect.signature(cls.__init__).parameters)
        extra = sorted(set(settings) - known)
        if extra:
            raise CheckpointError(where, f"its settings name unknown parameters {extra}; it "
                                         "was written by another version")
        try:
            return cls(runner, checkpoint=path, **settings)
        except (InputError, ExperimentError) as exc:
            name = getattr(exc, "name", None)
            if name in kwargs:                  # the caller's own override: their error
                raise
            raise CheckpointError(where, f"holds a setting that cannot be used ({exc}); the "
                                         "file is damaged or was edited") from exc

    def close(self) -> None:
        """Release the checkpoint's lock (a run releases it when it ends; the next ``add`` or
        ``run`` takes it again if no other driver wrote to the journal meanwhile)."""
        if self._journal is not None:
            self._journal.close()

    def __enter__(self) -> IterationScheduler:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "dask" if self.client is not None else "asyncio"
        return (f"<IterationScheduler {mode}: {len(self.ledger.branches)} branches, "
                f"{self.ledger.total_queued} queued, slots={self.slots}, c={self.c:g}>")

    # -- input --------------------------------------------------------------------------
    def add(self, hypotheses: Hypothesis | Branch | Iterable[Hypothesis | Branch]) -> None:
        """Queue hypotheses (before a run, or from the loop's thread while it runs).

        :class:`~.sources.Branch` objects register lazy sources: the branch is proposed to
        when it is picked with nothing queued (see :mod:`.sources`).

        Raises :class:`ExperimentError` for duplicate ids (within the batch or with anything
        added before) and for objects that are not :class:`Hypothesis`; then nothing is queued.
        Hypotheses for an already pruned branch are dropped and recorded (``drop`` event).
        With a checkpoint, payloads must be JSON values, and hypotheses already in the
        checkpoint (same id and branch) are skipped, so re-adding the same list resumes.
        """
        if isinstance(hypotheses, (Hypothesis, Branch)):
            hypotheses = [hypotheses]
        batch = add_branches(self, hypotheses)
        if self._known:
            fresh = []
            for h in batch:
                branch = self._known.get(getattr(h, "id", None))  # type: ignore[arg-type]
                if branch is None:
                    fresh.append(h)
                elif branch != h.branch:
                    raise CheckpointError(
                        self._journal.url if self._journal else "?",
                        f"hypothesis {h.id!r} is on branch {branch!r} in the checkpoint but on "
                        f"{h.branch!r} here; the checkpoint belongs to another run")
            batch = fresh
        self._queue(batch)

    def _queue(self, batch: list[Hypothesis]) -> list[Hypothesis]:
        """Validate, journal, then queue ``batch``; returns the hypotheses dropped."""
        BranchLedger.check(batch, self.ledger.ids)
        self.ledger._check_features(batch)
        check_batch_memory(batch)
        if self._journal is not None and batch:
            self._journal_write({"kind": "hyps", "hyps": [hypothesis_to_json(h) for h in batch]})
        dropped = self.ledger.add(batch)
        if dropped:
            self._dropped.extend(h.id for h in dropped)
            if self._running:
                for h in dropped:
                    self._emit("drop", branch=h.branch, hypothesis=h.id, reason="pruned")
        return dropped

    def _journal_write(self, rec: dict[str, Any]) -> None:
        journal = self._journal
        assert journal is not None
        journal.open(self._settings())
        journal.append(rec)

    @property
    def stats(self) -> dict[str, BranchStats]:
        """``{branch: BranchStats}`` now."""
        return self.ledger.snapshot()

    # -- running ------------------------------------------------------------------------
    def run(self) -> Report:
        """Run until the queue is empty or a budget stops dispatching; returns the report.

        Without a client this runs its own event loop (in a helper thread if one is already
        running here, as in Jupyter). With a synchronous client the driver runs on the
        client's loop. With an asynchronous client use ``await run_async()``.
        """
        self._check_runnable()
        if self.client is None:
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                return asyncio.run(self.run_async())
            box: dict[str, Any] = {}

            def target() -> None:
                try:
                    box["report"] = asyncio.run(self.run_async())
                except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
                    box["error"] = exc

            t = threading.Thread(target=target, name="IterationScheduler")
            t.start()
            t.join()
            if "error" in box:
                raise box["error"]
            return box["report"]
        if getattr(self.client, "asynchronous", False) or getattr(self.client, "_asynchronous",
                                                                  False):
            raise ExperimentError(
                "the client is asynchronous; use `report = await sched.run_async()` instead of "
                "sched.run()")
        return self.client.sync(self._drive)

    async def run_async(self) -> Report:
        """Coroutine version of :meth:`run` (for asynchronous clients and notebooks)."""
        self._check_runnable()
        if self.client is None:
            return await self._drive()
        from distributed.utils import in_async_call

        if in_async_call(self.client.loop):
            return await self._drive()
        cf = asyncio.run_coroutine_threadsafe(self._drive(), self.client.loop.asyncio_loop)
        return await asyncio.wrap_future(cf)

    def _check_runnable(self) -> None:
        if self.runner is None:
            raise ExperimentError("this scheduler has no runner (runner=None); drive it with "
                                  "ask() and tell(), or create it with a runner to run()")
        if self._session is not None:
            raise ExperimentError("this scheduler is in an ask/tell session; keep using ask() "
                                  "and tell() (or resume its checkpoint in a new scheduler)")

    # -- ask/tell (see .asktell) -----------------------------------------------------------
    def ask(self) -> Hypothesis:
        """The hypothesis to run next (the policy's pick); it counts as in flight until
        :meth:`tell`. Raises :class:`ExperimentError` when nothing is queued and no source is
        live, or a budget is spent."""
        if self._running:
            raise ExperimentError("run() is in progress; ask() is for schedulers your own loop "
                                  "drives")
        if self._session is None:
            self._session = AskTellSession(self)
        return self._session.ask()

    def tell(self, hypothesis: Hypothesis | str, outcome: Any,
             duration: float | None = None) -> Result:
        """Record the outcome of an asked hypothesis (or its id): a reward, a
        ``(reward, metrics)`` pair or a :class:`Result` (``Result.failure(h, exc)`` for a
        failed experiment). Applies the gates as :meth:`run` does; returns the Result."""
        if self._session is None:
            raise ExperimentError(f"tell for {getattr(hypothesis, 'id', hypothesis)!r} before "
                                  "any ask(); ask() first")
        return self._session.tell(hypothesis, outcome, duration)

    def report(self) -> Report:
        """The :class:`Report` of the ask/tell session so far (also flushes the journal)."""
        if self._session is None:
            raise ExperimentError("no ask/tell session yet; report() follows ask()/tell() "
                                  "(run() returns its own report)")
        return self._session.report()

    # -- the loop -----------------------------------------------------------------------
    def _now(self) -> float:
        return time.perf_counter() - self._t0

    def _emit(self, kind: str, branch: str | None = None, hypothesis: str | None = None,
              slot: int | None = None, scores: Any = None, journal: dict | None = None,
              chosen: int = 0, **data: Any) -> None:
        trace = self._trace
        assert trace is not None
        data["queued"] = self.ledger.n_queued
        ev = Event(len(trace._events), time.perf_counter() - self._t0, kind, branch,
                   hypothesis, slot, data, scores)
        if scores is not None:
            ev.scored = len(scores)
            k = self.trace_scores
            if k is not None and k < len(scores):     # bounded: the best k, not every branch
                ev.scores, ev.top = None, top_scores(scores, k, chosen)
        trace._events.append(ev)
        if self._journal is not None:
            rec: dict[str, Any] = {"seq": ev.seq, "t": ev.t, "kind": kind}
            for key, value in (("branch", branch), ("hypothesis", hypothesis), ("slot", slot)):
                if value is not None:
                    rec[key] = value
            rec.update(data)
            if journal:
                rec.update(journal)
            self._journal_write({"kind": "event", "e": rec})

    def _budget_reason(self, dispatched: int) -> str | None:
        if self.max_experiments is not None and dispatched >= self.max_experiments:
            return "max_experiments"
        if self.max_seconds is not None and self._now() >= self.max_seconds:
            return "max_seconds"
        return None

    async def _drive(self) -> Report:  # noqa: C901 - the loop reads best in one piece
        if self._running:
            raise ExperimentError("this scheduler is already running; one run at a time")
        self._running = True
        restored, self._restored = self._restored, None
        run_id = uuid.uuid4().hex[:12]
        ledger = self.ledger
        self._t0 = time.perf_counter() - (restored.elapsed if restored else 0.0)
        trace = self._trace = Trace(self.slots, ledger.branches, started_at=time.time())
        results: list[Result] = []
        failed: list[Result] = []
        triggers: list[str] = []
        papers: dict[str, Any] = {}
        retry: deque[Hypothesis] = deque()
        spent = 0
        if restored is not None:
            trace._events.extend(restored.events)
            results.extend(restored.results)
            failed.extend(restored.failed)
            triggers.extend(restored.triggers)
            papers.update(restored.papers)
            self._dropped[:0] = restored.dropped
            retry.extend(restored.retry)
            spent = restored.spent
        retry.extend(self._carry)                 # cancelled at the last deadline: again first
        self._carry = []
        deadlines = Deadlines(self.timeout)
        cancelled: list[str] = []
        timed_out: list[str] = []
        hard = None if self.max_seconds is None else self.max_seconds + self.cancel_grace
        side: list[asyncio.Future] = []
        objectives = tuple(self.objectives) if self.objectives else None
        if self.client is None:
            backend: LocalBackend | DaskBackend = LocalBackend(self.runner, self.slots,
                                                               self.bounded, objectives)
        else:
            backend = DaskBackend(self.client, self.runner, self.bounded,
                                  self.topic if self.log_events else None, run_id, objectives)
        bar = self._progress_bar(len(results) + len(failed))
        free = list(range(self.slots))
        inflight: dict[Any, tuple[Hypothesis, int, int]] = {}
        buffered: dict[int, tuple[Hypothesis, int, Any]] = {}
        by_dispatch = self.apply_order == "dispatch"
        seq = {"next": 0, "applied": 0}      # dispatch sequence numbers of this run
        stop_reason: str | None = None
        dispatched = 0
        shipped = 0

        def fill() -> None:
            """Fill every free slot (budgets are checked only when there is work)."""
            nonlocal stop_reason
            while free and stop_reason is None:
                if by_dispatch and seq["next"] - seq["applied"] >= self.slots:
                    return                    # decision k waits for result k - slots
                if not retry and not ledger.has_work():
                    return
                reason = self._budget_reason(spent + dispatched)
                if reason is not None:
                    stop_reason = reason
                    self._emit("stop", reason=reason, in_flight=len(inflight))
                    return
                if retry:                     # in flight at the crash: again, once
                    start(retry.popleft(), requeued=True)
                    continue
                i, scores = ledger.select()  # type: ignore[misc]
                if not ledger.queued[i] and not self._sources.propose(self, i):
                    continue                  # its source is exhausted: decide again
                h = ledger.pop(i)
                extra = self._select_data(i, h)
                rng = self.policy.rng_state()
                self._emit("select", h.branch, h.id, None, scores, score=float(scores[i]),
                           journal=None if rng is None else {"rng": rng}, chosen=i, **extra)
                start(h)

        def start(h: Hypothesis, **data: Any) -> None:
            """Hand ``h`` to the backend on the lowest free slot. The dispatch event is stamped
            as the hand-off begins: from here the slot is committed, and the hand-off itself
            (Dask's ``client.submit`` packs and pickles the task) is transport, like the round
            trip, not decision time."""
            nonlocal dispatched
            slot = heapq.heappop(free)
            self._emit("dispatch", h.branch, h.id, slot, **data)
            try:
                token = backend.submit(h)
            except Exception as exc:
                raise ExperimentError(
                    f"could not start hypothesis {h.id!r} on branch {h.branch!r}: "
                    f"{type(exc).__name__}: {exc}" + ("; with a client the runner and every "
                    "payload must pickle" if self.client is not None else ""),
                    id=h.id, branch=h.branch) from exc
            inflight[token] = (h, slot, seq["next"])
            deadlines.start(token, self._now())
            seq["next"] += 1
            dispatched += 1

        def settle(token: Any, outcome: Any) -> None:
            """Book one finished experiment and refill its slot at once, before the books
            of any other finished experiment (so a slot waits for its own bookkeeping only)."""
            h, slot, k = inflight.pop(token)
            deadlines.discard(token)
            heapq.heappush(free, slot)
            if not by_dispatch:
                if outcome is not _CANCELLED:
                    self._on_outcome(h, slot, outcome, results, failed, triggers, papers,
                                     side, backend)
                fill()
                return
            if outcome is not _CANCELLED:
                self._emit("finish", h.branch, h.id, slot)
            buffered[k] = (h, slot, outcome)
            while seq["applied"] in buffered:   # apply in dispatch order, and make decision
                hh, ss, oo = buffered.pop(seq["applied"])   # k right after result k - slots
                seq["applied"] += 1
                if oo is not _CANCELLED:        # a cancelled one is skipped, not waited for
                    self._on_outcome(hh, ss, oo, results, failed, triggers, papers, side,
                                     backend)
                fill()

        crashed: list[BaseException] = []

        def on_finish(token: Any, outcome: Any) -> None:
            """Completion hook of the local backend: runs inside the finished experiment's own
            task, so the slot is refilled without waiting for the driver to wake up."""
            if crashed or token not in inflight:
                return
            try:
                settle(token, outcome)
            except BaseException as exc:  # noqa: BLE001 - re-raised by the driver
                crashed.append(exc)

        if isinstance(backend, LocalBackend):
            backend.on_finish = on_finish

        try:
            if ledger.total_queued or retry:
                self._emit("add", n=ledger.total_queued, nbranches=len(ledger.branches),
                           **({"requeued": [h.id for h in retry]} if retry else {}))
            if restored is not None and self.paper_writer is not None:
                for b in restored.triggers:        # triggered, but no paper before the crash
                    if b not in papers and b in restored.trigger_results:
                        i = ledger.branch_index(b)
                        side.append(self._start_paper(b, ledger.stats(i),
                                                      restored.trigger_results[b], papers,
                                                      backend))
            while True:
                # 1. fill every free slot
                fill()
                if stop_reason is None and ledger.has_work() and not free:
                    reason = self._budget_reason(spent + dispatched)
                    if reason is not None:
                        stop_reason = reason
                        self._emit("stop", reason=reason, in_flight=len(inflight))
                if self.log_events and self.client is not None:
                    backend.ship(self._records(trace, shipped, run_id))
                    shipped = len(trace)
                if not inflight:
                    break
                # 2. sleep until any experiment finishes (or the wall-clock budget runs out)
                now = self._now()
                waits = [deadlines.next_in(now)]
                if hard is not None:
                    waits.append(max(0.0, hard - now))
                if (self.max_seconds is not None and stop_reason is None
                        and ledger.has_work()):
                    waits.append(max(0.0, self.max_seconds - now))
                timeout = min((w for w in waits if w is not None), default=None)
                for token, outcome in await backend.wait(timeout):
                    if token in inflight:       # not yet settled by the completion hook
                        settle(token, outcome)
                if crashed:
                    raise crashed[0]
                # 3. experiments past their timeout fail; past the run's deadline, all stop
                for token in deadlines.expired(self._now()):
                    if token in inflight:
                        h = inflight[token][0]
                        await backend.cancel(token)
                        if token not in inflight:       # it finished meanwhile after all
                            continue
                        timed_out.append(h.id)
                        settle(token, Result.failure(h, ExperimentTimeout(
                            f"{h.id!r} ran longer than timeout={self.timeout:g} s and was "
                            "cancelled (research.experiments.timeout)"), self.timeout))
                if hard is not None and inflight and self._now() >= hard:
                    for token in list(inflight):
                        await backend.cancel(token)
                        if token not in inflight:       # it finished meanwhile after all
                            continue
                        h, slot, _ = inflight[token]
                        cancelled.append(h.id)
                        self._carry.append(h)
                        self._emit("cancel", h.branch, h.id, slot, reason=(
                            f"still running {self.cancel_grace:g} s after max_seconds="
                            f"{self.max_seconds:g}"))
                        settle(token, _CANCELLED)
                if crashed:
                    raise crashed[0]
                if bar is not None:         # update() redraws at most every 0.1 s
                    bar.update(len(results) + len(failed), len(inflight), ledger.total_queued)
            if stop_reason is None:
                stop_reason = "queue_empty"
                self._emit("stop", reason=stop_reason, in_flight=0)
            if side:                        # paper writers, within the run's deadline
                left = None if hard is None else max(0.0, hard - self._now())
                _, late = await asyncio.wait(side, timeout=left)
                for fut in late:
                    fut.cancel()
                if late:
                    await asyncio.wait(late, timeout=1.0)
            if self.log_events and self.client is not None:
                backend.ship(self._records(trace, shipped, run_id))
        finally:
            if bar is not None:             # 100 % of what was done, whatever stopped it
                bar.finish(len(results) + len(failed), stop_reason)
            await backend.close()
            if self._journal is not None:
                self._journal.close()
            self._running = False
        return Report(
            stop_reason=stop_reason,
            branches=ledger.snapshot(),
            total_runs=len(results),
            dispatched=dispatched,
            failures=len(failed),
            wall_seconds=self._now(),
            paper_triggers=triggers,
            papers=papers,
            events=trace,
            results=results,
            failed=failed,
            dropped=self._take_dropped(),
            slots=self.slots,
            run_id=run_id,
            replayed=restored.outcomes if restored is not None else 0,
            objectives=dict(self.objectives) if self.objectives else None,
            pareto_front=self._pareto_front(),
            policy=self.policy.name,
            apply_order=self.apply_order,
            cancelled=cancelled,
            timed_out=timed_out,
            objective=self.objective,
        )

    def _select_data(self, i: int, h: Hypothesis) -> dict[str, Any]:
        """Extra data of a ``select`` event for policies that pick more than a branch."""
        pol = self.policy
        if pol.picks_hypothesis:
            return {"position": pol.position}
        front = getattr(pol, "last_front", None)
        if front is not None and len(front):
            return {"front": [self.ledger.branches[j] for j in np.flatnonzero(front)]}
        return {}

    def _pareto_front(self) -> list[str]:
        """Branches whose mean reward vectors no other branch dominates (vector rewards)."""
        led = self.ledger
        if not led.dims:
            return []
        k = len(led.branches)
        mask = pareto_front(led.vector_means(), led.runs[:k] > 0)
        return [led.branches[j] for j in np.flatnonzero(mask)]

    def _take_dropped(self) -> list[str]:
        out, self._dropped = self._dropped, []
        return out

    def _records(self, trace: Trace, start: int, run_id: str) -> list[dict]:
        """Event records for the Dask log, in the project's vocabulary (``{"event": kind,
        "run": run_id, ...}``); select records keep only the best 32 scores."""
        out = []
        for ev in trace[start:]:
            scores, top = ev.scores, ev.top
            if scores is not None and len(scores) > _LOG_TOP_SCORES:
                top = top_scores(scores, _LOG_TOP_SCORES,
                                 trace.branches.index(ev.branch) if ev.branch else 0)
            if top is not None:
                kept = ev.top
                ev.scores = ev.top = None
                d = ev.to_dict()
                ev.scores, ev.top = scores, kept
                d["scores"] = {trace.branches[j]: _jsonable(s)
                               for j, s in top[:_LOG_TOP_SCORES].tolist()}
                d["scores_truncated"] = ev.scored
            else:
                d = ev.to_dict(trace.branches)
            d["event"] = d.pop("kind")
            d["run"] = run_id
            out.append(d)
        return out

    def _progress_bar(self, done: int) -> ProgressBar | None:
        if not self.progress:
            return None
        return ProgressBar(self.max_experiments, done, self.ledger.total_queued)

    def _on_outcome(self, h: Hypothesis, slot: int | None, outcome: Any,  # noqa: C901
                    results: list[Result],
                    failed: list[Result], triggers: list[str], papers: dict[str, Any],
                    side: list[asyncio.Future],
                    backend: LocalBackend | DaskBackend | None) -> None:
        ledger = self.ledger
        ok = isinstance(outcome, Result) and outcome.ok
        if ok:
            i = ledger.record(outcome)
            runs, mean = int(ledger.runs[i]), float(ledger.mean[i])
            results.append(outcome)
            vec = {"means": ledger.raw_means(i)} if ledger.dims else {}
            self._emit("result", h.branch, h.id, slot, reward=outcome.reward,
                       duration=outcome.duration, mean=mean, runs=runs,
                       journal={"metrics": _jsonable(outcome.metrics)}, **vec)
        else:
            res = outcome if isinstance(outcome, Result) else Result.failure(h, outcome)
            i = ledger.record_failure(h)
            runs = int(ledger.runs[i])
            mean = float(ledger.mean[i]) if runs else math.nan
            failed.append(res)
            self._emit("failure", h.branch, h.id, slot, error=res.error,
                       failures=int(ledger.failures[i]), journal={"duration": res.duration})
        if self._sources.by_branch:
            self._sources.observe(outcome if isinstance(outcome, Result) else
                                  Result.failure(h, outcome), self)
        means = ledger.raw_means(i)
        dirs = self.objectives or {}
        # gate 1: pruning
        if not ledger.pruned[i]:
            if self.objective == "max":
                reason = _objectives.max_prune(self, i)
            elif isinstance(self.prune_floor, dict):
                reason = policies.prune_reason_vector(
                    runs, means or {}, int(ledger.failures[i]), self.prune_after_runs,
                    self.prune_floor, dirs, self.failure_limit)
            else:
                reason = policies.prune_reason(runs, mean, int(ledger.failures[i]),
                                               self.prune_after_runs, self.prune_floor,
                                               self.failure_limit)
            if reason is not None:
                dropped = ledger.prune(i, reason)
                self._dropped.extend(d.id for d in dropped)
                self._emit("prune", h.branch, reason=reason, mean=mean, runs=runs,
                           failures=int(ledger.failures[i]), dropped=[d.id for d in dropped],
                           **({"means": means} if means else {}))
                return
        if not ok or ledger.pruned[i]:
            return
        # gate 2: paper trigger, once per branch
        if self.objective == "max":
            trigger = _objectives.max_trigger(self, i)
        elif isinstance(self.paper_threshold, dict):
            trigger = policies.should_trigger_paper_vector(
                runs, means or {}, self.paper_threshold, dirs, bool(ledger.paper[i]))
        else:
            trigger = policies.should_trigger_paper(runs, mean, self.paper_threshold,
                                                    bool(ledger.paper[i]))
        if trigger:
            ledger.paper[i] = True
            triggers.append(h.branch)
            self._emit("paper.trigger", h.branch, h.id, mean=mean, runs=runs,
                       threshold=self.paper_threshold, **({"means": means} if means else {}))
            if self.paper_writer is not None and backend is None:       # ask/tell
                assert self._session is not None
                self._session.write_paper(h.branch, ledger.stats(i), outcome)
            elif self.paper_writer is not None:
                stats = ledger.stats(i)
                side.append(self._start_paper(h.branch, stats, outcome, papers, backend))
        # gate 3: expansion
        if self.expander is not None:
            self._expand(outcome)

    def _start_paper(self, branch: str, stats: BranchStats, best: Result,
                     papers: dict[str, Any], backend: LocalBackend | DaskBackend) -> Any:
        fut = backend.side(self.paper_writer, branch, stats, best)  # type: ignore[arg-type]

        async def watch() -> None:
            try:
                papers[branch] = await fut
                if self._journal is not None:
                    self._journal_write({"kind": "output", "branch": branch,
                                         "output": _jsonable(papers[branch])})
                self._emit("paper.done", branch=branch)
            except asyncio.CancelledError:   # the run's deadline: written again on resume
                papers[branch] = "<cancelled: still writing at the run's deadline>"
            except Exception as exc:  # noqa: BLE001 - a failed paper never stops the loop
                papers[branch] = f"<{type(exc).__name__}: {exc}>"
                self._emit("paper.failed", branch=branch, error=f"{type(exc).__name__}: {exc}")

        return asyncio.ensure_future(watch())

    def _expand(self, result: Result) -> None:
        h = result.hypothesis
        try:
            new = list(self.expander(result))  # type: ignore[misc]
            wrong = [x.id for x in new if isinstance(x, Hypothesis) and x.branch != h.branch]
            batch = BranchLedger.check(new, self.ledger.ids)
            self.ledger._check_features(batch)
            if self._journal is not None:
                for x in batch:
                    hypothesis_to_json(x)
        except Exception as exc:  # noqa: BLE001 - a faulty expander must not kill the loop
            self._emit("expand", branch=h.branch, hypothesis=h.id, ids=[],
                       error=f"{type(exc).__name__}: {exc}")
            return
        if not batch:
            return
        self._queue(batch)
        self._emit("expand", branch=h.branch, hypothesis=h.id, ids=[x.id for x in batch],
                   **({"other_branches": wrong} if wrong else {}))
