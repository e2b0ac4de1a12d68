import dataclasses

import numpy as np
import pytest

from dask_research import montecarlo as mc
from dask_research.exceptions import MergerError
from dask_research.montecarlo import Moments, check_merger, merge_moments


def _states(k=6, seed=0):
    rng = np.random.default_rng(seed)
    return [Moments.from_samples(rng.normal(size=rng.integers(5, 300)) * (i + 1), (-10, 10), 32)
            for i in range(k)]


def test_builtin_merger_passes_every_law():
    report = check_merger(merge_moments, _states(), identity=Moments.empty((-10, 10), 32))
    for law in ("pure", "identity", "commutative", "associative", "reversed fold", "random tree"):
        assert report.laws[law] > 0, law
    assert "associative" in str(report)


def _cm(states):
    return [(int(s.n), float(s.mean)) for s in states]


def test_unweighted_mean_of_means_is_refused_as_not_associative():
    def mean_of_means(a, b):
        return (a[0] + b[0], (a[1] + b[1]) / 2)

    with pytest.raises(MergerError, match=r"merger is not associative: merge\(merge\(s\d, s\d\), s\d\)") as err:
        check_merger(mean_of_means, _cm(_states()))
    assert err.value.law == "associative"
    assert "state[1]" in err.value.detail  # the field that differs


def test_order_dependent_merger_is_refused_as_not_commutative():
    def keep_left(a, b):
        return (a[0] + b[0], a[1])

    with pytest.raises(MergerError, match="not commutative"):
        check_merger(keep_left, _cm(_states()))


def test_integer_fields_are_compared_exactly():
    def sloppy_count(a, b):  # counts drift by one when merging large states
        n = a[0] + b[0] + (1 if a[0] + b[0] > 200 and a[0] > b[0] else 0)
        return (n, (a[0] * a[1] + b[0] * b[1]) / (a[0] + b[0]))

    with pytest.raises(MergerError, match=r"compared exactly"):
        check_merger(sloppy_count, [(100, 1.0), (150, 2.0), (90, 0.5), (120, 1.5)])


def test_merger_that_mutates_its_operand_is_refused():
    def inplace(a, b):
        a["hist"] += b["hist"]
        return a

    states = [{"hist": np.arange(4) * i} for i in range(4)]
    with pytest.raises(MergerError, match="not pure: merge\\(a, b\\) modified its operand a"):
        check_merger(inplace, states)


def test_wrong_identity_is_refused():
    def add(a, b):
        return a + b

    with pytest.raises(MergerError, match="not an identity"):
        check_merger(add, [1, 2, 3, 4], identity=1)
    check_merger(add, [1, 2, 3, 4], identity=0)


@dataclasses.dataclass
class SumCount:
    total: np.ndarray
    count: int


def test_user_dataclass_and_dict_states_with_float_tolerance():
    rng = np.random.default_rng(1)
    states = [SumCount(rng.normal(size=3), int(rng.integers(1, 9))) for _ in range(6)]

    def merge(a, b):
        return SumCount(a.total + b.total, a.count + b.count)

    check_merger(merge, states, identity=SumCount(np.zeros(3), 0))
    dict_states = [{"s": float(x), "n": 1} for x in rng.normal(size=5)]
    check_merger(lambda a, b: {"s": a["s"] + b["s"], "n": a["n"] + b["n"]}, dict_states)


def test_too_few_states():
    with pytest.raises(ValueError, match="at least 3 states"):
        check_merger(merge_moments, _states(2))


class MeanOfMeans:
    """A plausible but wrong user reducer."""

    def init(self):
        return (0, 0.0)

    def update(self, state, y):
        return self.merge(state, (y.size, float(y.mean())))

    def merge(self, a, b):
        if a[0] == 0:
            return b
        if b[0] == 0:
            return a
        return (a[0] + b[0], (a[1] + b[1]) / 2)

    def finalize(self, state):
        return state[1]


@pytest.mark.slow
def test_pool_refuses_a_failing_user_reducer_before_submitting(client):
    job = mc.Job(lambda a: a, {"a": mc.Normal(0, 1)}, shards=4, samples_per_shard=512, reducer=MeanOfMeans())
    with pytest.raises(MergerError, match="not associative"):
        mc.run(job, client=client, progress=False)
    assert client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)) == 0
