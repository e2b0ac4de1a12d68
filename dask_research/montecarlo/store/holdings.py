"""What a store holds of a job, asked once before a run: nothing, some shards, or all of them.

A run asks its store one question before it submits anything (:func:`holdings`, under the
run's lease, so nobody else writes meanwhile): the manifest the run continues under, and the
accepted shard states it may reuse, each checked against the job. The answer is a
:class:`Holdings`; the run then computes only what is missing.

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

from ...exceptions import StoreError
from ..accumulators import Moments
from .manifest import build_manifest, check_manifest

if TYPE_CHECKING:
    from ..job import Job
    from ..pilot import Pilot
    from .runstore import RunStore

__all__ = ["Holdings", "holdings"]


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


def holdings(store: RunStore, job: Job, pilot: Pilot | None = None) -> Holdings:
    """Ask ``store`` once what it holds of ``job``; with ``pilot``, a missing manifest is written.

    A run with a manifest is checked against the job (:func:`.manifest.check_manifest`).
    Shards without a manifest (a deleted manifest) are validated against the job and the
    pilot's range, which is a deterministic function of the job, and reused; the manifest is
    then written again. Without ``pilot`` (a reader) the manifest must exist. Every stored
    shard must be one of the job's, with the run's histogram and sample count. The caller of a
    writing ask holds the run's lease, so nobody else writes while this is read.
    """
    run_dir = store.run_dir(job.id)
    mpath = store.display(run_dir + "/manifest.json")
    store.refuse_links(job.id)
    if store.has_run(job.id):
        manifest = store.read_manifest(job.id)
        check_manifest(manifest, job, mpath)
        orphan = False
    elif pilot is None:
        manifest = store.read_manifest(job.id)      # raises: does not exist
    else:
        manifest = build_manifest(job, pilot)
        orphan = True
    rng = manifest["range"]
    stored = store.read_shards(job.id)
    reducer = job.make_reducer(tuple(rng) if rng is not None else None) if (rng or job.frozen) else None
    template = reducer.init() if reducer is not None else None
    for s, (state, _, fpath) in stored.items():
        problem = _problem(job, s, state, template)
        if problem:
            if orphan:
                problem += (f"; the run's manifest is missing, so these shards cannot be reused: delete "
                            f"{store.display(run_dir)} to compute the run again")
            raise StoreError(store.display(fpath), problem)
    if orphan:
        store.write_manifest(job.id, manifest)
    return Holdings(job.shards, manifest, {s: v[0] for s, v in stored.items()}, {s: v[1] for s, v in stored.items()})


def _problem(job: Job, s: int, state: Any, template: Any) -> str | None:
    """Why the stored state of shard ``s`` is not one of ``job``'s (``None``: it is)."""
    if not 0 <= s < job.shards:
        return f"holds shard {s}, outside [0, {job.shards})"
    if isinstance(template, Moments):
        if not isinstance(state, Moments):
            return f"holds a {type(state).__name__} for shard {s}, not an accumulator"
        if (state.lo, state.hi, state.bins) != (template.lo, template.hi, template.bins):
            return f"shard {s} has histogram [{state.lo}, {state.hi}) x {state.bins}, not the run's"
        if state.n != job.samples_per_shard:
            return f"shard {s} counts {state.n:,} samples, not {job.samples_per_shard:,}"
    elif template is not None and type(state) is not type(template):
        return f"holds a {type(state).__name__} for shard {s}; the reducer's state is a {type(template).__name__}"
    return None
