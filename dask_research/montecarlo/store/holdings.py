"""What a store holds of a job, asked once before a run: nothing, some shards, or all of them.

A run asks its store one question before it submits anything
(:meth:`~.runstore.RunStore.holdings`, under the run's lease, so nobody else writes meanwhile):
the manifest the run continues under, and the accepted shard states it may reuse, each checked
against the job (:func:`stored_state_problem`). The answer is a :class:`Holdings`; the run then
computes only what is missing.

Examples
--------
>>> import tempfile
>>> from dask_research.montecarlo import Job, Normal, RunStore, compute_shard, pilot
>>> job = Job(lambda a: 2 * a, {"a": Normal(0.0, 1.0)}, shards=4, samples_per_shard=256, seed=1,
...           range=(-8.0, 8.0))
>>> store = RunStore(tempfile.mkdtemp())
>>> store.holdings(job, pilot(job)).status         # a new run: its manifest is written now
'nothing'
>>> _ = store.write_shards(job.id, {0: compute_shard(job, 0), 1: compute_shard(job, 1)}, "here")
>>> held = store.holdings(job)
>>> held.status, sorted(held.states), held.missing, held.range
('partial', [0, 1], 2, (-8.0, 8.0))
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..accumulators import Moments, MomentsReducer

if TYPE_CHECKING:
    from ..job import Job

__all__ = ["Holdings", "stored_state_problem", "state_problem", "template_of"]


@dataclass(frozen=True)
class Holdings:
    """What a store holds of a job: its manifest and the accepted shard states, checked.

    ``states`` maps a shard index to its accumulator, ``producers`` to the worker that computed
    it. Without a store (``manifest=None``) a run holds nothing.

    >>> Holdings(shards=8).status, Holdings(shards=8).missing
    ('nothing', 8)
    """

    shards: int
    manifest: dict | None = None
    states: dict[int, Any] = field(default_factory=dict)
    producers: dict[int, str] = field(default_factory=dict)

    @property
    def range(self) -> tuple[float, float] | None:
        """The histogram range the run continues under (``None``: not recorded, or no store)."""
        rng = self.manifest.get("range") if self.manifest is not None else None
        return (rng[0], rng[1]) if rng is not None else None

    @property
    def missing(self) -> int:
        """Shards still to compute."""
        return self.shards - len(self.states)

    @property
    def status(self) -> str:
        """``"nothing"`` (no shard stored), ``"partial"`` or ``"complete"`` (every shard stored)."""
        return "nothing" if not self.states else "complete" if self.missing == 0 else "partial"


def stored_state_problem(job: Job, s: int, state: Any, template: Any) -> str | None:
    """Why the stored state ``state`` of shard ``s`` is not one of ``job``'s (``None``: it is).

    ``template`` is the run's fresh accumulator (``reducer.init()``; ``None``: not known yet).

    >>> from dask_research.montecarlo import Job, Normal, compute_shard
    >>> job = Job(lambda a: a, {"a": Normal(0.0, 1.0)}, shards=2, samples_per_shard=64, seed=1, range=(-5, 5))
    >>> template = job.make_reducer().init()
    >>> stored_state_problem(job, 1, compute_shard(job, 1), template) is None
    True
    >>> stored_state_problem(job, 2, compute_shard(job, 1), template)
    'holds shard 2, outside [0, 2)'
    """
    return state_problem(s, state, template, shards=job.shards, samples=job.samples_per_shard)


def state_problem(s: int, state: Any, template: Any, *, shards: int, samples: int,
                  moments: bool = False) -> str | None:
    """Why ``state`` is not what the run's reducer produces for shard ``s`` (``None``: it is).

    ``template`` is the run's fresh accumulator; ``moments`` says the run uses the built-in
    accumulator even when ``template`` is not known (its range was not recorded).

    >>> state_problem(0, 0, None, shards=4, samples=64, moments=True)
    "holds an int for shard 0, not the run's accumulator (moments and histogram)"
    """
    if not 0 <= s < shards:
        return f"holds shard {s}, outside [0, {shards})"
    if isinstance(template, Moments) or (template is None and moments):
        if not isinstance(state, Moments):
            return f"holds {_a(state)} for shard {s}, not the run's accumulator (moments and histogram)"
        if template is not None and (state.lo, state.hi, state.bins) != (template.lo, template.hi, template.bins):
            return (f"shard {s} has histogram [{state.lo}, {state.hi}) x {state.bins}, not the run's "
                    f"[{template.lo}, {template.hi}) x {template.bins} (a shard of another run?)")
        if state.n != samples:
            return f"shard {s} counts {state.n:,} samples, not {samples:,}"
    elif template is not None and type(state) is not type(template):
        return f"holds {_a(state)} for shard {s}; the reducer's state is {_a(template)}"
    return None


def _a(value: Any) -> str:
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def template_of(manifest: dict) -> tuple[Any, bool]:
    """``(template, moments)`` for the states of the run a (checked) manifest describes.

    ``moments``: the run uses the built-in accumulator; ``template`` its fresh state on the
    run's histogram (``None`` when the range was not recorded, or for a user reducer, whose
    states only its own code knows).

    >>> template_of({"job": {"accumulate": {"reducer": {}}}, "range": None})
    (None, False)
    >>> t, moments = template_of({"job": {"accumulate": {"bins": 4, "range": [0.0, 1.0]}}, "range": [0.0, 1.0]})
    >>> (t.lo, t.hi, t.bins, moments)
    (0.0, 1.0, 4, True)
    """
    acc = manifest["job"]["accumulate"]
    if "reducer" in acc:
        return None, False
    rng = acc.get("range") if isinstance(acc.get("range"), list) else manifest.get("range")
    bins = acc.get("bins")
    if rng is None or bins is None:
        return None, True
    return MomentsReducer((float(rng[0]), float(rng[1])), int(bins)).init(), True
