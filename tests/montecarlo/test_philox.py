import numpy as np
import pytest

from dask_research import montecarlo as mc
from dask_research.montecarlo import philox
from dask_research.montecarlo.shard_compute import compute_block


def test_key_is_derived_from_the_root_seed():
    assert np.array_equal(philox.root_key(2026), philox.root_key(2026))
    assert not np.array_equal(philox.root_key(2026), philox.root_key(2027))
    assert philox.root_key(2026).dtype == np.uint64 and philox.root_key(2026).shape == (2,)


def test_shard_counter_ranges_are_disjoint_by_construction():
    key = philox.root_key(1)
    for shard in (0, 1, 317, 2**40):
        gen = philox.shard_generator(key, shard)
        state = gen.bit_generator.state["state"]["counter"]
        assert state.tolist() == [0, shard, 0, 0]
        gen.standard_normal(100_000)
        after = gen.bit_generator.state["state"]["counter"]
        # The shard consumed blocks only in counter word 0: it cannot reach shard + 1's range.
        assert after[1] == shard and after[2] == 0 and 0 < after[0] < 2**63
    pilot = philox.pilot_generator(key).bit_generator.state["state"]["counter"]
    assert pilot.tolist() == [0, 0, 1, 0]


def test_neighbouring_shards_draw_different_streams():
    key = philox.root_key(7)
    a = philox.shard_generator(key, 0).random(4096)
    b = philox.shard_generator(key, 1).random(4096)
    assert not np.intersect1d(a, b).size


@pytest.mark.parametrize("bad", [-1, 1.5, "3", True, 2**128])
def test_bad_seed_is_refused(bad):
    with pytest.raises(ValueError, match="seed="):
        mc.Job(lambda a: a, {"a": mc.Normal(0, 1)}, seed=bad)


def test_shard_alone_equals_the_shard_inside_a_block(small_job):
    reducer = small_job.make_reducer((0.0, 1.5))
    block = compute_block(small_job, reducer, 8, 16)
    for k in range(8, 16):
        assert mc.compute_shard(small_job, k, range=(0.0, 1.5)) == block.shard_states[k]
    # and shards differ from each other
    assert block.shard_states[8] != block.shard_states[9]


def test_shard_draws_are_the_declared_philox_stream(small_job):
    from dask_research.montecarlo.evaluate import draw_inputs

    draws = draw_inputs(small_job, philox.shard_generator(small_job.key, 5), 16)
    gen = np.random.Generator(np.random.Philox(key=philox.root_key(2026), counter=5 << 64))
    for name, mu, sd in zip("abcdefg", [1.0, 2.0, 0.5, 3.0, 0.8, 0.2, 0.0], [0.1, 0.3, 0.05, 0.4, 0.1, 0.3, 1.0]):
        z = gen.standard_normal(16)
        np.testing.assert_array_equal(draws[name], z * sd + mu)


def test_compute_shard_rejects_an_index_outside_the_job(small_job):
    with pytest.raises(ValueError, match=r"shard=24 is invalid; expected an index in \[0, 24\)"):
        mc.compute_shard(small_job, 24)
