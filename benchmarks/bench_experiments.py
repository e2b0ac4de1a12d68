"""Benchmark of ``dask_research.experiments``: decision overhead, slot occupancy, regret.

Run one benchmark at a time::

    flock /tmp/dask-research-bench.lock python benchmarks/bench_experiments.py [--quick]

Figures (written to ``benchmarks/results/bench_experiments.json``):

1. **Decision overhead** with 10,000 queued hypotheses over 1,000 branches (goal < 100 us):
   (a) the decision alone, ``BranchLedger.select`` + ``pop`` (UCB1 over every branch,
   vectorised) with results recorded as they would arrive with 3 slots; (b) the live loop: the
   gap between a result and the refill of its slot, read from the trace of a real run with an
   instant runner (the result's bookkeeping and the decision), and the loop's wall time per
   experiment.
2. **Slot occupancy while work is queued** (goal >= 99 %) with the deterministic runner at
   5 ms, 3 slots: without a client (asyncio tasks) and with Dask futures (LocalCluster,
   processes=False). Next to it the *runner share*: the fraction of busy slot-time spent inside
   the runner; the rest is transport (the hand-off, Dask's ``client.submit``, measured
   separately, and the Dask round trip), which the occupancy counts as busy: a slot is busy
   from its dispatch event, stamped as the hand-off begins, to its result event.
3. **The bandit problem of PEERS.md section 2** (20 Beta(2, 5) arms, horizon 300, common
   random numbers, seeds 0-9): pseudo-regret and decision time of our UCB1 (c = sqrt 2, the
   default), round-robin, greedy and Optuna TPE ask/tell (if ``optuna`` is importable), plus
   UCB1 with 3 pending pulls per decision batch (how the scheduler decides with 3 slots), and
   a horizon-3000 extension without Optuna (too slow there: its cost grows with history).
4. **The research-problem suite of issue 6**: 20 branches; Bernoulli, Beta and clipped-Gaussian
   rewards with branch means drawn per seed, and a scenario whose branches improve as they are
   refined; 3 slots with exponential experiment durations on a simulated clock (so completion
   order varies, without real sleeps); horizons 300 and 3000; 30 seeds (``--seeds``). Every
   strategy sees the same coins (common random numbers per seed). Strategies: FIFO,
   round-robin, greedy, naive UCB1 (ignores experiments in flight), the scheduler's policies
   (pending-aware UCB1, UCB1-Tuned, KL-UCB, Thompson, discounted UCB: the real ``Policy``
   objects) and Optuna TPE by ask/tell when importable, on fewer seeds (its cost grows with
   history: ``--optuna-seeds-300``, ``--optuna-seeds-3000``). Cumulative pseudo-regret (mean,
   95 % interval, worst seed), first paper trigger, best branch found (the most-pulled one),
   decision overhead; regret curves to ``docs/_static/regret_curves.html`` (bokeh).
5. **Costs** of ``apply_order="dispatch"`` (occupancy and the delay before a result is counted,
   real asyncio runs with random durations) and of the checkpoint journal (loop time per
   experiment, bytes per experiment, time to resume).
6. **Memory per experiment** over 1,000 branches (instant runner, 3 slots, with a journal):
   what the trace and results hold after a run, and the peak and held memory of a resume
   (``tracemalloc``), with the bounded trace (``trace_scores=32``, the default) and with every
   score kept (``trace_scores="all"``), extrapolated to 100,000 experiments. Only this
   section: ``--memory-only`` (``--memory-experiments N``, default 20,000; 3,000 with
   ``--quick``).
"""
from __future__ import annotations

import argparse
import contextlib
import heapq
import math
import pathlib
import statistics
import sys
import tempfile
import time
import warnings
from typing import Any

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.harness import LoadMonitor, print_table, write_results  # noqa: E402
from dask_research.experiments import (  # noqa: E402
    Hypothesis,
    IterationScheduler,
    Result,
    make_deterministic_runner,
)
from dask_research.experiments.ledger import BranchLedger  # noqa: E402
from dask_research.experiments.policies import (  # noqa: E402
    greedy_scores,
    round_robin_scores,
    select,
    ucb1_scores,
)
from dask_research.experiments.scoring import make_policy  # noqa: E402

N_BRANCHES, N_QUEUED = 1_000, 10_000


def _hypotheses(n: int, branches: int, prefix: str = "h") -> list[Hypothesis]:
    return [Hypothesis(f"{prefix}{k}", f"b{k % branches}") for k in range(n)]


# -- 1. decision overhead ---------------------------------------------------------------------
def decision_alone(decisions: int, reps: int) -> dict:
    hyps = _hypotheses(N_QUEUED, N_BRANCHES)
    rng = np.random.default_rng(0)
    rewards = rng.random(decisions)
    per = []
    for _ in range(reps):
        led = BranchLedger(c=2 ** 0.5)
        led.add(hyps)
        inflight: list[Hypothesis] = []
        t0 = time.perf_counter()
        for k in range(decisions):
            i, _ = led.select()  # type: ignore[misc]
            inflight.append(led.pop(i))
            if len(inflight) == 3:           # 3 slots: a result frees one before each decision
                led.record(Result(inflight.pop(0), float(rewards[k])))
        per.append((time.perf_counter() - t0) / decisions)
        assert led.total_queued == N_QUEUED - decisions
    return {"us_per_decision": 1e6 * statistics.median(per),
            "reps_us": [round(1e6 * p, 2) for p in per],
            "queued_at_start": N_QUEUED, "queued_at_end": N_QUEUED - decisions,
            "branches": N_BRANCHES}


async def _instant(h: Hypothesis) -> float:
    return 0.5


def _refill_gaps(report) -> list[float]:
    """Seconds from each result to the refill of its slot, while work was queued."""
    gaps, freed = [], {}
    for ev in report.events:
        if ev.kind in ("result", "failure") and ev.data.get("queued", 0) > 0:
            freed[ev.slot] = ev.t
        elif ev.kind == "dispatch" and ev.slot in freed:
            gaps.append(ev.t - freed.pop(ev.slot))
    return gaps


def decision_live(reps: int) -> dict:
    walls, medians, p99s = [], [], []
    for _ in range(reps):
        sched = IterationScheduler(_instant, slots=3, progress=False, prune_floor=0.0)
        sched.add(_hypotheses(N_QUEUED, N_BRANCHES))
        report = sched.run()
        assert report.total_runs == N_QUEUED
        gaps = sorted(_refill_gaps(report))
        medians.append(gaps[len(gaps) // 2])
        p99s.append(gaps[int(0.99 * len(gaps))])
        walls.append(report.wall_seconds / report.dispatched)
    return {"refill_gap_us_median": 1e6 * statistics.median(medians),
            "refill_gap_us_p99": 1e6 * statistics.median(p99s),
            "loop_us_per_experiment": 1e6 * statistics.median(walls),
            "experiments": N_QUEUED, "branches": N_BRANCHES}


# -- 2. occupancy -------------------------------------------------------------------------------
def _occupancy_figures(report) -> dict:
    busy = sum(iv.end - iv.start for iv in report.events.intervals())
    inside = sum(r.duration for r in report.results)
    gaps = sorted(_refill_gaps(report))
    return {"occupancy": report.occupancy, "runner_share": inside / busy,
            "max_concurrency": report.events.max_concurrency(),
            "refill_gap_us_median": 1e6 * gaps[len(gaps) // 2],
            "wall_s": report.wall_seconds, "experiments": report.total_runs}


def _occupancy_scheduler(client, n: int, branches: int, delay_ms: float = 5) -> IterationScheduler:
    rewards = {f"b{k}": 0.3 + 0.6 * k / max(branches - 1, 1) for k in range(branches)}
    sched = IterationScheduler(make_deterministic_runner(rewards, delay_ms=delay_ms), slots=3,
                               client=client, progress=False, prune_floor=0.0)
    sched.add(_hypotheses(n, branches))
    return sched


def occupancy(n: int, reps: int, branches: int) -> dict:
    from distributed import Client, LocalCluster

    out = {}
    runs = [_occupancy_figures(_occupancy_scheduler(None, n, branches).run())
            for _ in range(reps)]
    out["asyncio"] = _median_of(runs)
    runs = [_occupancy_figures(_occupancy_scheduler(None, n, N_BRANCHES).run())
            for _ in range(reps)]
    out["asyncio, 1,000 branches"] = _median_of(runs)
    runs = [_occupancy_figures(_occupancy_scheduler(None, n // 4, branches, delay_ms=50).run())]
    out["asyncio, runner 50 ms (context)"] = _median_of(runs)
    with LocalCluster(n_workers=1, threads_per_worker=3, processes=False,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        _occupancy_scheduler(client, 30, branches).run()         # untimed warm-up
        with _timed_handoff() as handoff:
            runs = [_occupancy_figures(_occupancy_scheduler(client, n, branches).run())
                    for _ in range(reps)]
        out["dask_futures"] = _median_of(runs)
        out["dask_futures"]["handoff_us_median"] = 1e6 * statistics.median(handoff)
        t0 = time.perf_counter()
        client.gather(client.map(lambda x: x, range(500), pure=False))
        out["dask_futures"]["noop_task_ms"] = 1e3 * (time.perf_counter() - t0) / 500
    return out


@contextlib.contextmanager
def _timed_handoff():
    """Seconds each ``DaskBackend.submit`` (Dask's ``client.submit``) takes: the hand-off,
    which the trace counts as busy slot-time (the dispatch event is stamped as it begins)."""
    from dask_research.experiments import backends

    real, spent = backends.DaskBackend.submit, []

    def submit(self, h):
        t0 = time.perf_counter()
        try:
            return real(self, h)
        finally:
            spent.append(time.perf_counter() - t0)

    backends.DaskBackend.submit = submit
    try:
        yield spent
    finally:
        backends.DaskBackend.submit = real


def _median_of(runs: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


# -- 3. bandit regret: PEERS.md section 2 ------------------------------------------------------
def _problem(seed: int, horizon: int, arms: int = 20):
    p = np.random.default_rng(seed).beta(2, 5, arms)
    u = np.random.default_rng(seed + 1000).random((arms, horizon))
    return p, u


def _ucb(runs, sums, pending, c=2 ** 0.5):
    mean = np.divide(sums, runs, out=np.zeros_like(sums), where=runs > 0)
    return select(ucb1_scores(mean, runs + pending, c), _ALL)


def _round_robin(runs, sums, pending):
    return select(round_robin_scores(runs + pending), _ALL)


def _greedy(runs, sums, pending):
    mean = np.divide(sums, runs, out=np.zeros_like(sums), where=runs > 0)
    return select(greedy_scores(mean, runs + pending), _ALL)


_ALL = np.ones(20, bool)


def run_bandit(policy, seed: int, horizon: int, batch: int = 1) -> tuple[float, float]:
    """(pseudo-regret, seconds per decision) of ``policy`` on one seed."""
    p, u = _problem(seed, horizon)
    k = len(p)
    runs, sums, pending = np.zeros(k), np.zeros(k), np.zeros(k)
    pulls = np.zeros(k, dtype=int)
    regret, spent, t = 0.0, 0.0, 0
    best = p.max()
    while t < horizon:
        size = min(batch, horizon - t)
        t0 = time.perf_counter()
        chosen = []
        for _ in range(size):
            i = policy(runs, sums, pending)
            pending[i] += 1
            chosen.append(i)
        for i in chosen:
            reward = float(u[i, pulls[i]] < p[i])
            pulls[i] += 1
            pending[i] -= 1
            runs[i] += 1
            sums[i] += reward
        spent += time.perf_counter() - t0
        regret += float(sum(best - p[i] for i in chosen))
        t += size
    return regret, spent / horizon


def run_optuna(seed: int, horizon: int) -> tuple[float, float]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    p, u = _problem(seed, horizon)
    study = optuna.create_study(direction="maximize",
                                sampler=optuna.samplers.TPESampler(seed=seed))
    choices = list(range(len(p)))
    pulls = np.zeros(len(p), dtype=int)
    regret, spent = 0.0, 0.0
    for _ in range(horizon):
        t0 = time.perf_counter()
        trial = study.ask()
        i = trial.suggest_categorical("branch", choices)
        reward = float(u[i, pulls[i]] < p[i])
        study.tell(trial, reward)
        spent += time.perf_counter() - t0
        pulls[i] += 1
        regret += p.max() - p[i]
    return regret, spent / horizon


def bandit(seeds: range, horizon: int, reps: int, with_optuna: bool) -> dict:
    strategies = {
        "ucb1 (c=sqrt 2)": lambda s: run_bandit(_ucb, s, horizon),
        "ucb1, 3 pending per batch": lambda s: run_bandit(_ucb, s, horizon, batch=3),
        "round-robin": lambda s: run_bandit(_round_robin, s, horizon),
        "greedy": lambda s: run_bandit(_greedy, s, horizon),
        # extra: c chosen after looking at these seeds (not an out-of-sample claim)
        "ucb1 (c=0.5, tuned here)": lambda s: run_bandit(lambda r, m, p: _ucb(r, m, p, c=0.5),
                                                         s, horizon),
    }
    if with_optuna:
        strategies["optuna TPE ask/tell"] = lambda s: run_optuna(s, horizon)
    out = {}
    for name, fn in strategies.items():
        regrets, times = None, []
        for _ in range(reps):
            res = [fn(s) for s in seeds]
            r = [x[0] for x in res]
            assert regrets is None or r == regrets, f"{name}: regret is not deterministic"
            regrets = r
            times.append(statistics.mean(x[1] for x in res))
        out[name] = {"regret_mean": statistics.mean(regrets),
                     "regret_sd": statistics.stdev(regrets),
                     "regret_per_seed": [round(x, 3) for x in regrets],
                     "us_per_decision": 1e6 * statistics.median(times)}
    return out


# -- 4. the synthetic research-problem suite (issue 6) ----------------------------------------
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


def _interval(x: list[float]) -> tuple[float, float]:
    m = statistics.mean(x)
    half = 1.96 * statistics.stdev(x) / math.sqrt(len(x)) if len(x) > 1 else math.nan
    return m - half, m + half


def _summary(runs: list[dict], horizon: int) -> dict:
    r = [x["regret"][horizon] for x in runs if horizon in x["regret"]]
    trig = [x["trigger_step"] for x in runs if x["trigger_step"] is not None]
    lo, hi = _interval(r)
    return {"seeds": len(r), "regret_mean": statistics.mean(r), "regret_ci95": [lo, hi],
            "regret_worst": max(r), "regret_per_seed": [round(v, 2) for v in r],
            "first_trigger_median": statistics.median(trig) if trig else None,
            "trigger_rate": len(trig) / len(runs),
            "trigger_on_best": (sum(bool(x["trigger_on_best"]) for x in runs
                                    if x["trigger_step"] is not None) / len(trig)
                                if trig else None),
            "found_best": sum(x["found_best"] for x in runs if horizon in x["regret"])
            / len(r),
            "us_per_decision": statistics.median(x["us_per_decision"] for x in runs)}


def suite(seeds: int, optuna_seeds_300: int, optuna_seeds_3000: int, with_optuna: bool,
          curve_points: int = 120) -> dict:
    """Every strategy on every scenario; returns figures and mean regret curves."""
    out: dict = {"setup": {
        "branches": SUITE_K, "slots": SUITE_SLOTS, "horizons": list(SUITE_CHECKS),
        "seeds": seeds, "durations": "exponential, mean 1, simulated clock",
        "optuna_seeds": {"300": optuna_seeds_300, "3000": optuna_seeds_3000},
        "paper_trigger": "first time a branch with >= 5 results has mean >= 0.9 x the best "
                         "true mean; step = results applied so far"}}
    grid = np.unique(np.geomspace(1, SUITE_H, curve_points).astype(int)) - 1
    curves: dict = {}
    for scenario in SCENARIOS:
        probs = [Problem(scenario, s) for s in range(seeds)]
        res: dict = {}
        for name, make in SUITE_STRATEGIES.items():
            t0 = time.perf_counter()
            runs = [simulate(make(SUITE_K, s), probs[s], SUITE_H) for s in range(seeds)]
            res[name] = {str(h): _summary(runs, h) for h in SUITE_CHECKS}
            res[name]["seconds"] = time.perf_counter() - t0
            curves.setdefault(scenario, {})[name] = np.mean([r["curve"] for r in runs],
                                                            axis=0)[grid].tolist()
        if with_optuna:
            n_all = max(optuna_seeds_300, optuna_seeds_3000)
            runs = []
            t0 = time.perf_counter()
            for s in range(n_all):
                h = SUITE_H if s < optuna_seeds_3000 else 300
                runs.append(simulate(OptunaTPE(SUITE_K, s), probs[s], h))
            res["Optuna TPE (ask/tell)"] = {
                "300": _summary(runs[:optuna_seeds_300], 300),
                "3000": _summary(runs[:optuna_seeds_3000], 3000) if optuna_seeds_3000 else None,
                "seconds": time.perf_counter() - t0}
            if optuna_seeds_3000:
                curves[scenario]["Optuna TPE (ask/tell)"] = np.mean(
                    [r["curve"] for r in runs[:optuna_seeds_3000]], axis=0)[grid].tolist()
            # our policies on exactly the Optuna seeds, for a paired comparison at 3000
            paired = {}
            for name in OURS:
                sub = [simulate(SUITE_STRATEGIES[name](SUITE_K, s), probs[s], SUITE_H)
                       for s in range(optuna_seeds_3000)]
                paired[name] = statistics.mean(x["regret"][3000] for x in sub) if sub else None
            res["paired_with_optuna_3000"] = paired
        out[scenario] = res
        print(f"   {scenario}: done")
    out["curve_steps"] = (grid + 1).tolist()
    return out, curves


def suite_goals(figs: dict) -> dict:
    goals: dict = {}
    for scenario in SCENARIOS:
        res = figs[scenario]
        naive = res["naive UCB1 (no pending)"]["3000"]["regret_mean"]
        pend = res["UCB1 (pending-aware, default)"]["3000"]["regret_mean"]
        naive3 = res["naive UCB1 (no pending)"]["300"]["regret_mean"]
        pend3 = res["UCB1 (pending-aware, default)"]["300"]["regret_mean"]
        ours = {n: res[n]["3000"]["regret_mean"] for n in OURS}
        best = min(ours, key=ours.get)
        others = {n: v["3000"]["regret_mean"] for n, v in res.items()
                  if isinstance(v, dict) and n not in OURS and "3000" in v
                  and isinstance(v["3000"], dict) and not n.startswith("Optuna")}
        worst_best = res[best]["3000"]["regret_worst"]
        goals[scenario] = {
            "pending_beats_naive_300": pend3 < naive3, "pending_beats_naive_3000": pend < naive,
            "best_of_ours": best, "best_regret": ours[best],
            "lowest_of_all": all(ours[best] <= v for v in others.values()),
            "runner_up": min(others, key=others.get) if others else None,
            "worst_seed_of_best": worst_best,
            "worst_seed_over_mean": worst_best / ours[best] if ours[best] > 0 else None,
        }
        paired = res.get("paired_with_optuna_3000")
        opt = res.get("Optuna TPE (ask/tell)", {}).get("3000")
        if paired and opt:
            goals[scenario]["optuna_3000_paired"] = {"optuna": opt["regret_mean"],
                                                     "best_of_ours_same_seeds": paired[best]}
            goals[scenario]["lowest_of_all"] = (goals[scenario]["lowest_of_all"]
                                                and paired[best] <= opt["regret_mean"])
    return goals


def plot_curves(curves: dict, steps: list[int], path: pathlib.Path, figs: dict) -> None:
    """Mean cumulative regret against the number of experiments, one panel per scenario."""
    from bokeh.io import save
    from bokeh.layouts import gridplot
    from bokeh.models import Legend
    from bokeh.palettes import Category10_10
    from bokeh.plotting import figure
    from bokeh.resources import CDN

    panels = []
    for scenario in SCENARIOS:
        p = figure(title=f"{scenario}: mean cumulative regret, {figs['setup']['seeds']} seeds, "
                         f"{SUITE_K} branches, {SUITE_SLOTS} slots", x_axis_type="log",
                   width=620, height=380, x_axis_label="experiments",
                   y_axis_label="pseudo-regret")
        items = []
        for j, (name, ys) in enumerate(curves[scenario].items()):
            dash = "solid" if name in OURS else "dashed"
            r = p.line(steps[:len(ys)], ys, color=Category10_10[j % 10], line_width=2,
                       line_dash=dash)
            label = name
            if name.startswith("Optuna"):
                label += f" ({figs['setup']['optuna_seeds']['3000']} seeds)"
            items.append((label, [r]))
        p.add_layout(Legend(items=items, label_text_font_size="8pt"), "right")
        panels.append(p)
    grid = gridplot(panels, ncols=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    save(grid, filename=str(path), resources=CDN, title="dask-research: regret curves")


# -- 5. cost of apply_order="dispatch" and of the checkpoint journal --------------------------
def _random_runner(seed: int, mean_ms: float):
    import asyncio

    rng = np.random.default_rng(seed)
    rewards = np.random.default_rng(seed + 1).beta(2, 5, 20)

    async def runner(h: Hypothesis) -> float:
        await asyncio.sleep(float(rng.exponential(mean_ms / 1000)))
        return float(rewards[int(h.branch[1:])])

    return runner


def apply_order_cost(n: int, reps: int, mean_ms: float = 5.0) -> dict:
    out = {}
    for order in ("completion", "dispatch"):
        rows = []
        for rep in range(reps):
            sched = IterationScheduler(_random_runner(rep, mean_ms), slots=3, progress=False,
                                       prune_floor=0.0, apply_order=order)
            sched.add(_hypotheses(n, 20))
            report = sched.run()
            lat = []
            done = {e.hypothesis: e.t for e in report.events.of("finish")}
            for e in report.events.of("result"):
                if e.hypothesis in done:
                    lat.append(e.t - done[e.hypothesis])
            rows.append({"occupancy": report.occupancy,
                         "wall_s": report.wall_seconds,
                         "apply_latency_ms_mean": 1e3 * statistics.mean(lat) if lat else 0.0,
                         "apply_latency_ms_p90": 1e3 * sorted(lat)[int(0.9 * len(lat))]
                         if lat else 0.0})
        out[order] = _median_of(rows)
    out["setup"] = {"experiments": n, "slots": 3, "durations_ms": f"exponential, mean {mean_ms}"}
    return out


def checkpoint_cost(n: int, tmp: pathlib.Path) -> dict:
    out = {}
    for label, path in (("no checkpoint", None), ("checkpoint (local journal)",
                                                  tmp / "bench-loop.jsonl")):
        if path is not None and path.exists():
            path.unlink()
        sched = IterationScheduler(_instant, slots=3, progress=False, prune_floor=0.0,
                                   checkpoint=path)
        sched.add(_hypotheses(n, 100))
        report = sched.run()
        out[label] = {"loop_us_per_experiment": 1e6 * report.wall_seconds / report.dispatched}
        if path is not None:
            out[label]["journal_bytes_per_experiment"] = path.stat().st_size / n
            t0 = time.perf_counter()
            IterationScheduler.resume(path, _instant, progress=False)
            out[label]["resume_seconds"] = time.perf_counter() - t0
            path.unlink()
    out["setup"] = {"experiments": n, "branches": 100, "runner": "instant"}
    return out


def trace_memory(n: int, tmp: pathlib.Path, branches: int = 1_000) -> dict:
    """Bytes per experiment held by a run's trace and results, and by a resume."""
    import gc
    import tracemalloc

    out: dict = {}
    for mode in (32, "all"):
        path = tmp / f"mem-{mode}.jsonl"
        sched = IterationScheduler(_instant, slots=3, progress=False, prune_floor=0.0,
                                   paper_threshold=1.0, trace_scores=mode, checkpoint=path)
        sched.add(_hypotheses(n, branches))
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        report = sched.run()
        run_held = tracemalloc.get_traced_memory()[0] - base
        del report, sched
        gc.collect()
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        again = IterationScheduler.resume(path, _instant, progress=False)
        held, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        del again
        out[f"trace_scores={mode}"] = {
            "run_bytes_per_experiment": run_held / n,
            "resume_peak_bytes_per_experiment": (peak - base) / n,
            "resume_held_bytes_per_experiment": (held - base) / n,
            "journal_bytes_per_experiment": path.stat().st_size / n,
            "run_MiB_at_100k": run_held / n * 1e5 / 2 ** 20,
            "resume_peak_MiB_at_100k": (peak - base) / n * 1e5 / 2 ** 20,
        }
        path.unlink()
    out["setup"] = {"experiments": n, "branches": branches, "runner": "instant", "slots": 3,
                    "measured_with": "tracemalloc (Python and numpy allocations)"}
    return out


def _print_memory(mem: dict) -> None:
    print_table([(k, f"{v['run_bytes_per_experiment']:,.0f}",
                  f"{v['resume_peak_bytes_per_experiment']:,.0f}",
                  f"{v['resume_held_bytes_per_experiment']:,.0f}",
                  f"{v['journal_bytes_per_experiment']:,.0f}",
                  f"{v['run_MiB_at_100k']:,.0f} / {v['resume_peak_MiB_at_100k']:,.0f}")
                 for k, v in mem.items() if k != "setup"],
                ("trace", "run B/exp", "resume peak B/exp", "resume held B/exp",
                 "journal B/exp", "MiB at 100k: run / resume"))


def _optuna_available() -> bool:
    try:
        import optuna  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        print(f"optuna is not importable ({exc}); skipping the Optuna column "
              "(pip install optuna, or the `bench` extra)")
        return False
    return True


def main() -> None:
    # the scheduler's HTTP server falls back to a free port when 8787 is taken: harmless here
    warnings.filterwarnings("ignore", message="Port .* is already in use")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer reps and experiments")
    ap.add_argument("--seeds", type=int, default=30, help="seeds of the research suite")
    ap.add_argument("--optuna-seeds-300", type=int, default=10,
                    help="seeds on which Optuna runs to horizon 300")
    ap.add_argument("--optuna-seeds-3000", type=int, default=2,
                    help="seeds on which Optuna runs to horizon 3000 (about 15 s each)")
    ap.add_argument("--memory-only", action="store_true",
                    help="only section 6, memory per experiment (short)")
    ap.add_argument("--memory-experiments", type=int, default=None,
                    help="experiments of section 6 (default 20,000; 3,000 with --quick)")
    args = ap.parse_args()
    if args.quick:
        args.seeds, args.optuna_seeds_300, args.optuna_seeds_3000 = 5, 3, 1
    n_mem = args.memory_experiments or (3_000 if args.quick else 20_000)
    if args.memory_only:
        print(f"6. memory per experiment, {n_mem:,} experiments over 1,000 branches")
        with tempfile.TemporaryDirectory() as tmp:
            mem = trace_memory(n_mem, pathlib.Path(tmp))
        _print_memory(mem)
        path = write_results("bench_experiments_memory", {"memory": mem},
                             notes="tracemalloc figures; MiB at 100k are extrapolated linearly")
        print(f"wrote {path}")
        return
    reps = 1 if args.quick else 3
    figures: dict = {}
    with LoadMonitor() as load:
        print(f"1. decision overhead, {N_QUEUED:,} queued over {N_BRANCHES:,} branches")
        figures["decision_alone"] = decision_alone(2_000, reps)
        figures["decision_live"] = decision_live(1 if args.quick else 3)
        d, live = figures["decision_alone"], figures["decision_live"]
        print_table([
            ("select + pop (UCB1 over 1,000 branches)", f"{d['us_per_decision']:.1f}", "< 100"),
            ("live loop: result -> refill, median", f"{live['refill_gap_us_median']:.1f}", "< 100"),
            ("live loop: result -> refill, p99", f"{live['refill_gap_us_p99']:.1f}", ""),
            ("live loop: wall per experiment (instant runner)",
             f"{live['loop_us_per_experiment']:.1f}", ""),
        ], ("figure", "us", "goal"))

        print("\n2. slot occupancy while work is queued, 3 slots, runner sleeps 5 ms")
        figures["occupancy"] = occ = occupancy(150 if args.quick else 600, reps, branches=20)
        print("(20 branches unless said; the Dask row: LocalCluster 1 worker x 3 threads, "
              "processes=False)")
        print_table([(mode, f"{100 * f['occupancy']:.2f} %", f"{100 * f['runner_share']:.1f} %",
                      f"{f['refill_gap_us_median']:.0f}", f["max_concurrency"],
                      f"{f['wall_s']:.2f}")
                     for mode, f in occ.items()],
                    ("mode", "occupancy (goal >= 99 %)", "runner share", "refill us",
                     "max in flight", "wall s"))
        print(f"(Dask no-op task round trip on this machine: "
              f"{occ['dask_futures']['noop_task_ms']:.2f} ms; hand-off, client.submit: "
              f"{occ['dask_futures']['handoff_us_median']:.0f} us, counted as busy)")

        with_optuna = _optuna_available()
        print("\n3. bandit of PEERS.md section 2: 20 Beta(2,5) arms, horizon 300, seeds 0-9")
        figures["bandit_300"] = b = bandit(range(10), 300, reps, with_optuna)
        ours = b["ucb1 (c=sqrt 2)"]
        rows = []
        for name, f in b.items():
            ratio = f["us_per_decision"] / ours["us_per_decision"]
            rows.append((name, f"{f['regret_mean']:.1f}", f"{f['regret_sd']:.1f}",
                         f"{f['us_per_decision']:.1f}", f"{ratio:.1f}x"))
        print_table(rows, ("strategy", "regret", "sd", "us/decision", "time vs ucb1"))
        if with_optuna:
            opt = b["optuna TPE ask/tell"]
            figures["ratios"] = {
                "optuna_time_over_ucb1": opt["us_per_decision"] / ours["us_per_decision"],
                "ucb1_regret_over_optuna": ours["regret_mean"] / opt["regret_mean"],
            }
            print(f"Optuna TPE decides {figures['ratios']['optuna_time_over_ucb1']:.0f}x slower; "
                  f"UCB1 regret / TPE regret = {figures['ratios']['ucb1_regret_over_optuna']:.2f}")

        print("\n   extension: horizon 3000 (same seeds, U extended to 3000 columns; no Optuna)")
        figures["bandit_3000"] = b3 = bandit(range(10), 3000, 1, with_optuna=False)
        print_table([(n, f"{f['regret_mean']:.1f}", f"{f['regret_sd']:.1f}",
                      f"{f['us_per_decision']:.1f}") for n, f in b3.items()],
                    ("strategy", "regret", "sd", "us/decision"))
        print(f"\n4. research-problem suite: {SUITE_K} branches, {SUITE_SLOTS} slots, random "
              f"durations (simulated clock), horizons {SUITE_CHECKS}, {args.seeds} seeds")
        opt300 = min(args.seeds, args.optuna_seeds_300)
        opt3000 = min(args.seeds, args.optuna_seeds_3000)
        if with_optuna:
            print(f"   (Optuna TPE is slow at long horizons: {opt300} seeds at 300, "
                  f"{opt3000} at 3000; ours are also run on those seeds for a paired figure)")
        figures["suite"], curves = suite(args.seeds, opt300, opt3000, with_optuna)
        figures["suite_goals"] = goals = suite_goals(figures["suite"])
        for scenario in SCENARIOS:
            res = figures["suite"][scenario]
            rows = []
            for name, f in res.items():
                if not isinstance(f, dict) or "300" not in f:
                    continue
                cells = [name]
                for h in ("300", "3000"):
                    x = f.get(h)
                    if not x:
                        cells += ["-", "-"]
                        continue
                    lo, hi = x["regret_ci95"]
                    ci = f" [{lo:.1f}, {hi:.1f}]" if x["seeds"] > 1 else f" ({x['seeds']} seed)"
                    cells += [f"{x['regret_mean']:.1f}{ci}", f"{x['regret_worst']:.1f}"]
                x = f["3000"] or f["300"]
                trig = x["first_trigger_median"]
                cells += [f"{x['found_best']:.0%}", "-" if trig is None else f"{trig:.0f}",
                          f"{x['us_per_decision']:.1f}"]
                rows.append(tuple(cells))
            print(f"\n   {scenario}")
            print_table(rows, ("strategy", "regret@300 [95% CI]", "worst", "regret@3000 [95% CI]",
                               "worst", "found best", "1st trigger", "us/decision"))
            g = goals[scenario]
            print(f"   best of ours at 3000: {g['best_of_ours']} ({g['best_regret']:.1f}); "
                  f"lowest of all: {g['lowest_of_all']}; pending-aware < naive UCB1: "
                  f"{g['pending_beats_naive_300']} at 300, {g['pending_beats_naive_3000']} at "
                  f"3000; worst seed / mean {g['worst_seed_over_mean']:.2f}")
            if "optuna_3000_paired" in g:
                pr = g["optuna_3000_paired"]
                print(f"   paired on Optuna's {opt3000} seeds at 3000: Optuna "
                      f"{pr['optuna']:.1f}, {g['best_of_ours']} "
                      f"{pr['best_of_ours_same_seeds']:.1f}")
        if with_optuna:
            opt = {h: statistics.mean(
                figures["suite"][sc]["Optuna TPE (ask/tell)"][h]["us_per_decision"]
                for sc in SCENARIOS) for h in ("300", "3000")
                if figures["suite"][SCENARIOS[0]]["Optuna TPE (ask/tell)"][h]}
            over = {}
            rows = []
            for n in OURS:
                us = statistics.mean(figures["suite"][sc][n]["3000"]["us_per_decision"]
                                     for sc in SCENARIOS)
                over[n] = {"us_per_decision": us,
                           **{f"optuna_{h}_over_ours": v / us for h, v in opt.items()}}
                rows.append((n, f"{us:.1f}", *(f"{v / us:.0f}x" for v in opt.values())))
            figures["suite_overhead"] = {"optuna_us_per_decision": opt, "ours": over}
            print("\n   decision overhead (mean over scenarios, 3 slots, select + update)")
            print_table(rows + [("Optuna TPE", *(f"{v:.0f}" for v in opt.values()), "")],
                        ("policy", "us/decision", *(f"Optuna@{h} / ours" for h in opt)))
        html = pathlib.Path(__file__).resolve().parents[1] / "docs" / "_static" / \
            "regret_curves.html"
        plot_curves(curves, figures["suite"]["curve_steps"], html, figures["suite"])
        print(f"   regret curves: {html}")

        print("\n5. cost of apply_order='dispatch' (3 slots, exponential durations, mean 5 ms) "
              "and of the checkpoint journal")
        figures["apply_order"] = ao = apply_order_cost(150 if args.quick else 600, reps)
        print_table([(order, f"{100 * ao[order]['occupancy']:.1f} %",
                      f"{ao[order]['apply_latency_ms_mean']:.2f}",
                      f"{ao[order]['apply_latency_ms_p90']:.2f}", f"{ao[order]['wall_s']:.2f}")
                     for order in ("completion", "dispatch")],
                    ("apply order", "occupancy", "apply latency ms (mean)", "p90", "wall s"))
        with tempfile.TemporaryDirectory() as tmp:
            figures["checkpoint"] = ck = checkpoint_cost(2_000 if args.quick else 10_000,
                                                         pathlib.Path(tmp))
        print_table([(k, f"{v['loop_us_per_experiment']:.1f}",
                      f"{v.get('journal_bytes_per_experiment', 0):.0f}",
                      f"{v.get('resume_seconds', 0):.2f}")
                     for k, v in ck.items() if k != "setup"],
                    ("checkpoint", "loop us / experiment", "journal bytes / exp",
                     "resume s"))
        print(f"\n6. memory per experiment, {n_mem:,} experiments over 1,000 branches")
        with tempfile.TemporaryDirectory() as tmp:
            figures["memory"] = mem = trace_memory(n_mem, pathlib.Path(tmp))
        _print_memory(mem)
    figures["load"] = {"machine_busy": load.machine_busy, "own_busy": load.own_busy}
    foreign = load.machine_busy - load.own_busy
    print(f"\nmachine busy {100 * load.machine_busy:.0f} %, this process "
          f"{100 * load.own_busy:.0f} % (foreign load ~{100 * max(foreign, 0):.0f} %)")
    notes = ("occupancy = busy slot-time / available slot-time over the periods in which work "
             "was queued, from the scheduler's own trace (a slot is busy from its dispatch "
             "event, stamped as the hand-off to the backend begins, to its result event); "
             "runner_share = time inside the runner / busy slot-time (the rest is transport: "
             "the hand-off and the Dask round trip). Regret is pseudo-regret "
             "sum(max p - p_chosen).")
    if not math.isnan(load.machine_busy) and foreign > 0.05:
        notes += f" Foreign load during the run: {100 * foreign:.0f} % of the machine."
    path = write_results("bench_experiments", figures, notes=notes)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
