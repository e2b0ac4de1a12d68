"""A run's verification, as its blocks arrive and at the end: which states it keeps, what it blames.

Which shards may be checked is decided when the run starts (:mod:`.verify`): the ``k + 64``
hashed candidates, the first ``k`` of them checked before the run ends (their blocks go first,
so the checks are due early), and ``n`` of the shards reused from the store drawn
unpredictably. As blocks arrive, :class:`Verification` keeps the states those checks need (a
block returns only those: see :mod:`.blocks`), each producing worker's first shard (a worker
seen for the first time is always covered), and who produced every shard. An early check whose
shard exists is *due*; on a one-worker cluster the early checks ride in the run's last blocks
instead (:meth:`Verification.assign_riders`: no other worker exists to run them); otherwise the
engine submits the due checks (:meth:`Verification.submit_due`) once no block of the run waits for a thread, so they fill the threads that the last blocks leave idle
instead of delaying blocks (a check submitted mid-run runs ahead of the blocks the scheduler
still queues, and the run's last blocks then end later by its time). At the end it runs the
remaining checks on other workers (:class:`~.checks.Checks`) and says what failed: the workers
whose shards others cannot reproduce, and the stored files that hold a shard that differs from
its recomputation. What is dropped then (every shard of a faulty worker, every shard of an
edited file) is recomputed by the engine on good workers.

Examples
--------
>>> from dask_research.montecarlo import Job, Normal
>>> from dask_research.montecarlo.shard_compute import compute_block
>>> job = Job(lambda a: a, {"a": Normal(0.0, 1.0)}, shards=16, samples_per_shard=64, seed=1, range=(-8, 8))
>>> reducer = job.make_reducer(job.range)
>>> v = Verification(None, job, reducer, run_id=job.id, tag="t", k=2, known={}, emit=print)
>>> len(v.early), v.early <= v.candidates
(2, True)
>>> v.keep(compute_block(job, reducer, 0, 4))                # a first block from worker "local"
>>> v.first_of_worker, v.producers.among({0, 3})
({'local': 0}, {0: 'local', 3: 'local'})
>>> [s for s, _ in v.due] == sorted(v.early & {0, 1, 2, 3})    # its early checks wait for the engine
True
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .checks import Checks, Producers
from .shard_compute import BlockResult
from .timing import Limits
from .verify import choose_reused, hash_order, reused_count

__all__ = ["Verification"]


class Verification:
    """The verification of one execution: the states kept, the producers, the checks.

    ``k`` is the run's ``verify``, ``known`` the states reused from the store (the execution's
    own dict: a quarantine drops from it), ``known_producers`` who computed them,
    ``verify_reused`` the setting ``research.montecarlo.verify-reused``; ``emit(kind, **data)``
    sends a run event.
    """

    def __init__(self, client: Any, job: Any, reducer: Any, *, run_id: str, tag: str, k: int,
                 known: Mapping[int, Any], emit: Callable[..., None], known_producers: Mapping[int, str] | None = None,
                 verify_reused: int | str | None = None, limits: Limits | None = None, poll: float = 0.2):
        self.k, self.known = int(k), known
        self.reused = set(known)                   # shards reused from the store
        self.producers = Producers(job.shards, known_producers)
        # States kept for verification: the hashed candidates, and each worker's first shard.
        self.candidates = set(hash_order(run_id, job.shards, self.k + 64)) if self.k else set()
        self.kept: dict[int, Any] = {s: st for s, st in known.items() if s in self.candidates}
        # Shards reused from a store are also checked, drawn unpredictably: the hashed picks are
        # public, so a store's editor would otherwise know which shards nobody recomputes.
        n_reused = reused_count(verify_reused, self.k, len(known)) if self.k else 0
        self.reused_picks = choose_reused(known, n_reused)
        self.kept.update({s: known[s] for s in self.reused_picks})
        self.first_of_worker: dict[str, int] = {}
        # The first k hashed shards are checked before the run ends: due as soon as they exist,
        # submitted when the engine says the run's last blocks are all running (submit_due).
        self.early = set(hash_order(run_id, job.shards, self.k)) if self.k else set()
        self.due: list[tuple[int, str]] = []       # (shard, producer) of early checks not submitted yet
        # On a one-worker cluster the early checks ride in the run's last blocks (assign_riders):
        self.riding: set[int] = set()
        self.rode: dict[int, tuple[Any, str]] = {}  # shard -> (its recomputed state, the worker)
        self.checks = Checks(client, job, reducer, run_id=run_id, tag=tag, emit=emit,
                             limits=limits if limits is not None else Limits(block=1), poll=poll)

    def checked_early(self, a: int, b: int) -> bool:
        """Whether shards ``a..b-1`` hold one of the shards checked as soon as it exists."""
        return bool(self.early.intersection(range(a, b)))

    def assign_riders(self, order: Sequence[int], bounds: Sequence[tuple[int, int]], one_worker: bool) -> dict[int, tuple[int, ...]]:
        """Which blocks recompute which early checks' shards (block index -> shards), on a
        one-worker cluster; ``{}`` elsewhere.

        A check is a task of its own so that it can run on a worker other than its shard's
        producer. With one worker there is no other: the check recomputes the shard on the
        producer's worker either way, so it rides in one of the run's last blocks (``order``:
        the order blocks are submitted in), never its own shard's block, instead of costing a
        task, a hand-off and a round trip after the last block. Its state comes back with that
        block; :meth:`verify` still sends a check of its own where the rider ran on the
        producer's worker while another worker is alive (a cluster that grew).

        >>> from dask_research.montecarlo import Job, Normal
        >>> job = Job(lambda a: a, {"a": Normal(0.0, 1.0)}, shards=16, samples_per_shard=8, seed=1, range=(-8, 8))
        >>> v = Verification(None, job, job.make_reducer(), run_id="ab" * 32, tag="t", k=2, known={}, emit=print)
        >>> riders = v.assign_riders([0, 1, 2, 3], [(0, 4), (4, 8), (8, 12), (12, 16)], one_worker=True)
        >>> sorted(s for shards in riders.values() for s in shards) == sorted(v.early)
        True
        >>> all(not a <= s < b for idx, shards in riders.items() for s in shards for a, b in [(4 * idx, 4 * idx + 4)])
        True
        >>> v.assign_riders([0, 1, 2, 3], [(0, 4), (4, 8), (8, 12), (12, 16)], one_worker=False)
        {}
        """
        if not one_worker or len(order) < 2:
            return {}
        block_of: dict[int, int] = {}
        for idx in order:
            a, b = bounds[idx]
            for s in self.early.intersection(range(a, b)):
                if s not in self.known:             # a reused shard's check stays a check
                    block_of[s] = idx
        carriers = list(reversed(order))            # the last blocks submitted first
        riders: dict[int, list[int]] = {}
        turn = 0
        for s in sorted(block_of):
            while carriers[turn % len(carriers)] == block_of[s]:
                turn += 1
            riders.setdefault(carriers[turn % len(carriers)], []).append(s)
            turn += 1
        self.riding = set(block_of)
        return {idx: tuple(shards) for idx, shards in riders.items()}

    def keep_stored(self, a: int, b: int) -> None:
        """Shards ``a..b-1`` were all reused from the store: keep the candidates among them."""
        for s in range(a, b):
            if s in self.candidates:
                self.kept[s] = self.known[s]

    def keep(self, res: BlockResult) -> None:
        """Block ``res`` was accepted: its producer, the states kept, the checks due now."""
        self.producers.record(res.computed, res.worker)
        states = res.shard_states    # a block that wrote the store returns only the few kept here
        small, large = (states, self.candidates) if len(states) < len(self.candidates) else (self.candidates, states)
        for s in [s for s in small if s in large]:
            if s not in self.known:    # computed by this task (a known shard's state is the stored one)
                self.kept[s] = states[s]
        self.due += [(s, res.worker) for s in sorted(self.early.intersection(res.computed)) if s not in self.riding]
        for s, state in res.rechecks.items():
            if s in self.riding:
                self.rode.setdefault(s, (state, res.worker))
        if res.computed and res.worker not in self.first_of_worker:
            s0 = res.computed[0]
            self.first_of_worker[res.worker] = s0
            self.kept[s0] = res.shard_states[s0]
        if self.known:
            for s in range(res.start, res.stop):
                if s in self.known and s in self.candidates:
                    self.kept.setdefault(s, self.known[s])

    def submit_due(self) -> None:
        """Submit the early checks that are due (their shards exist), each on a worker other than
        its producer; the engine calls this once no block of the run waits for a thread."""
        due, self.due = self.due, []
        for s, producer in due:
            self.checks.submit(s, producer)

    def verify(self) -> tuple[dict, set[str], set[int]]:
        """Run and judge every check: the record, the faulty workers, the reused shards stored wrong."""
        self.submit_due()
        return self.checks.verify(self.kept, self.producers, self.first_of_worker, self.reused_picks, self.k,
                                  self.reused, rode=self.rode)

    def dropped(self, bad: set[str], bad_stored: set[int],
                stored: Mapping[int, tuple[str, str]]) -> tuple[set[int], set[str]]:
        """What a failed verification drops: every shard ``bad`` workers produced and every shard of a
        stored file holding one of ``bad_stored``; and those files. ``stored``: shard -> (worker, file)."""
        dropped = set(self.producers.shards_of(bad))
        edited = {f for s, (_, f) in stored.items() if s in bad_stored}
        dropped |= bad_stored | {s for s, (_, f) in stored.items() if f in edited}
        return dropped, edited
