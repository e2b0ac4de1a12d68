"""Benchmark of ``dask_research.experiments``: the peers' bandit problem (20 Beta(2, 5) arms, horizon 300; docs/experiments.rst).

20 Beta(2, 5) arms, horizon 300, common random numbers, seeds 0-9: pseudo-regret and decision
time of our UCB1 (c = sqrt 2, the default), round-robin, greedy and Optuna TPE ask/tell, plus
UCB1 with 3 pending pulls per decision batch (how the scheduler decides with 3 slots), and a
horizon-3000 extension without Optuna (too slow there: its cost grows with history).

Needs ``optuna`` for the Optuna column (the ``bench`` extra); without it the column is left
out with one line saying so. Run one benchmark at a time::

    flock /tmp/dask-research-bench.lock python benchmarks/bench_experiments_bandit.py [--quick]

Figures ``bandit_300``, ``ratios`` (with Optuna) and ``bandit_3000`` in
``benchmarks/results/bench_experiments.json``.
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.harness import print_table, require, run_section  # noqa: E402
from dask_research.experiments.policies import (  # noqa: E402
    greedy_scores,
    round_robin_scores,
    select,
    ucb1_scores,
)

_ALL = np.ones(20, bool)


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


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """This section has no options of its own (``--quick``: one rep)."""


def measure(args: argparse.Namespace) -> dict:
    """Section 3 of ``bench_experiments``: ``bandit_300``, ``ratios``, ``bandit_3000``."""
    reps = 1 if args.quick else 3
    figures: dict = {}
    with_optuna = require("optuna", benchmark="bench_experiments_bandit", skipping="the Optuna column")
    print("\n3. the peers' bandit: 20 Beta(2,5) arms, horizon 300, seeds 0-9")
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
    return figures


def main(argv: list[str] | None = None) -> None:
    run_section("bench_experiments", __doc__.splitlines()[0], add_arguments, measure, argv=argv)


if __name__ == "__main__":
    main()
