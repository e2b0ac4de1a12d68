"""The scheduler: pick a branch, start an experiment, record the result, repeat.

:class:`IterationScheduler` is the facade over the parts: its :class:`~.settings.
SchedulerSettings`, a :class:`~.ledger.BranchLedger` (queues and statistics) with the
:class:`~.books.Books` that count what a report shows, a :class:`~.recorder.Recorder` (trace
and journal), and per run a :class:`~.scheduler_run.Run` driven by the asyncio loop of :mod:`.driver`
(or by your own loop, :mod:`.asktell`). On every result the gates of :mod:`.gates` apply in
order: pruning, paper trigger, expansion. It never blocks behind one experiment: it sleeps
until *any* experiment finishes and refills the freed slot at once.
"""
from __future__ import annotations

import asyncio
import inspect
import os
import time
import warnings
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from .._compat import client_asynchronous, in_async_call
from ..exceptions import CheckpointError, ExperimentError, InputError
from .actors import ActorBackend
from .asktell import AskTellSession
from .backends import DaskBackend, LocalBackend
from .books import Books
from .checkpoint import Journal, hypothesis_to_json
from .driver import LoopDriver
from .ledger import BranchLedger
from .limits import check_batch_memory
from .own_loop import run_to_end
from .policies.base import Policy
from .progress_bar import ProgressBar
from .recorder import Recorder
from .report import Report
from .resume import journaled_keywords, restore
from .scheduler_run import Run
from .settings import KEYWORDS, SETTINGS, SchedulerSettings, check_functions, parameters_doc
from .sources import Branch, SourceTable
from .types import BranchStats, ExperimentResult, Hypothesis

__all__ = ["IterationScheduler"]


class IterationScheduler:
    """UCB iteration scheduler: hypotheses in branches feed ``slots`` parallel experiments.

    Every setting (the keywords after ``client``) that is ``None`` is read from
    ``research.experiments.*`` in ``dask.config`` when the scheduler is created.

    Parameters
    ----------
    runner : callable or None
        ``Hypothesis -> Result``, sync or ``async def`` (``None`` for a scheduler used only
        by :meth:`ask` / :meth:`tell`). It may also return a bare reward
        (a number) or a ``(reward, metrics)`` pair; the scheduler wraps it and measures the
        duration. Exceptions and unusable returns become failed results; they never stop the
        loop. With a client the runner must pickle.
    expander : callable, optional
        ``Result -> list[Hypothesis]``, called on every successful result; its hypotheses are
        queued (e.g. :data:`~.runners.deterministic_expander`). Keep it pure and cheap: it runs
        on the loop.
    paper_writer : callable, optional
        ``(branch, stats, best_result) -> anything``, sync or ``async def``; runs as a task
        (or a Dask future) and never blocks the loop. Its return values are in
        ``report.papers``; the run waits for unfinished writers before returning.
    client : distributed.Client, optional
        Run experiments as Dask futures on this client (sync or asynchronous). Without one
        they run as asyncio tasks in this process (sync runners in a thread per slot).
{settings}

    Every setting is also an attribute (``sched.slots``, ``sched.timeout = 1.5``, checked like
    the keyword), held in ``sched.settings`` (:class:`~.settings.SchedulerSettings`, whose
    table :data:`~.settings.SETTINGS` is the one place a setting is declared).

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

    def __init__(self, runner: Callable[[Hypothesis], Any] | None, *args: Any,
                 expander: Callable[[ExperimentResult], Iterable[Hypothesis]] | None = None,
                 paper_writer: Callable[..., Any] | None = None, client: Any = None, **settings: Any):
        if args:
            settings, expander, paper_writer, client = _positional(args, settings, expander, paper_writer, client)
        check_functions(runner, expander, paper_writer)
        self.runner = runner
        self.expander = expander
        self.paper_writer = paper_writer
        self.client = client
        self.settings = s = SchedulerSettings.parse(**settings)
        self.ledger = BranchLedger(
            s.c, s.make_policy(), objectives=list(s.objectives.items()) if s.objectives else None,
            weights=s.weights, bounded=s.bounded)
        self.policy: Policy = self.ledger.policy
        self._sources = SourceTable()
        self._books = Books(self.ledger)
        self._recorder = Recorder(s.slots, s.trace_scores, self.ledger, header=s.header)
        self._session: AskTellSession | None = None
        self._known: dict[str, str] = {}          # ids restored from the checkpoint -> branch
        self._running = False
        if s.checkpoint is not None:              # a bad checkpoint raises before anything runs
            journal = Journal(s.checkpoint)
            journal.acquire()                     # one driver per journal: refused at once
            try:
                state = journal.load(lazy=True)   # one record at a time into the ledger
                if state is not None:
                    self._known = restore(state, self._books, journal.url)
            except BaseException:
                journal.release()
                raise
            self._recorder.journal = journal
            weakref.finalize(self, journal.release)

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
        where = os.fspath(path)
        functions = {k: kwargs.pop(k) for k in ("expander", "paper_writer", "client") if k in kwargs}
        settings = journaled_keywords(path, kwargs)
        try:
            return cls(runner, checkpoint=path, **functions, **settings)
        except (InputError, ExperimentError) as exc:
            name = getattr(exc, "name", None)
            if name in kwargs:                  # the caller's own override: their error
                raise
            raise CheckpointError(where, f"holds a setting that cannot be used ({exc}); the "
                                         "file is damaged or was edited") from exc

    # -- the settings as attributes ----------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        """A setting (``sched.slots``): only reached when no attribute of that name exists."""
        if name in _ATTRIBUTES and "settings" in self.__dict__:
            return getattr(self.__dict__["settings"], name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _ATTRIBUTES and "settings" in self.__dict__:
            setattr(self.settings, name, value)      # checked like the keyword
        else:
            object.__setattr__(self, name, value)

    def close(self) -> None:
        """Sync the checkpoint journal and release its lease (a run does both when it ends; the
        next ``add`` or ``run`` takes the lease again if no other driver wrote to the journal
        meanwhile). Refused while :meth:`run` is in progress (from another thread): the run
        holds its journal until it ends, then syncs and releases it itself."""
        if self._running:
            # releasing the lease under a running loop let a second driver resume the journal
            # and run again what this one still had in flight
            raise ExperimentError("close() while run() is in progress; the run syncs and releases "
                                  "its checkpoint when it ends (wait for run() to return)")
        if self._recorder.journal is not None:
            self._recorder.journal.close()

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
        self._recorder.check_whole()
        if isinstance(hypotheses, (Hypothesis, Branch)):
            hypotheses = [hypotheses]
        batch = self._sources.take_branches(self.ledger, hypotheses,
                                            self._books.restored_outcomes())
        if self._known:
            fresh = []
            for h in batch:
                branch = self._known.get(getattr(h, "id", None))  # type: ignore[arg-type]
                if branch is None:
                    fresh.append(h)
                elif branch != h.branch:
                    journal = self._recorder.journal
                    raise CheckpointError(
                        journal.url if journal else "?",
                        f"hypothesis {h.id!r} is on branch {branch!r} in the checkpoint but on "
                        f"{h.branch!r} here; the checkpoint belongs to another run")
            batch = fresh
        self._queue(batch)
        self._recorder.commit()

    def _queue(self, batch: list[Hypothesis], encoded: list[dict] | None = None,
               checked: bool = False) -> list[Hypothesis]:
        """Validate (once: not when ``checked``), journal, then queue ``batch`` (``encoded``:
        its journal form, when the caller has it); returns the hypotheses dropped."""
        if not checked:
            batch = self.ledger.validate(batch)
        check_batch_memory(batch)
        if self._recorder.journal is not None and batch:
            self._recorder.write({"kind": "hyps", "hyps": encoded if encoded is not None else
                                  [hypothesis_to_json(h) for h in batch]})
        dropped = self._books.queue(batch, checked=True)
        if dropped and self._running:
            for h in dropped:
                self._recorder.emit("drop", branch=h.branch, hypothesis=h.id, reason="pruned")
        return dropped

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
        if self.client is None:     # its own loop (in a helper thread where one runs here: Jupyter)
            return run_to_end(self.run_async, "IterationScheduler")
        if client_asynchronous(self.client) or in_async_call(getattr(self.client, "loop", None)):
            raise ExperimentError(
                "the client is asynchronous; use `report = await sched.run_async()` instead of "
                "sched.run()")
        try:
            return self.client.sync(self._drive)
        except KeyboardInterrupt:
            # distributed cancels the driver on the client's loop and raises here at once: wait
            # (bounded) for the run to wind down there, so that its experiments are cancelled and
            # its journal released when this returns (a resume right after Ctrl-C was refused)
            deadline = time.monotonic() + _WIND_DOWN
            while self._running and time.monotonic() < deadline:
                time.sleep(0.05)
            raise

    async def run_async(self) -> Report:
        """Coroutine version of :meth:`run` (for asynchronous clients and notebooks)."""
        self._check_runnable()
        if self.client is None or in_async_call(self.client.loop):
            return await self._drive()
        cf = asyncio.run_coroutine_threadsafe(self._drive(), self.client.loop.asyncio_loop)
        return await asyncio.wrap_future(cf)

    def _check_runnable(self) -> None:
        self._recorder.check_whole()
        if self.runner is None:
            raise ExperimentError("this scheduler has no runner (runner=None); drive it with "
                                  "ask() and tell(), or create it with a runner to run()")
        if self._session is not None:
            raise ExperimentError("this scheduler is in an ask/tell session; keep using ask() "
                                  "and tell() (or resume its checkpoint in a new scheduler)")

    def _new_run(self) -> Run:
        return Run(self.settings, self._books, self._recorder, self._sources, self._queue,
                   self.expander)

    async def _drive(self) -> Report:
        if self._running:
            raise ExperimentError("this scheduler is already running; one run at a time")
        self._running = True
        driver: LoopDriver | None = None
        try:
            assert self.runner is not None       # _check_runnable
            run = self._new_run()
            s = self.settings
            objectives = tuple(s.objectives) if s.objectives else None
            if self.client is None:
                backend: LocalBackend | DaskBackend | ActorBackend = LocalBackend(
                    self.runner, s.slots, s.bounded, objectives)
            elif s.transport == "actors":
                backend = ActorBackend(self.client, self.runner, s.bounded,
                                       s.topic if s.log_events else None, run.run_id,
                                       objectives, slots=s.slots, timeout=s.timeout)
            else:
                backend = DaskBackend(self.client, self.runner, s.bounded,
                                      s.topic if s.log_events else None, run.run_id,
                                      objectives, notify_starts=s.timeout is not None)
            driver = LoopDriver(run, backend, self.paper_writer, self.client)
            bar = (ProgressBar(s.max_experiments, self._books.outcomes, self.ledger.total_queued)
                   if s.progress else None)
            return await driver.drive(bar)
        except BaseException as exc:
            self._recorder.discard(exc)  # a step an error cut short is never written
            raise
        finally:
            if self._recorder.journal is not None:
                self._recorder.journal.close()
            # the next report counts from here; cancelled experiments run first next time
            self._books = Books(self.ledger, driver.carry if driver is not None else ())
            self._running = False

    # -- ask/tell (see .asktell) -----------------------------------------------------------
    def ask(self) -> Hypothesis:
        """The hypothesis to run next (the policy's pick); it counts as in flight until
        :meth:`tell`. Raises :class:`ExperimentError` when nothing is queued and no source is
        live, or a budget is spent."""
        if self._running:
            raise ExperimentError("run() is in progress; ask() is for schedulers your own loop "
                                  "drives")
        self._recorder.check_whole()
        if self._session is None:
            self._session = AskTellSession(self._new_run(), self.paper_writer)
        return self._session.ask()

    def tell(self, hypothesis: Hypothesis | str, outcome: Any,
             duration: float | None = None) -> ExperimentResult:
        """Record the outcome of an asked hypothesis (or its id): a reward, a
        ``(reward, metrics)`` pair or a :class:`Result` (``Result.failure(h, exc)`` for a
        failed experiment). Applies the gates as :meth:`run` does; returns the Result."""
        if self._running:
            raise ExperimentError("run() is in progress; tell() is for schedulers your own loop "
                                  "drives")
        self._recorder.check_whole()
        if self._session is None:
            if not self._books.retry:       # asks pending in a resumed journal may be told at once
                raise ExperimentError(f"tell for {getattr(hypothesis, 'id', hypothesis)!r} before "
                                      "any ask(); ask() first")
            self._session = AskTellSession(self._new_run(), self.paper_writer)
        return self._session.tell(hypothesis, outcome, duration)

    def report(self) -> Report:
        """The :class:`Report` of the ask/tell session so far (also flushes the journal)."""
        if self._session is None:
            raise ExperimentError("no ask/tell session yet; report() follows ask()/tell() "
                                  "(run() returns its own report)")
        return self._session.report()


#: Seconds run() waits, after Ctrl-C, for a run on a blocking client's loop to wind down.
_WIND_DOWN = 60.0

#: The settings that are attributes of the scheduler (its ``.policy`` is the Policy object).
_ATTRIBUTES = frozenset(row.name for row in SETTINGS if row.attribute)

#: The positional order of the scheduler's parameters before its settings were passed whole.
_OLD_ORDER = ("slots", "c", "prune_after_runs", "prune_floor", "paper_threshold", "expander", "paper_writer",
              "max_experiments", "max_seconds", "client", "failure_limit", "bounded", "progress", "policy",
              "log_events", "checkpoint", "gamma", "alpha", "seed", "objectives", "weights", "apply_order",
              "timeout", "cancel_grace", "trace_scores", "objective", "max_policy", "max_quantile", "max_c")


def _positional(args: tuple, settings: dict[str, Any], expander: Any, paper_writer: Any,
                client: Any) -> tuple[dict[str, Any], Any, Any, Any]:
    """Map positional arguments after ``runner`` to their names: ``slots`` by position stays;
    anything further is deprecated (pass keywords)."""
    if len(args) > len(_OLD_ORDER):
        raise TypeError(f"IterationScheduler takes at most {len(_OLD_ORDER) + 1} positional arguments")
    if len(args) > 1:
        warnings.warn("IterationScheduler's arguments after runner and slots are keyword-only; passing them by "
                      f"position ({', '.join(_OLD_ORDER[1:len(args)])}) is deprecated", DeprecationWarning,
                      stacklevel=3)
    named = dict(zip(_OLD_ORDER, args))
    fns = {"expander": expander, "paper_writer": paper_writer, "client": client}
    for k in fns:
        if k in named:
            fns[k] = named.pop(k)
    clash = sorted(set(named) & set(settings))
    if clash:
        raise TypeError(f"IterationScheduler got multiple values for argument {clash[0]!r}")
    return {**named, **settings}, fns["expander"], fns["paper_writer"], fns["client"]


def _signature() -> inspect.Signature:
    """``(runner, slots=None, *, expander=None, paper_writer=None, client=None, <every setting>=None)``."""
    P = inspect.Parameter
    params = [P("self", P.POSITIONAL_OR_KEYWORD), P("runner", P.POSITIONAL_OR_KEYWORD),
              P("slots", P.POSITIONAL_OR_KEYWORD, default=None)]
    params += [P(n, P.KEYWORD_ONLY, default=None) for n in ("expander", "paper_writer", "client")]
    params += [P(n, P.KEYWORD_ONLY, default=None) for n in KEYWORDS if n != "slots"]
    return inspect.Signature(params)


IterationScheduler.__init__.__signature__ = _signature()  # type: ignore[attr-defined]
if IterationScheduler.__doc__:
    IterationScheduler.__doc__ = IterationScheduler.__doc__.replace(
        "{settings}", "\n".join("    " + line if line else line for line in parameters_doc().splitlines()))
