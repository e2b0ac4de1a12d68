"""The extra index policies as pure functions: hand tables, an independent implementation
(MABWiser, when installed), the papers' own pseudo-code, and hypothesis properties."""
import ast
import importlib
import inspect
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dask_research.experiments.policies import select, ucb1_scores
from dask_research.experiments.policies.discounted import discount_update, discounted_ucb_scores
from dask_research.experiments.policies.klucb import bernoulli_kl, kl_ucb_scores
from dask_research.experiments.policies.linucb import LinUCBModel
from dask_research.experiments.policies.pareto import (
    dominates,
    pareto_front,
    pareto_select,
    pareto_ucb1_indices,
)
from dask_research.experiments.policies.thompson import thompson_scores
from dask_research.experiments.policies.tuned import ucb1_tuned_score, ucb1_tuned_scores
from dask_research.testing.experiments import branch_stats

PURE = ["ucb1", "base", "factory", "tuned", "klucb", "thompson", "discounted", "pareto", "linucb",
        "maxbandit"]


@pytest.mark.parametrize("name", PURE)
def test_policy_modules_import_nothing_from_dask(name):
    mod = importlib.import_module(f"dask_research.experiments.policies.{name}")
    tree = ast.parse(inspect.getsource(mod))
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    assert not [n for n in names if n.startswith(("dask", "distributed", "asyncio"))], names


# -- hand-computed tables -------------------------------------------------------------------
# KL-UCB: q with n d(p, q) = ln N, solved with scipy.optimize.brentq (independent of our
# bisection) when this table was written; the test also re-solves it if scipy is there.
KL_TABLE = [(0.5, 10, 100, 0.887909), (0.1, 5, 50, 0.695855), (0.9, 20, 200, 0.99719),
            (0.0, 3, 30, 0.67817), (0.3, 50, 1000, 0.560367), (1.0, 4, 40, 1.0)]


@pytest.mark.parametrize("p, n, total, q", KL_TABLE)
def test_kl_ucb_against_a_brentq_table(p, n, total, q):
    got = kl_ucb_scores([p], [n], total=total)[0]
    assert got == pytest.approx(q, abs=2e-6)
    optimize = pytest.importorskip("scipy.optimize")
    if p < 1:
        level = math.log(total) / n
        ref = optimize.brentq(lambda x: float(bernoulli_kl(p, x)) - level, max(p, 1e-12),
                              1 - 1e-15)
        assert got == pytest.approx(ref, abs=1e-8)


def test_kl_ucb_pending_and_untried():
    s = kl_ucb_scores([0.5, 0.5, 0.0], [10, 12, 0], total=100)   # 2 pending on the second
    assert s[1] < s[0] and s[2] == math.inf


def test_ucb1_tuned_by_hand():
    # rewards 0.2, 0.6 (mean 0.4, var 0.04) with N = 10: V = 0.04 + sqrt(2 ln 10 / 2) > 1/4
    got = ucb1_tuned_score(0.4, 0.2 ** 2 + 0.6 ** 2, runs=2, pending=0, total=10)
    assert got == pytest.approx(0.4 + math.sqrt(math.log(10) / 2 * 0.25))
    # many runs, small variance: the variance term wins over 1/4
    v = 0.01 + math.sqrt(2 * math.log(1000) / 500)
    got = ucb1_tuned_score(0.5, 500 * (0.25 + 0.01), runs=500, pending=0, total=1000)
    assert got == pytest.approx(0.5 + math.sqrt(math.log(1000) / 500 * v))


def test_discounted_ucb_with_gamma_1_is_ucb1():
    n, s = np.zeros(3), np.zeros(3)
    for arm, r in [(0, 1.0), (1, 0.0), (0, 0.5), (2, 0.25), (1, 1.0)]:
        discount_update(n, s, arm, r, gamma=1.0)
    pending = np.array([1, 0, 0])
    mean = s / n
    np.testing.assert_allclose(discounted_ucb_scores(n, s, pending, c=1.3),
                               ucb1_scores(mean, n + pending, c=1.3))


def test_discounted_ucb_forgets():
    n, s = np.zeros(2), np.zeros(2)
    for _ in range(50):
        discount_update(n, s, 0, 1.0, gamma=0.9)     # arm 0 paid well, long ago
    for _ in range(50):
        discount_update(n, s, 0, 0.0, gamma=0.9)     # then stopped paying
    assert s[0] / n[0] < 0.01 and n[0] == pytest.approx((1 - 0.9 ** 100) / 0.1)


def test_pareto_ucb1_index_by_hand():
    means = np.array([[0.8, 0.2], [0.2, 0.8], [0.1, 0.1]])
    u = pareto_ucb1_indices(means, n=[4, 4, 2])        # front of the means: 2 branches
    bonus = lambda n: math.sqrt(2 * math.log(10 * (2 * 2) ** 0.25) / n)   # noqa: E731
    np.testing.assert_allclose(u[0], means[0] + bonus(4))
    np.testing.assert_allclose(u[2], means[2] + bonus(2))
    assert pareto_ucb1_indices(means, n=[1, 1, 0])[2].tolist() == [math.inf, math.inf]


def test_pareto_select_is_uniform_over_the_front_and_seeded():
    idx = np.array([[0.9, 0.1], [0.1, 0.9], [0.5, 0.5], [0.4, 0.4]])
    rng = np.random.default_rng(3)
    picks = [pareto_select(idx, [True] * 4, rng)[0] for _ in range(3000)]
    counts = np.bincount(picks, minlength=4)
    assert counts[3] == 0 and all(abs(c / 3000 - 1 / 3) < 0.04 for c in counts[:3])
    again = [pareto_select(idx, [True] * 4, np.random.default_rng(3))[0] for _ in range(1)]
    assert again == picks[:1]
    assert pareto_select(idx, [False, False, False, True], rng)[0] == 3
    assert pareto_select(idx, [False] * 4, rng)[0] is None


def test_thompson_beta_posterior_and_seed():
    rng = np.random.default_rng(0)
    draws = np.array([thompson_scores([3.0], [4], [5], rng) for _ in range(20000)])[:, 0]
    # Beta(1 + 3, 1 + 5 - 3): the pending pull counts as a 0
    assert draws.mean() == pytest.approx(4 / 7, abs=0.01)
    a = thompson_scores([1.0, 2.0], [2, 3], [2, 3], np.random.default_rng(5))
    b = thompson_scores([1.0, 2.0], [2, 3], [2, 3], np.random.default_rng(5))
    assert (a == b).all()
    g = thompson_scores([10.0, 0.0], [5, 0], [5, 1], np.random.default_rng(1), bounded=False,
                        sq_sum=[21.0, 0.0])
    assert np.isfinite(g).all()                        # pending-only branch: finite draw
    assert thompson_scores([0.0], [0], [0], rng, bounded=False)[0] == math.inf


# -- LinUCB against the papers' pseudo-code and MABWiser --------------------------------------
def _li_hybrid_reference(pulls, contexts, alpha, d):
    """Li et al. (2010) Algorithm 2, transcribed line by line (z = x)."""
    A0, b0 = np.eye(d), np.zeros(d)
    A, B, b = {}, {}, {}
    for arm, x, r in pulls:
        x = np.asarray(x, float)
        z = x
        if arm not in A:
            A[arm], B[arm], b[arm] = np.eye(d), np.zeros((d, d)), np.zeros(d)
        Ai = np.linalg.inv(A[arm])
        A0 += B[arm].T @ Ai @ B[arm]
        b0 += B[arm].T @ Ai @ b[arm]
        A[arm] += np.outer(x, x)
        B[arm] += np.outer(x, z)
        b[arm] += r * x
        Ai = np.linalg.inv(A[arm])
        A0 += np.outer(z, z) - B[arm].T @ Ai @ B[arm]
        b0 += r * z - B[arm].T @ Ai @ b[arm]
    out = {}
    A0i = np.linalg.inv(A0)
    beta = A0i @ b0
    for arm, x in contexts:
        x = np.asarray(x, float)
        z = x
        Aa = A.get(arm, np.eye(d))
        Ba = B.get(arm, np.zeros((d, d)))
        ba = b.get(arm, np.zeros(d))
        Ai = np.linalg.inv(Aa)
        theta = Ai @ (ba - Ba @ beta)
        s = (z @ A0i @ z - 2 * z @ A0i @ Ba.T @ Ai @ x + x @ Ai @ x
             + x @ Ai @ Ba @ A0i @ Ba.T @ Ai @ x)
        out[(arm, tuple(x))] = z @ beta + x @ theta + alpha * math.sqrt(s)
    return out


def _pulls(seed, d=3, n=40, arms="abc"):
    rng = np.random.default_rng(seed)
    return [(arms[rng.integers(len(arms))], rng.uniform(-1, 1, d), float(rng.random()))
            for _ in range(n)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hybrid_linucb_equals_li_et_al_algorithm_2(seed):
    d, alpha = 3, 0.7
    pulls = _pulls(seed, d)
    model = LinUCBModel(d, alpha=alpha, hybrid=True)
    for arm, x, r in pulls:
        model.dispatch(arm, x)
        model.record(arm, x, r)
    contexts = [(arm, tuple(np.random.default_rng(seed + 10 + k).uniform(-1, 1, d)))
                for k, arm in enumerate("abcd")]
    ref = _li_hybrid_reference(pulls, contexts, alpha, d)
    for arm, x in contexts:
        got = model.scores(arm, np.array([x]))[0]
        assert got == pytest.approx(ref[(arm, tuple(x))], rel=1e-9)


def test_disjoint_linucb_by_hand_and_pending_narrows_the_width():
    m = LinUCBModel(2, alpha=1.0)
    x = np.array([1.0, 0.0])
    before = m.scores("a", x[None])[0]
    m.dispatch("a", x)                         # in flight: width narrows at once
    during = m.scores("a", x[None])[0]
    assert before == pytest.approx(1.0) and during == pytest.approx(math.sqrt(0.5))
    m.record("a", x, 0.8)                      # A = diag(2, 1), b = (0.8, 0): 0.4 + sqrt(.5)
    assert m.scores("a", x[None])[0] == pytest.approx(0.4 + math.sqrt(0.5))
    m.dispatch("a", x)
    m.cancel("a", x)                           # a failure takes the pull back out
    assert m.scores("a", x[None])[0] == pytest.approx(0.4 + math.sqrt(0.5))


def test_ucb1_and_linucb_against_mabwiser():
    mab = pytest.importorskip("mabwiser.mab")
    rng = np.random.default_rng(4)
    decisions = [int(a) for a in rng.integers(0, 4, 60)]
    rewards = [float(r) for r in rng.random(60)]
    # UCB1: MABWiser's score is mean + alpha sqrt(2 ln N / n), i.e. ours with c = alpha sqrt 2
    for alpha in (0.5, 1.0, 2.0):
        ref = mab.MAB(arms=[0, 1, 2, 3], learning_policy=mab.LearningPolicy.UCB1(alpha=alpha))
        ref.fit(decisions, rewards)
        want = ref.predict_expectations()
        n = np.bincount(decisions, minlength=4).astype(float)
        sums = np.bincount(decisions, weights=rewards, minlength=4)
        ours = ucb1_scores(sums / n, n, c=alpha * math.sqrt(2))
        np.testing.assert_allclose(ours, [want[a] for a in range(4)], rtol=1e-12)
    # LinUCB (disjoint): same ridge (lambda = 1) and alpha
    X = rng.uniform(-1, 1, (60, 3))
    ref = mab.MAB(arms=[0, 1, 2, 3], learning_policy=mab.LearningPolicy.LinUCB(
        alpha=0.8, l2_lambda=1.0))
    ref.fit(decisions, rewards, contexts=X)
    model = LinUCBModel(3, alpha=0.8)
    for a, x, r in zip(decisions, X, rewards):
        model.dispatch(str(a), x)
        model.record(str(a), x, r)
    probe = rng.uniform(-1, 1, (5, 3))
    want = ref.predict_expectations(probe)
    for j, row in enumerate(probe):
        for a in range(4):
            assert model.scores(str(a), row[None])[0] == pytest.approx(want[j][a], rel=1e-9)


# -- properties (strategies shipped in dask_research.testing.experiments) ---------------------
@settings(max_examples=60, deadline=None)
@given(branch_stats())
def test_every_index_is_inf_untried_and_finite_otherwise(s):
    n = s.n
    for scores in (ucb1_tuned_scores(s.mean, s.sq_sum, s.runs, n),
                   kl_ucb_scores(s.mean, n),
                   discounted_ucb_scores(s.runs.astype(float), s.reward_sum, s.pending, 1.0)):
        assert np.isinf(scores[n == 0]).all()
        assert np.isfinite(scores[n > 0]).all()
        pick = select(scores, s.eligible)
        assert pick is None or s.eligible[pick]


@settings(max_examples=60, deadline=None)
@given(branch_stats(min_branches=2))
def test_kl_ucb_lies_between_the_mean_and_1_and_below_the_hoeffding_bound(s):
    n = s.n
    k = kl_ucb_scores(s.mean, n)
    tried = n > 0
    assert (k[tried] >= s.mean[tried] - 1e-12).all() and (k[tried] <= 1.0).all()
    # Pinsker: d(p, q) >= 2 (q - p)^2, so KL-UCB is at most UCB1 with c = sqrt(1/2)
    hoeffding = ucb1_scores(s.mean, n, c=math.sqrt(0.5))
    assert (k[tried] <= hoeffding[tried] + 1e-7).all()


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(branch_stats(min_branches=2))
def test_a_pending_pull_never_raises_an_index(s):
    n = s.n
    i = int(np.argmax(n))                       # a branch with at least one pull, if any
    if n[i] == 0:
        return
    more = n.copy()
    more[i] += 1
    total = float(more.sum())
    assert kl_ucb_scores(s.mean, more, total=total)[i] <= kl_ucb_scores(
        s.mean, n, total=total)[i] + 1e-12
    assert ucb1_tuned_scores(s.mean, s.sq_sum, s.runs, more, total)[i] <= ucb1_tuned_scores(
        s.mean, s.sq_sum, s.runs, n, total)[i] + 1e-12


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(branch_stats(min_branches=2), st.integers(0, 2 ** 32 - 1))
def test_thompson_is_reproducible_and_in_range(s, seed):
    a = thompson_scores(s.reward_sum, s.runs, s.n, np.random.default_rng(seed))
    b = thompson_scores(s.reward_sum, s.runs, s.n, np.random.default_rng(seed))
    assert (a == b).all() and ((a >= 0) & (a <= 1)).all()


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 12), st.integers(1, 4), st.data())
def test_pareto_front_members_are_not_dominated(k, d, data):
    v = np.array(data.draw(st.lists(st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0]),
                                             min_size=d, max_size=d), min_size=k, max_size=k)))
    front = pareto_front(v)
    assert front.any()
    for i in range(k):
        dominated = any(dominates(v[j], v[i]) for j in range(k))
        assert front[i] == (not dominated)
    pick, mask = pareto_select(v, np.ones(k, bool), np.random.default_rng(0))
    assert mask[pick]
