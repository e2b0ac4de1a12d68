"""Lazy hypothesis sources: a branch that proposes its next hypothesis when it is picked.

``sched.add(Branch("svc", propose=fn))`` registers a branch without pre-drawing anything. When
the policy picks that branch and it has nothing queued, the scheduler calls ``fn`` and runs
what it returns; so a search draws exactly as many configurations as it runs. A source may
also learn from the branch's results: an object with an ``observe(result)`` method is told
every outcome of its branch (and, after a resume, the outcomes restored from the journal), as
:class:`~.optuna_source.OptunaSource` does to fit a sampler per branch.

``propose`` receives the branch name and returns one of:

- a :class:`~.types.Hypothesis` of that branch, or a list of them (queued in order);
- any other value: the payload of one new hypothesis with id ``"<branch>:<k>"``;
- ``None`` (or an empty list): the source is exhausted; the branch is then an ordinary branch
  that runs what is queued and is no longer picked when its queue is empty.

A source that raises is exhausted too, with an ``add`` event that carries the error.

Examples
--------
>>> from dask_research.experiments import Branch, IterationScheduler
>>> draws = iter([0.2, 0.9, 0.5])
>>> sched = IterationScheduler(lambda h: h.payload, slots=1, progress=False,
...                            max_experiments=5)
>>> sched.add(Branch("a", propose=lambda branch: next(draws, None)))
>>> report = sched.run()
>>> [r.hypothesis.id for r in report.results], report.stop_reason
(['a:0', 'a:1', 'a:2'], 'queue_empty')
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..exceptions import ExperimentError
from .ledger import BranchLedger
from .types import ExperimentResult, Hypothesis

__all__ = ["Branch", "HypothesisSource", "SourceTable", "Intake"]

Emit = Callable[..., None]                                  # Recorder.emit
# the scheduler's intake: queue(batch, encoded, checked) validates (unless checked), journals
# (``encoded``: the batch's journal form, when the caller has it) and queues a batch
Intake = Callable[[list[Hypothesis], "list[dict] | None", bool], list[Hypothesis]]


class HypothesisSource:
    """Protocol of a stateful source (duck-typed; subclassing is optional).

    ``propose(branch) -> Hypothesis | list[Hypothesis] | payload | None`` is required;
    ``observe(result)`` is optional and receives every :class:`~.types.Result` (successful
    or failed) of the branch. ``renamed(old_id, new_id)`` is optional: when a proposed id is
    already taken (say, by a hypothesis from before a resume), the scheduler gives the
    hypothesis a fresh id and tells a source that has this method.
    """

    def propose(self, branch: str) -> Any:  # pragma: no cover - protocol
        raise NotImplementedError

    def observe(self, result: ExperimentResult) -> None:  # pragma: no cover - protocol
        """A result (or failure) of the branch."""

    def __call__(self, branch: str) -> Any:
        return self.propose(branch)


@dataclass(frozen=True)
class Branch:
    """A research branch whose hypotheses are proposed lazily.

    Parameters
    ----------
    name : str
        Branch name (the key of the statistics, like :attr:`Hypothesis.branch`).
    propose : callable
        ``propose(name) -> Hypothesis | list | payload | None``, or an object with a
        ``propose`` method (and optionally ``observe(result)``); see the module docs.

    Examples
    --------
    >>> Branch("svc", propose=lambda b: {"C": 1.0}).name
    'svc'
    """

    name: str
    propose: Any

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ExperimentError(f"Branch name must be a non-empty string, got {self.name!r}",
                                  value=self.name)
        fn = getattr(self.propose, "propose", self.propose)
        if not callable(fn):
            raise ExperimentError(
                f"Branch {self.name!r}: propose must be callable (branch -> Hypothesis, list, "
                f"payload or None) or have a propose method, got "
                f"{type(self.propose).__name__}", branch=self.name)


class SourceTable:
    """The scheduler's live sources (one per branch) and their per-branch id counters.

    >>> from dask_research.experiments.ledger import BranchLedger
    >>> table, led = SourceTable(), BranchLedger(c=1.0)
    >>> table.take_branches(led, [Branch("a", propose=lambda b: 0.5), "other"], [])
    ['other']
    >>> table.propose(led, 0, lambda batch, encoded, checked: led.add(batch),
    ...               lambda *args, **kwargs: None), led.queues[0][0].id
    (True, 'a:0')
    """

    def __init__(self) -> None:
        self.by_branch: dict[str, Any] = {}
        self.counter: dict[str, int] = {}

    def take_branches(self, led: BranchLedger, items: Iterable[Any],
                      restored: list[ExperimentResult]) -> list[Any]:
        """Register the :class:`Branch` objects among ``items``; returns the other items."""
        rest = []
        for x in items:
            if isinstance(x, Branch):
                self.register(led, x, restored)
            else:
                rest.append(x)
        return rest

    def register(self, led: BranchLedger, branch: Branch, restored: list[ExperimentResult]) -> None:
        """Register ``branch``'s source, tell it the ``restored`` outcomes of its branch (read
        from a journal), mark the branch live."""
        if led.policy.picks_hypothesis:
            raise ExperimentError(
                f"policy {led.policy.name!r} picks among queued hypotheses by their features; "
                f"a lazy Branch {branch.name!r} has none queued to pick from: add Hypothesis "
                "objects, or use a branch policy (ucb1, thompson, objective='max', ...)",
                branch=branch.name)
        if branch.name in self.by_branch:
            raise ExperimentError(f"branch {branch.name!r} already has a source; add each "
                                  "Branch once", branch=branch.name)
        self.by_branch[branch.name] = branch.propose
        i = led._branch(branch.name)
        for res in restored:
            if res.hypothesis.branch == branch.name:
                self.observe(res)
        led.set_sourced(i, True)

    def observe(self, result: ExperimentResult, led: BranchLedger | None = None,
                emit: Emit | None = None) -> None:
        """Tell the branch's source about one outcome. During a run (``led`` and ``emit``
        given) a source whose ``observe`` raises is ended like one whose ``propose`` raises:
        the branch is no longer proposed to, and an ``add`` event carries the error."""
        name = result.hypothesis.branch
        src = self.by_branch.get(name)
        fn = getattr(src, "observe", None)
        if fn is None:
            return
        if led is None or emit is None:
            fn(result)
            return
        try:
            fn(result)
        except Exception as exc:  # noqa: BLE001 - a faulty source must not kill the loop
            del self.by_branch[name]
            led.set_sourced(led.branch_index(name), False)
            emit("add", name, n=0, source=True, exhausted=True,
                 error=f"observe: {type(exc).__name__}: {exc}")

    def _fresh_id(self, led: BranchLedger, name: str) -> str:
        k = self.counter.get(name, 0)
        while f"{name}:{k}" in led.ids:
            k += 1
        self.counter[name] = k + 1
        return f"{name}:{k}"

    def _batch(self, led: BranchLedger, name: str, out: Any) -> list[Hypothesis]:
        if out is None:
            return []
        if isinstance(out, Hypothesis):
            out = [out]
        elif isinstance(out, (list, tuple)) and all(isinstance(x, Hypothesis) for x in out):
            out = list(out)
        else:
            return [Hypothesis(self._fresh_id(led, name), name, out)]
        wrong = [h.id for h in out if h.branch != name]
        if wrong:
            raise ExperimentError(f"the source of branch {name!r} proposed hypotheses of other "
                                  f"branches: {wrong}; a source proposes for its own branch",
                                  branch=name)
        renamed = getattr(self.by_branch.get(name), "renamed", None)
        if renamed is not None:             # the source keeps its own ids: resolve clashes
            for k, h in enumerate(out):     # (e.g. with ids from before a resume)
                if h.id in led.ids:
                    new = dataclasses.replace(h, id=self._fresh_id(led, name))
                    renamed(h.id, new.id)
                    out[k] = new
        return out

    def propose(self, led: BranchLedger, i: int, queue: Intake, emit: Emit) -> bool:
        """Ask branch ``i``'s source for hypotheses and ``queue`` them; ``False`` (and the
        branch no longer live) when it is exhausted or failed."""
        name = led.branches[i]
        src = self.by_branch.get(name)
        if src is None:
            led.set_sourced(i, False)
            return False
        fn: Callable[[str], Any] = getattr(src, "propose", src)
        try:
            batch = self._batch(led, name, fn(name))
            if batch:
                queue(batch, None, False)
        except Exception as exc:  # noqa: BLE001 - a faulty source must not kill the loop
            led.set_sourced(i, False)
            emit("add", name, n=0, source=True, exhausted=True,
                 error=f"{type(exc).__name__}: {exc}")
            return False
        if not batch:
            led.set_sourced(i, False)
            emit("add", name, n=0, source=True, exhausted=True)
            return False
        emit("add", name, n=len(batch), source=True, ids=[h.id for h in batch])
        return True

