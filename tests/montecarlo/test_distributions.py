import math

import numpy as np
import pytest

from dask_research import montecarlo as mc
from dask_research.exceptions import InputError

N = 200_000

CASES = [
    mc.Normal(1.5, 0.3),
    mc.LogNormal(0.2, 0.4),
    mc.Uniform(-1.0, 3.0),
    mc.Triangular(0.0, 1.0, 4.0),
    mc.Triangular(0.0, 0.0, 1.0),
    mc.TruncatedNormal(0.0, 1.0, 0.5, 2.0),
    mc.TruncatedNormal(1.0, 2.0, lo=0.0),
    mc.Beta(2.0, 5.0),
    mc.Beta(0.5, 0.5, -2.0, 2.0),
    mc.Fixed(3.25),
]


@pytest.mark.parametrize("dist", CASES, ids=repr)
def test_draws_match_declared_mean_and_variance(dist):
    x = dist.draw(np.random.default_rng(12), N)
    assert x.shape == (N,)
    mean, var = dist.mean()[0], dist.cov()[0, 0]
    if var == 0:
        assert (x == mean).all()
        return
    # 5 standard errors of the mean and of the variance (4th moment bounded by 10 var^2 here).
    assert abs(x.mean() - mean) < 5 * math.sqrt(var / N)
    assert abs(x.var() - var) < 5 * math.sqrt(10 * var * var / N)


def test_bounded_distributions_respect_their_support():
    gen = np.random.default_rng(3)
    assert ((x := mc.TruncatedNormal(0, 1, -0.5, 0.25).draw(gen, 10_000)) >= -0.5).all() and (x <= 0.25).all()
    assert ((x := mc.Triangular(1, 2, 5).draw(gen, 10_000)) >= 1).all() and (x <= 5).all()
    assert ((x := mc.Beta(2, 2, 3, 4).draw(gen, 10_000)) >= 3).all() and (x <= 4).all()
    assert (mc.LogNormal(0, 1).draw(gen, 10_000) > 0).all()


def test_multivariate_block_has_declared_covariance():
    cov = [[0.04, 0.018, 0.0], [0.018, 0.09, -0.02], [0.0, -0.02, 0.25]]
    dist = mc.MultivariateNormal([1.0, 2.0, -1.0], cov)
    x = dist.draw(np.random.default_rng(5), N)
    assert x.shape == (3, N)
    np.testing.assert_allclose(x.mean(axis=1), [1, 2, -1], atol=0.01)
    np.testing.assert_allclose(np.cov(x), cov, atol=0.004)


def test_fixed_draws_nothing_from_the_stream():
    def f(a, b):
        return a + b

    with_fixed = mc.Job(f, {"a": mc.Fixed(1.0), "b": mc.Normal(0, 1)}, shards=2, samples_per_shard=64,
                        seed=4, range=(-9, 9))
    without = mc.Job(lambda b: b + 1.0, {"b": mc.Normal(0, 1)}, shards=2, samples_per_shard=64, seed=4,
                     range=(-9, 9))
    assert mc.compute_shard(with_fixed, 1) == mc.compute_shard(without, 1)


@pytest.mark.parametrize("key, dist, match", [
    ("a", mc.Normal(1.0, -0.1), r"input 'a' \(Normal\): sd=-0.1 is invalid; expected a positive"),
    ("a", mc.Normal(float("nan"), 1.0), r"input 'a' \(Normal\): mu=nan is invalid; expected a finite"),
    ("rate", mc.LogNormal(0.7, 0.0), r"input 'rate' \(LogNormal\): sigma=0.0 is invalid"),
    ("a", mc.Uniform(2.0, 1.0), r"input 'a' \(Uniform\): hi=1.0 is invalid; expected a finite number greater than lo=2.0"),
    ("a", mc.Triangular(0.0, 5.0, 1.0), r"mode=5.0 is invalid; expected a number in \[lo, hi\]"),
    ("a", mc.TruncatedNormal(0.0, 1.0, 8.0, 9.0), r"input 'a' \(TruncatedNormal\): lo=8.0 is invalid; expected bounds that keep"),
    ("a", mc.Beta(-1.0, 2.0), r"input 'a' \(Beta\): a=-1.0 is invalid; expected a positive"),
    ("a", mc.Fixed(float("inf")), r"value=inf is invalid"),
    (("a", "b"), mc.MultivariateNormal([0, 0], [[1, 2], [2, 1]]), r"input \('a', 'b'\).*cov=.*positive-definite"),
    (("a", "b"), mc.MultivariateNormal([0, 0], [[1, 0.1], [0.2, 1]]), r"a symmetric matrix"),
    (("a",), mc.MultivariateNormal([0, 0], [[1, 0], [0, 1]]), r"names=\('a',\) is invalid; expected 2 names"),
])
def test_invalid_parameters_name_the_input_and_value(key, dist, match):
    names = key if isinstance(key, tuple) else (key,)

    def pipeline(**kw):
        return sum(kw.values())

    with pytest.raises(InputError, match=match):
        mc.Job(pipeline, {key: dist}, shards=1, samples_per_shard=8)
    del names
