"""The NumPy Philox4x64-10 reference against numpy.random.Philox and Random123's answers."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dask_research.montecarlo import philox
from dask_research.montecarlo.gpu import philox_ref as ref
from dask_research.montecarlo.gpu.draws import uniforms

U64 = st.integers(0, 2**64 - 1)
# counters near every carry boundary, and arbitrary ones
EDGE = st.sampled_from([0, 1, 2**64 - 2, 2**64 - 1, 2**64, 2**128 - 1, 2**192 - 1, 2**256 - 1,
                        2**256 - 2, (2**64 - 1) << 64, ((2**64 - 1) << 64) | (2**64 - 1)])
COUNTER = st.one_of(EDGE, st.integers(0, 2**256 - 1))

# Random123 known-answer vectors for philox4x64 with 10 rounds, from Random123's
# examples/kat_vectors (D. E. Shaw Research; e.g. github.com/girving/random123-manual,
# examples/kat_vectors): "philox4x64 10 ctr[0..3] key[0..1] expected[0..3]".
KAT = [
    ((0, 0, 0, 0), (0, 0),
     (0x16554D9ECA36314C, 0xDB20FE9D672D0FDC, 0xD7E772CEE186176B, 0x7E68B68AEC7BA23B)),
    ((2**64 - 1,) * 4, (2**64 - 1,) * 2,
     (0x87B092C3013FE90B, 0x438C3C67BE8D0224, 0x9CC7D7C69CD777B6, 0xA09CAEBF594F0BA0)),
    ((0x243F6A8885A308D3, 0x13198A2E03707344, 0xA4093822299F31D0, 0x082EFA98EC4E6C89),
     (0x452821E638D01377, 0xBE5466CF34E90C6C),
     (0xA528F45403E61D95, 0x38C72DBD566E9788, 0xA5A1610E72FD18B5, 0x57BD43B5E52B7FE6)),
]


def key_of(k0, k1):
    return np.array([k0, k1], dtype=np.uint64)


@pytest.mark.parametrize("ctr, key, expected", KAT)
def test_random123_known_answers(ctr, key, expected):
    out = ref.philox4x64(np.array(ctr, dtype=np.uint64), key)
    assert [int(v) for v in out] == list(expected)


@settings(max_examples=300, deadline=None)
@given(U64, U64)
def test_mulhilo_is_the_128_bit_product(a, b):
    hi, lo = ref.mulhilo(np.array([a], dtype=np.uint64), b)
    assert (int(hi[0]) << 64) | int(lo[0]) == a * b


@settings(max_examples=150, deadline=None)
@given(U64, U64, st.integers(0, 2**64 - 1), st.integers(0, 41))
def test_shard_stream_equals_numpy_philox(k0, k1, shard, n):
    key = key_of(k0, k1)
    expected = np.random.Philox(key=key, counter=shard << 64).random_raw(n)
    np.testing.assert_array_equal(ref.raw_stream(key, shard << 64, n), expected)


@settings(max_examples=100, deadline=None)
@given(U64, U64, COUNTER, st.integers(1, 3), st.integers(0, 13))
def test_rows_equal_numpy_philox_for_any_counter_with_carries(k0, k1, counter, rows, n):
    key = key_of(k0, k1)
    out = ref.raw_rows(key, counter, rows, n)
    assert out.shape == (rows, n) and out.dtype == np.uint64
    for r in range(rows):
        c = (counter + (r << 64)) % 2**256
        np.testing.assert_array_equal(out[r], np.random.Philox(key=key, counter=c).random_raw(n))


def test_numpy_buffers_partial_blocks_and_the_reference_is_the_concatenation():
    # numpy keeps the rest of a 4-word block for the next call: 3 + 5 words = the first 8
    key = key_of(3, 5)
    bg = np.random.Philox(key=key, counter=7 << 64)
    got = np.concatenate([bg.random_raw(3), bg.random_raw(5)])
    np.testing.assert_array_equal(got, ref.raw_stream(key, 7 << 64, 8))


def test_the_engine_shard_generator_and_uniforms_are_the_reference_stream():
    key = philox.root_key(2026)
    for shard in (0, 1, 317, 2**64 - 1):
        raw = ref.raw_stream(key, philox.shard_counter(shard), 64)
        np.testing.assert_array_equal(
            philox.shard_generator(key, shard).bit_generator.random_raw(64), raw)
        # the portable 53-bit uniform is numpy's own next_double, bit for bit
        np.testing.assert_array_equal(uniforms(raw), philox.shard_generator(key, shard).random(64))


def test_bad_counters_are_refused_with_the_valid_range():
    from dask_research.exceptions import InputError

    with pytest.raises(InputError, match=r"2\*\*256"):
        ref.counter_words(2**256)
    with pytest.raises(InputError, match=r"\(\.\.\., 4\)"):
        ref.philox4x64(np.zeros((2, 3), dtype=np.uint64), (0, 0))
