"""BranchLedger against a plain-Python model (hypothesis state machine), and its errors."""
import math

import pytest
from hypothesis import note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dask_research.exceptions import ExperimentError
from dask_research.experiments import Hypothesis, Result
from dask_research.experiments.ledger import BranchLedger

C = 0.7


class LedgerMachine(RuleBasedStateMachine):
    """Every operation runs on the ledger and on dicts of lists assumed to be correct."""

    def __init__(self):
        super().__init__()
        self.ledger = BranchLedger(c=C)
        self.order: list[str] = []                       # branches by first appearance
        self.queues: dict[str, list[str]] = {}
        self.runs: dict[str, list[float]] = {}
        self.pending: dict[str, int] = {}
        self.pruned: set[str] = set()
        self.inflight: list[Hypothesis] = []
        self.next_id = 0

    def _model_pick(self):
        total = sum(len(self.runs[b]) + self.pending[b] for b in self.order)
        best, pick = -math.inf, None
        for b in self.order:
            if b in self.pruned or not self.queues[b]:
                continue
            n = len(self.runs[b]) + self.pending[b]
            if n == 0:
                score = math.inf
            else:
                mean = sum(self.runs[b]) / len(self.runs[b]) if self.runs[b] else 0.0
                score = mean + C * math.sqrt((math.log(total) if total > 1 else 0.0) / n)
            if score > best:
                best, pick = score, b
        return pick

    @rule(branch=st.sampled_from("abcdef"), count=st.integers(1, 3))
    def add(self, branch, count):
        hyps = [Hypothesis(f"h{self.next_id + k}", branch) for k in range(count)]
        self.next_id += count
        dropped = self.ledger.add(hyps)
        if branch not in self.queues:
            self.order.append(branch)
            self.queues[branch], self.runs[branch], self.pending[branch] = [], [], 0
        if branch in self.pruned:
            assert [h.id for h in dropped] == [h.id for h in hyps]
        else:
            assert dropped == []
            self.queues[branch] += [h.id for h in hyps]

    @rule()
    def dispatch(self):
        want = self._model_pick()
        got = self.ledger.select()
        note(f"model picks {want}, ledger {got and self.ledger.branches[got[0]]}")
        if want is None:
            assert got is None
            return
        assert self.ledger.branches[got[0]] == want
        h = self.ledger.pop(got[0])
        assert h.id == self.queues[want].pop(0)
        self.pending[want] += 1
        self.inflight.append(h)

    @precondition(lambda self: self.inflight)
    @rule(k=st.integers(0, 10), reward=st.floats(0, 1), fail=st.booleans())
    def finish(self, k, reward, fail):
        h = self.inflight.pop(k % len(self.inflight))
        self.pending[h.branch] -= 1
        if fail:
            self.ledger.record_failure(h)
        else:
            self.ledger.record(Result(h, reward))
            self.runs[h.branch].append(reward)

    @precondition(lambda self: self.order)
    @rule(data=st.data())
    def prune(self, data):
        b = data.draw(st.sampled_from(self.order))
        dropped = self.ledger.prune(self.ledger.index[b], "test")
        assert [h.id for h in dropped] == self.queues[b]
        self.queues[b] = []
        self.pruned.add(b)

    @invariant()
    def stats_agree(self):
        assert self.ledger.branches == self.order
        for b in self.order:
            s = self.ledger.stats(self.ledger.index[b])
            assert s.runs == len(self.runs[b])
            assert s.pending == self.pending[b]
            assert s.queued == len(self.queues[b])
            assert (s.pruned is not None) == (b in self.pruned)
            if self.runs[b]:
                assert s.mean == pytest.approx(sum(self.runs[b]) / len(self.runs[b]))
            else:
                assert math.isnan(s.mean)
        assert self.ledger.total_queued == sum(len(q) for q in self.queues.values())


LedgerMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40,
                                           deadline=None)
TestLedgerAgainstModel = LedgerMachine.TestCase


def test_duplicate_ids_are_refused_whole_batch():
    led = BranchLedger(c=1.0)
    led.add([Hypothesis("h1", "a")])
    with pytest.raises(ExperimentError, match="duplicate hypothesis id 'h1'"):
        led.add([Hypothesis("h2", "a"), Hypothesis("h1", "b")])
    with pytest.raises(ExperimentError, match="duplicate hypothesis id 'h3'"):
        led.add([Hypothesis("h3", "a"), Hypothesis("h3", "a")])
    assert led.total_queued == 1 and led.branches == ["a"]      # nothing of the bad batches


def test_unknown_branch_in_a_result():
    led = BranchLedger(c=1.0)
    led.add([Hypothesis("h1", "a"), Hypothesis("h2", "b")])
    with pytest.raises(ExperimentError, match="unknown branch 'zzz' in a result; known "
                                              "branches: 'a', 'b'"):
        led.record(Result(Hypothesis("x", "zzz"), 0.5))


def test_result_without_a_dispatch_is_refused():
    led = BranchLedger(c=1.0)
    led.add([Hypothesis("h1", "a")])
    with pytest.raises(ExperimentError, match="nothing in flight"):
        led.record(Result(Hypothesis("h1", "a"), 0.5))


def test_non_hypothesis_input():
    with pytest.raises(ExperimentError, match="expected Hypothesis objects, got dict"):
        BranchLedger(c=1.0).add([{"id": "h1", "branch": "a"}])
    with pytest.raises(ExperimentError, match="must be strings"):
        BranchLedger(c=1.0).add([Hypothesis(1, "a")])


def test_arrays_grow_past_their_capacity():
    led = BranchLedger(c=1.0, capacity=2)
    led.add([Hypothesis(f"h{k}", f"b{k}") for k in range(37)])
    picks = []
    while (pick := led.select()) is not None:
        picks.append(pick[0])
        led.pop(pick[0])
    assert picks == list(range(37))
