"""Ours against what a Dask user would pick instead, on one real cluster (issue 30).

Run one benchmark at a time::

    flock /tmp/dask-research-bench.lock python benchmarks/bench_experiments_dask_peers.py

A real ``dask scheduler`` and ``N`` one-thread ``dask worker`` processes
(:func:`dask_research.testing.processes.dask_processes`), ``N`` = 2, 4 and 8 slots; every
method runs on the same cluster, one after the other. The trials sleep 5 ms, 50 ms or 500 ms
(overhead figures; a sleeping trial needs no core). Methods:

- ``optuna-daskstorage-tpe`` / ``-random``: ``optuna.create_study(storage=
  optuna_integration.DaskStorage(client=client), sampler=...)``, trials as client futures
  ``client.submit(study.optimize, objective, n_trials=1)`` (the pattern of Optuna's docs):
  every storage call is a round trip to the scheduler.
- ``optuna-distributed-tpe``: ``optuna_distributed.from_study(study, client=client)
  .optimize(objective, n_trials=T, n_jobs=N)`` (TPE in the driver, trials as futures).
- ``ours-ucb1``: ``IterationScheduler(runner, slots=N, client=client)`` over 4 queued branches.
- ``ours-search``: the documented search configuration (``objective="max"``, windowed Threshold
  Ascent, ``OptunaSource(unique=False)`` per branch: a continuous space).

Figures: occupancy = trials x trial time / (N x wall) (time inside the objective only, so
every system's own overhead, transport included, counts against it); client CPU per trial
(this process's CPU time, all threads); scheduler CPU per trial (the scheduler process's CPU
time, ``psutil``); decisions per second = trials / wall (at 5 ms the slots are saturated, so
this is the rate at which each system decides and dispatches). The JSON
(``benchmarks/results/bench_experiments_dask_peers.json``) has the machine's load beside them:
wall-clock figures on a shared machine are lower bounds; the CPU figures are the comparable
ones.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.harness import LoadMonitor, print_table, require, write_results  # noqa: E402

TRIALS = {0.005: 120, 0.05: 60, 0.5: 3}           # per trial time; 0.5 s: 3 per slot


def _objective(delay: float) -> Callable[[Any], float]:
    def objective(trial: Any) -> float:
        x = trial.suggest_float("x", 0.0, 1.0)
        time.sleep(delay)
        return 1.0 - (x - 0.3) ** 2
    return objective


def _sleep_runner(delay: float) -> Callable[[Any], float]:
    def runner(h: Any) -> float:
        time.sleep(delay)
        x = h.payload["x"] if isinstance(h.payload, dict) else float(h.payload)
        return 1.0 - (x - 0.3) ** 2
    return runner


def _sampler(name: str, seed: int) -> Any:
    import optuna

    return (optuna.samplers.RandomSampler(seed=seed) if name == "random"
            else optuna.samplers.TPESampler(seed=seed))


def daskstorage(client: Any, n: int, delay: float, trials: int, sampler: str) -> None:
    import optuna
    from optuna_integration import DaskStorage

    study = optuna.create_study(storage=DaskStorage(client=client), direction="maximize",
                                sampler=_sampler(sampler, 0))
    futures = [client.submit(study.optimize, _objective(delay), n_trials=1, pure=False)
               for _ in range(trials)]
    client.gather(futures)
    assert len(study.trials) == trials


def distributed_tpe(client: Any, n: int, delay: float, trials: int) -> None:
    import optuna
    import optuna_distributed

    study = optuna_distributed.from_study(optuna.create_study(
        direction="maximize", sampler=_sampler("tpe", 0)), client=client)
    with client.as_current():           # its Variables need a current client
        study.optimize(_objective(delay), n_trials=trials, n_jobs=n)
    assert len(study.trials) == trials


def ours(client: Any, n: int, delay: float, trials: int, search: bool) -> None:
    import optuna

    from dask_research.experiments import Branch, Hypothesis, IterationScheduler, OptunaSource
    from dask_research.experiments.policies.maxbandit import ThresholdAscentPolicy

    if search:
        space = {"x": optuna.distributions.FloatDistribution(0.0, 1.0)}
        sched = IterationScheduler(_sleep_runner(delay), slots=n, client=client,
                                   objective="max", max_experiments=trials, progress=False,
                                   policy=ThresholdAscentPolicy(top=3, delta=10.0, window=6))
        sched.add([Branch(f"b{k}", propose=OptunaSource(space, seed=k)) for k in range(4)])
    else:
        sched = IterationScheduler(_sleep_runner(delay), slots=n, client=client,
                                   max_experiments=trials, progress=False, prune_floor=0.0)
        sched.add([Hypothesis(f"h{j}", f"b{j % 4}", {"x": (j % 10) / 10})
                   for j in range(trials)])
    report = sched.run()
    assert report.total_runs == trials, report


METHODS: dict[str, Callable[[Any, int, float, int], None]] = {
    "optuna-daskstorage-tpe": lambda c, n, d, t: daskstorage(c, n, d, t, "tpe"),
    "optuna-daskstorage-random": lambda c, n, d, t: daskstorage(c, n, d, t, "random"),
    "optuna-distributed-tpe": distributed_tpe,
    "ours-ucb1": lambda c, n, d, t: ours(c, n, d, t, False),
    "ours-search": lambda c, n, d, t: ours(c, n, d, t, True),
}


def measure(client: Any, sched_proc: Any, method: str, n: int, delay: float,
            trials: int) -> dict[str, float]:
    c0, s0, t0 = time.process_time(), sum(sched_proc.cpu_times()[:2]), time.perf_counter()
    METHODS[method](client, n, delay, trials)
    wall = time.perf_counter() - t0
    client_cpu = time.process_time() - c0
    sched_cpu = sum(sched_proc.cpu_times()[:2]) - s0
    return {"trials": trials, "wall_s": wall, "occupancy": trials * delay / (n * wall),
            "client_cpu_ms_per_trial": 1e3 * client_cpu / trials,
            "scheduler_cpu_ms_per_trial": 1e3 * sched_cpu / trials,
            "decisions_per_s": trials / wall}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    require("optuna", "optuna_integration", "optuna_distributed", "psutil",
            benchmark="bench_experiments_dask_peers")
    import optuna
    import psutil

    from dask_research.testing.processes import dask_processes

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--slots", default="2,4,8")
    ap.add_argument("--delays", default="0.005,0.05,0.5")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.simplefilter("ignore")
    methods = args.methods.split(",")
    figures: dict[str, Any] = {"cells": {}}
    rows = []
    with LoadMonitor() as load:
        for n in (int(x) for x in args.slots.split(",")):
            with tempfile.TemporaryDirectory() as where, \
                    dask_processes(pathlib.Path(where), n_workers=n) as (client, _):
                sched_proc = psutil.Process(client.run_on_scheduler(os.getpid))
                for delay in (float(x) for x in args.delays.split(",")):
                    trials = TRIALS[delay] * (n if delay >= 0.5 else 1)
                    for m in methods:
                        f = measure(client, sched_proc, m, n, delay, trials)
                        figures["cells"][f"{m}|{n}|{delay}"] = f
                        rows.append((m, n, f"{1e3 * delay:g} ms", trials,
                                     f"{100 * f['occupancy']:.1f} %",
                                     f"{f['client_cpu_ms_per_trial']:.2f}",
                                     f"{f['scheduler_cpu_ms_per_trial']:.2f}",
                                     f"{f['decisions_per_s']:.1f}"))
                        print(*rows[-1], sep="  ", flush=True)
    figures["machine_busy"] = load.machine_busy
    print_table(rows, ("method", "slots", "trial", "trials", "occupancy", "client CPU ms/trial",
                       "scheduler CPU ms/trial", "trials/s"))
    if not args.no_write:
        path = write_results("bench_experiments_dask_peers", figures, notes=(
            "Real dask scheduler + N one-thread dask worker processes on this machine; "
            "sleeping trials. The machine was shared with other sessions (machine_busy): "
            "wall-clock figures (occupancy, trials/s) are lower bounds, CPU figures compare."))
        print(f"\nwrote {path}")
    return figures


if __name__ == "__main__":
    main()
