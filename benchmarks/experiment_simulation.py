"""The simulated research problems of ``bench_experiments_suite`` and the strategies run on them.

A :class:`Problem` is one seed of one scenario with common random numbers for every strategy;
:func:`simulate` runs a strategy on it with 3 slots and exponential experiment durations on a
simulated clock (so completion order varies, without real sleeps). The strategies are FIFO,
round-robin, greedy, naive UCB1 (ignores experiments in flight), the scheduler's own policies
(the real ``Policy`` objects) and Optuna TPE by ask/tell. Needs ``scipy`` (the clipped-Gaussian
scenario) and, for :class:`OptunaTPE`, ``optuna``: the ``bench`` extra.

>>> prob = Problem("bernoulli", seed=0, horizon=60)
>>> out = simulate(SUITE_STRATEGIES["UCB1 (pending-aware, default)"](SUITE_K, 0), prob, 60)
>>> sorted(out)
['curve', 'found_best', 'regret', 'trigger_on_best', 'trigger_step', 'us_per_decision']
"""
from __future__ import annotations

import heapq
import math
import pathlib
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from dask_research.experiments.policies import (  # noqa: E402
    greedy_scores,
    make_policy,  # noqa: E402
    round_robin_scores,
    select,
    ucb1_scores,
)

SUITE_K, SUITE_SLOTS, SUITE_H = 20, 3, 3000
SUITE_CHECKS = (300, 3000)
SCENARIOS = ("bernoulli", "beta", "clipped-gaussian", "improving")


def _norm_cdf(x: np.ndarray) -> np.ndarray:
    from scipy.special import ndtr

    return ndtr(x)


class Problem:
    """One seed of one scenario: common random numbers for every strategy.

    ``reward(i, k)`` is what the k-th pull of branch i pays and ``mean(i, k)`` its expectation;
    ``duration[t]`` is how long the t-th dispatched experiment takes (exponential, mean 1, on a
    simulated clock), so completion order differs from dispatch order.
    """

    def __init__(self, scenario: str, seed: int, horizon: int = SUITE_H, k: int = SUITE_K):
        rng = np.random.default_rng([seed, SCENARIOS.index(scenario)])
        self.scenario, self.k, self.horizon = scenario, k, horizon
        self.duration = rng.exponential(1.0, horizon)
        u = rng.random((k, horizon))
        self.improving = scenario == "improving"
        if scenario == "bernoulli":
            self.p = rng.beta(2, 5, k)
            self.table = (u < self.p[:, None]).astype(float)
        elif scenario == "beta":
            self.p = rng.beta(2, 5, k)
            kappa = 8.0
            self.table = rng.beta(self.p[:, None] * kappa, (1 - self.p[:, None]) * kappa,
                                  (k, horizon))
        elif scenario == "clipped-gaussian":
            mu, sd = rng.uniform(0.1, 0.7, k), 0.25
            self.table = np.clip(rng.normal(mu[:, None], sd, (k, horizon)), 0.0, 1.0)
            a, b = (0 - mu) / sd, (1 - mu) / sd
            phi = lambda x: np.exp(-x * x / 2) / math.sqrt(2 * math.pi)  # noqa: E731
            self.p = (mu * (_norm_cdf(b) - _norm_cdf(a)) + sd * (phi(a) - phi(b))
                      + (1 - _norm_cdf(b)))
        else:
            # branches improve as follow-ups refine them: p_i(k) = a + (c - a)(1 - e^{-k/tau})
            start = rng.beta(2, 5, k) * 0.7
            gain = rng.uniform(0.0, 0.45, k) * (rng.random(k) < 0.5)
            tau = rng.uniform(20, 120, k)
            kk = np.arange(horizon)[None, :]
            self.curve = start[:, None] + gain[:, None] * (1 - np.exp(-kk / tau[:, None]))
            self.table = (u < self.curve).astype(float)
            self.p = self.curve[:, -1]
        if not self.improving:
            self.curve = None

    def mean(self, i: int, k: int) -> float:
        return float(self.curve[i, k]) if self.improving else float(self.p[i])

    def oracle(self, horizon: int) -> tuple[int, np.ndarray]:
        """Best fixed branch for ``horizon`` pulls and its cumulative expected reward."""
        if not self.improving:
            i = int(np.argmax(self.p))
            return i, self.p[i] * np.arange(1, horizon + 1)
        cum = np.cumsum(self.curve[:, :horizon], axis=1)
        i = int(np.argmax(cum[:, -1]))
        return i, cum[i]


class _Arrays:
    """The subset of BranchLedger that the scheduler's policies read (for the simulation)."""

    def __init__(self, k: int):
        self.branches = [f"b{j}" for j in range(k)]
        self.runs = np.zeros(k, np.int64)
        self.pending = np.zeros(k, np.int64)
        self.n = np.zeros(k)
        self.reward_sum = np.zeros(k)
        self.sq_sum = np.zeros(k)
        self.mean = np.zeros(k)
        self.eligible = np.ones(k, bool)
        self.total_n = 0


class PolicyAgent:
    """Runs one of the scheduler's policies (``make_policy``) on simulated branches."""

    def __init__(self, name: str, k: int, seed: int, **kw):
        self.policy = make_policy(name, seed=seed, **kw)
        self.led = _Arrays(k)
        self.naive = False

    def select(self) -> int:
        led = self.led
        scores = self.policy.scores(led)
        return self.policy.choose(led, scores, led.eligible)  # type: ignore[return-value]

    def dispatch(self, i: int) -> None:
        led = self.led
        led.pending[i] += 1
        led.n[i] += 1
        led.total_n += 1

    def update(self, i: int, reward: float) -> None:
        led = self.led
        led.pending[i] -= 1
        led.runs[i] += 1
        led.reward_sum[i] += reward
        led.sq_sum[i] += reward * reward
        led.mean[i] = led.reward_sum[i] / led.runs[i]
        self.policy.on_result(led, i, None, reward)  # type: ignore[arg-type]


class NaiveUCB1(PolicyAgent):
    """UCB1 that ignores experiments in flight (n = completed runs only)."""

    def __init__(self, k: int, seed: int):
        super().__init__("ucb1", k, seed)

    def select(self) -> int:
        led = self.led
        runs = led.runs.astype(float)
        return select(ucb1_scores(led.mean, runs, 2 ** 0.5, float(runs.sum())), led.eligible)


class RoundRobin(PolicyAgent):
    def __init__(self, k: int, seed: int):
        super().__init__("ucb1", k, seed)

    def select(self) -> int:
        return select(round_robin_scores(self.led.n), self.led.eligible)


class Greedy(PolicyAgent):
    def __init__(self, k: int, seed: int):
        super().__init__("ucb1", k, seed)

    def select(self) -> int:
        return select(greedy_scores(self.led.mean, self.led.n), self.led.eligible)


class FIFO(PolicyAgent):
    """The queue in the order it was filled: every branch equally often, shuffled."""

    def __init__(self, k: int, seed: int, horizon: int = SUITE_H):
        super().__init__("ucb1", k, seed)
        order = np.repeat(np.arange(k), horizon // k + 1)
        np.random.default_rng(seed + 77).shuffle(order)
        self.order, self.t = order.tolist(), 0

    def select(self) -> int:
        self.t += 1
        return self.order[self.t - 1]


class OptunaTPE:
    """Optuna's default TPESampler choosing a branch by ask/tell (constant liar in 5.0)."""

    def __init__(self, k: int, seed: int):
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.study = optuna.create_study(direction="maximize",
                                         sampler=optuna.samplers.TPESampler(seed=seed))
        self.choices = list(range(k))
        self.trials: dict[int, list] = {}

    def select(self) -> int:
        trial = self.study.ask()
        i = trial.suggest_categorical("branch", self.choices)
        self.trials.setdefault(i, []).append(trial)
        return i

    def dispatch(self, i: int) -> None:
        pass

    def update(self, i: int, reward: float) -> None:
        self.study.tell(self.trials[i].pop(0), reward)


SUITE_STRATEGIES: dict[str, Any] = {
    "FIFO": FIFO,
    "round-robin": RoundRobin,
    "greedy": Greedy,
    "naive UCB1 (no pending)": NaiveUCB1,
    "UCB1 (pending-aware, default)": lambda k, s: PolicyAgent("ucb1", k, s),
    "UCB1-Tuned": lambda k, s: PolicyAgent("ucb1-tuned", k, s),
    "KL-UCB": lambda k, s: PolicyAgent("kl-ucb", k, s),
    "Thompson": lambda k, s: PolicyAgent("thompson", k, s),
    "Thompson (Gaussian posterior)": lambda k, s: PolicyAgent("thompson-gaussian", k, s),
    "discounted UCB (gamma 0.99)": lambda k, s: PolicyAgent("discounted-ucb", k, s,
                                                            gamma=0.99),
    "discounted UCB (gamma 0.999)": lambda k, s: PolicyAgent("discounted-ucb", k, s,
                                                             gamma=0.999),
}
OURS = ["UCB1 (pending-aware, default)", "UCB1-Tuned", "KL-UCB", "Thompson",
        "Thompson (Gaussian posterior)", "discounted UCB (gamma 0.99)",
        "discounted UCB (gamma 0.999)"]


def simulate(agent: Any, prob: Problem, horizon: int) -> dict:
    """Run ``horizon`` experiments with 3 slots on the simulated clock.

    Returns the cumulative pseudo-regret after each dispatch (against the best fixed branch
    for ``SUITE_H`` pulls), the regret at each check horizon (against the best branch for that
    horizon), the decision time, the first paper trigger and the most-pulled branch.
    """
    k = prob.k
    pulls = np.zeros(k, np.int64)
    runs = np.zeros(k, np.int64)
    sums = np.zeros(k)
    got = np.zeros(horizon)            # expected reward of each dispatch
    running: list[tuple[float, int, int, float]] = []
    now, t, spent = 0.0, 0, 0
    best_final = float(prob.p.max())
    threshold = 0.9 * best_final
    trigger: tuple[int, int] | None = None
    done = 0
    while t < horizon or running:
        while t < horizon and len(running) < SUITE_SLOTS:
            t0 = time.perf_counter_ns()
            i = agent.select()
            agent.dispatch(i)
            spent += time.perf_counter_ns() - t0
            kk = int(pulls[i])
            pulls[i] += 1
            got[t] = prob.mean(i, kk)
            heapq.heappush(running, (now + prob.duration[t], t, i, float(prob.table[i, kk])))
            t += 1
        now, _, i, reward = heapq.heappop(running)
        t0 = time.perf_counter_ns()
        agent.update(i, reward)
        spent += time.perf_counter_ns() - t0
        done += 1
        runs[i] += 1
        sums[i] += reward
        if trigger is None and runs[i] >= 5 and sums[i] / runs[i] >= threshold:
            trigger = (done, i)
    best_i, best_cum = prob.oracle(SUITE_H)
    curve = best_cum[:horizon] - np.cumsum(got)
    at = {}
    for h in SUITE_CHECKS:
        if h <= horizon:
            _, cum_h = prob.oracle(h)
            at[h] = float(cum_h[h - 1] - got[:h].sum())
    return {"curve": curve, "regret": at, "us_per_decision": spent / 1e3 / horizon,
            "trigger_step": None if trigger is None else trigger[0],
            "trigger_on_best": None if trigger is None else trigger[1] == best_i,
            "found_best": int(np.argmax(pulls)) == best_i}

