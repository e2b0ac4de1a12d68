"""What the driver does with what a wait gathered: accept blocks, fold the fixed tree as they come.

A driver turn waits for the first tracked future to end and gathers every finished one
(:mod:`.arrivals`); :meth:`Acceptance.take` then sorts what came. A group's collector that
answered hands over its blocks' results; one that ended without a result is opened (its blocks
answer one by one, :mod:`.groups`); a block whose task raised is handed back for the checks to
retry elsewhere or fail the run (:mod:`.block_watch`). Only what was gathered is accepted: a
future that finished and then lost its data with its worker (Dask recomputes it) stays pending,
and so does nothing of a block whose twin (a speculative copy) was accepted a moment ago in the
same turn.

Accepting a block (:meth:`Acceptance.accept`): its other attempts are cancelled, its computed
shards are in the store (written by its task, or now by the client; see :mod:`.blocks`), the
verification keeps the states it needs (:mod:`.verification`), the run's figures and the
block's time are counted, an ``accepted`` event (with a running estimate) is sent, and the
block's state is folded into the fixed tree (:mod:`.folding`): the root exists the moment the
last block arrives. The driver holds these states anyway, so a merge costs it a few
microseconds where a merge task would cost a scheduler round trip.

Examples
--------
The acceptance of an execution, fed two blocks computed here, in the wrong order:

>>> from dask_research.montecarlo import Job, Normal
>>> from dask_research.montecarlo.engine import Execution
>>> from dask_research.montecarlo.run_settings import RunSettings
>>> from dask_research.montecarlo.shard_compute import compute_block
>>> from dask_research.montecarlo.tree import tree_fold
>>> job = Job(lambda a: a, {"a": Normal(0.0, 1.0)}, shards=4, samples_per_shard=64, seed=1, range=(-8, 8))
>>> reducer = job.make_reducer(job.range)
>>> acceptance = Execution(None, job, reducer, 2, settings=RunSettings.parse(verify=0)).acceptance
>>> blocks = [compute_block(job, reducer, a, b) for a, b in ((0, 2), (2, 4))]
>>> acceptance.accept(1, "future of block 1", blocks[1])
>>> acceptance.root is None, acceptance.outcome.computed
(True, 2)
>>> acceptance.accept(0, "future of block 0", blocks[0])
>>> acceptance.root == tree_fold(reducer.merge, [b.state for b in blocks]), acceptance.estimate.n
(True, 256)
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .accumulators import Moments
from .block_watch import BlockWatch
from .codec import encode
from .folding import TreeFolder
from .outcome import Outcome
from .run_events import RunningEstimate
from .shard_compute import BlockResult
from .submission import Window
from .tree import tree_fold
from .verification import Verification

__all__ = ["Acceptance"]


class Acceptance:
    """The blocks accepted by one execution, their states, and the fixed tree folded over them.

    ``store`` is the run's :class:`~.store.held_run.HeldRun` (``None``: no store),
    ``progress`` a bar told of each accepted block's shards (``None``: none), ``emit(kind,
    **data)`` sends a run event, ``outcome`` counts what was computed and who wrote the store.
    """

    def __init__(self, window: Window, reducer: Any, *, verification: Verification, watch: BlockWatch,
                 emit: Callable[..., None], outcome: Outcome | None = None, store: Any = None, progress: Any = None):
        self.window, self.reducer, self.verification, self.watch = window, reducer, verification, watch
        self.emit, self.store, self.progress = emit, store, progress
        self.outcome = outcome if outcome is not None else Outcome()
        self.block_states: dict[int, Any] = {}
        self.tree: TreeFolder | None = TreeFolder(len(window.bounds), reducer.merge)  # None after a quarantine
        self.estimate = RunningEstimate()

    @property
    def root(self) -> Any:
        """The folded root, once every block has arrived (``None`` before, and after a quarantine)."""
        return self.tree.root if self.tree is not None else None

    def take(self, done: list, values: dict) -> list[tuple[int, Any]]:
        """Accept what a wait gathered (``values``: result by future), open the groups that ended
        without one; the failed blocks, ``(block, future)`` each, for the checks to decide on."""
        pending, groups = self.window.pending, self.window.groups
        for f, res in values.items():
            if f in groups:
                for member, r in zip(groups.take(f), res):
                    if member in pending:
                        self.accept(pending.pop(member), member, r)
            elif f in pending:
                self.accept(pending.pop(f), f, res)
        failed = []
        for f in done:
            if f in groups:            # no result (a block failed, was cancelled...): open it
                a, b = self.window.open_group(f)
                self.emit("group-opened", start=a, stop=b, reason=f.status)
            elif f in pending and f.status == "error":
                failed.append((pending.pop(f), f))
        return failed

    def from_store(self, idx: int) -> None:
        """Block ``idx`` is wholly reused from the store: fold its stored shards, as if it arrived."""
        a, b = self.window.bounds[idx]
        known = self.verification.known
        state = tree_fold(self.reducer.merge, [known[s] for s in range(a, b)])
        self.block_states[idx] = state
        self.verification.keep_stored(a, b)
        if self.progress is not None:
            self.progress.update(b - a)
        self._emit_accepted(a, b, "store", 0, state)
        self._fold(idx, state)

    def accept(self, idx: int, fut: Any, res: BlockResult) -> None:
        """Block ``idx`` arrived from ``fut``: accept it (once: a twin that already won makes it a no-op)."""
        if idx in self.block_states:
            return  # a speculative twin already won
        attempts = self.window.settle(idx, fut)
        for other in attempts:
            if other is not fut:
                self.outcome.speculated.append({"block": list(self.window.bounds[idx]), "winner": res.worker,
                                                "speculative_won": fut.key in self.window.copies})
        if res.computed and self.store is not None:
            self._record_store(res)
        self.verification.keep(res)
        self.outcome.count(res.worker, len(res.computed))
        self.block_states[idx] = res.state
        self.watch.accepted([f.key for f in attempts], res.seconds, len(res.computed) + len(res.rechecks))
        self._emit_accepted(res.start, res.stop, res.worker, len(res.computed), res.state)
        if self.progress is not None:
            self.progress.update(res.stop - res.start)
        self._fold(idx, res.state)

    def forget(self, idxs: list[int]) -> None:
        """Blocks ``idxs`` are recomputed (a quarantine): drop their states; no tree, no bar from now on."""
        for idx in idxs:
            self.block_states.pop(idx, None)
        self.tree, self.progress = None, None

    def _fold(self, idx: int, state: Any) -> None:
        if self.tree is not None:
            self.tree.arrive(idx, state)

    def _record_store(self, res: BlockResult) -> None:
        """The block's computed shards are in the store: written by its task, or now by the client."""
        rec = self.outcome.store_writes
        assert rec is not None and self.store is not None
        if res.stored is not None:
            rec["blocks_by_workers"] += 1
            self.store.check_lease()     # the workers checked the lease once: a run taken over stops here
            return
        computed = {s: res.shard_states[s] for s in res.computed}
        self.store.write_shards(computed, res.worker, encoder=getattr(self.reducer, "encode", encode))
        rec["blocks_by_client"] += 1
        if res.store_note and not rec.get("client_reason"):
            rec["client_reason"] = res.store_note

    def _emit_accepted(self, a: int, b: int, worker: str, computed: int, state: Any) -> None:
        data: dict[str, Any] = {"start": a, "stop": b, "worker": worker, "computed": computed}
        if isinstance(state, Moments):
            self.estimate.add(state.n, state.mean, state.m2)
            data.update(n=self.estimate.n, mean=self.estimate.mean, stderr=self.estimate.stderr)
        self.emit("accepted", **data)
