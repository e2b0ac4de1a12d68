"""Every capability's seed= takes what NumPy's default_rng takes (where it can honour it), one way."""
import numpy as np
import pytest

from dask_research import montecarlo as mc
from dask_research import replay
from dask_research.exceptions import InputError
from dask_research.experiments import IterationScheduler
from dask_research.seeds import seed_int, seed_sequence

SPEC = {"x": ((), "int64")}


def _product(a, b):
    return a * b


def _job(seed):
    return mc.Job(_product, {"a": mc.Normal(1.0, 0.1), "b": mc.Uniform(0.5, 1.5)}, shards=4,
                  samples_per_shard=64, seed=seed)


def test_a_job_records_one_int_for_any_seed_and_its_address_follows_it():
    assert _job(np.random.SeedSequence(7)).id == _job(7).id != _job(8).id
    assert _job(np.random.SeedSequence(7)).seed == 7
    a, b = _job(np.random.default_rng(3)), _job(np.random.default_rng(3))
    assert a.id == b.id and isinstance(a.seed, int)         # a seeded generator: the same job
    fresh = _job(None)                                       # fresh entropy, recorded
    assert fresh.seed >= 0 and _job(fresh.seed).id == fresh.id != _job(None).id


def _draws(seed):
    plane = replay.ExperiencePlane(SPEC, capacity=64, seed=seed)
    try:
        plane.ingest({"x": np.arange(64)})
        return plane.sample(16).x.tolist()
    finally:
        plane.close()


def test_a_plane_seeded_by_an_int_or_its_seed_sequence_draws_the_same():
    assert _draws(7) == _draws(np.random.SeedSequence(7)) == _draws(7)
    assert _draws(7) != _draws(8)
    gen = np.random.default_rng(7)
    first, second = _draws(gen), _draws(gen)          # spawned children: independent streams
    assert first != second


@pytest.mark.parametrize("bad", [-1, 2.5, "7", True, [1, -2], []])
def test_a_bad_seed_is_one_input_error_everywhere(bad):
    with pytest.raises(InputError, match="seed=.* is invalid; expected an int >= 0 \\(or a list of them\\), a numpy SeedSequence"):
        replay.ExperiencePlane(SPEC, capacity=8, seed=bad)
    with pytest.raises(InputError, match="seed=.* is invalid; expected an int >= 0 \\(or a list of them\\), a numpy SeedSequence"):
        IterationScheduler(lambda h: 0.5, seed=bad, progress=False)
    with pytest.raises(InputError, match="Job: seed=.* is invalid; expected an int >= 0 \\(or a list of them\\), a numpy SeedSequence"):
        _job(bad)


def test_the_scheduler_journals_one_int_for_any_seed():
    assert IterationScheduler(lambda h: 0.5, seed=np.random.SeedSequence(11), progress=False).seed == 11
    s = IterationScheduler(lambda h: 0.5, seed=np.random.default_rng(3), progress=False).seed
    assert isinstance(s, int) and s >= 0
    assert seed_int(None) is None and seed_sequence(None) is None
