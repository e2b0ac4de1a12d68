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
- ``ours-ucb1``: ``IterationScheduler(runner, slots=N, client=client)`` over 4 queued branches,
  with the defaults: ``transport="actors"`` (one long-lived actor per slot, its experiments on
  the thread of a holder task), called directly (the scheduler and the workers listen on this
  machine's loopback, as an embedded cluster's do).
- ``ours-search``: the documented search configuration (``objective="max"``, windowed Threshold
  Ascent, ``OptunaSource(unique=False)`` per branch: a continuous space), with the defaults.
- ``ours-ucb1-proxied``: ``ours-ucb1`` on a client made with ``direct_to_workers=False``: every
  call to an actor goes through the scheduler's ``proxy`` handler, as from a driver that cannot
  reach the workers.
- ``ours-ucb1-tasks``: ``ours-ucb1`` with ``transport="tasks"``: one Dask task per experiment.
- ``dask-bare`` (a reference, not a peer): the same sleeping function as a plain
  ``client.submit`` per trial, ``N`` kept in flight with ``as_completed``, each result
  gathered: what one Dask task per trial costs with no search at all, the floor of any
  system that runs a trial as a task.

Ours runs with its defaults, ``queue_ahead="auto"`` included (:mod:`dask_research.experiments.
ahead`); ``--queue-ahead 0`` (or ``1``) measures it with that setting instead, and such a run's
cells are merged into the JSON under ``cells_queue_ahead_<value>`` beside the default run's;
``--no-events`` measures ours without its events to the scheduler's log (``cells_no_events``). Every method runs once, unmeasured, on each
fresh cluster before the cells (its imports on the workers, Optuna's storage plugin), so no
method pays the cluster's first use in its figures.

Figures: occupancy = trials x trial time / (N x wall) (time inside the objective only, so
every system's own overhead, transport included, counts against it); client CPU per trial
(this process's CPU time, all threads); scheduler CPU per trial (the scheduler process's CPU
time, ``time.process_time`` on the scheduler: nanoseconds, where ``psutil``'s clock ticks of
10 ms were coarser than a 500 ms cell's whole figure), gross and net of the idle floor (the
scheduler's own CPU per second on the same cluster with nothing submitted, its heartbeats and
periodic callbacks, measured before the cells, times the cell's wall, per trial: the same for
every system); decisions per second = trials / wall (at 5 ms the slots are saturated, so
this is the rate at which each system decides and dispatches). The JSON
(``benchmarks/results/bench_experiments_dask_peers.json``) has the machine's load beside them:
wall-clock figures on a shared machine are lower bounds; the CPU figures are the comparable
ones.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.harness import LoadMonitor, load_averages, print_table, require, update_results, write_results  # noqa: E402

TRIALS = {0.005: 120, 0.05: 60, 0.5: 10}          # per trial time; 0.5 s: 10 per slot
IDLE_SECONDS = 5.0                                 # the idle floor is measured over this long


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


def bare(client: Any, n: int, delay: float, trials: int) -> None:
    from distributed import as_completed

    from dask_research.experiments import Hypothesis

    fn = _sleep_runner(delay)

    def task(k: int) -> Any:
        return client.submit(fn, Hypothesis(f"h{k}", "b", {"x": k / trials}), pure=False)

    futures = as_completed([task(k) for k in range(min(n, trials))], with_results=True,
                           loop=client.loop)
    done, submitted = 0, min(n, trials)
    for _ in futures:
        done += 1
        if submitted < trials:
            futures.add(task(submitted))
            submitted += 1
    assert done == trials


QUEUE_AHEAD: Any = None                            # ours: None is research.experiments.queue-ahead
PROXIED: Any = None                                # a client made with direct_to_workers=False
LOG_EVENTS: Any = None                             # ours: None is research.experiments.log-events


def ours(client: Any, n: int, delay: float, trials: int, search: bool, transport: str | None = None,
         proxied: bool = False) -> None:
    import optuna

    from dask_research.experiments import Branch, Hypothesis, IterationScheduler, OptunaSource
    from dask_research.experiments.policies.maxbandit import ThresholdAscentPolicy

    if search:
        space = {"x": optuna.distributions.FloatDistribution(0.0, 1.0)}
        sched = IterationScheduler(_sleep_runner(delay), slots=n, client=client,
                                   objective="max", max_experiments=trials, progress=False,
                                   policy=ThresholdAscentPolicy(top=3, delta=10.0, window=6),
                                   queue_ahead=QUEUE_AHEAD)
        sched.add([Branch(f"b{k}", propose=OptunaSource(space, seed=k)) for k in range(4)])
    else:
        sched = IterationScheduler(_sleep_runner(delay), slots=n, client=PROXIED if proxied else client,
                                   max_experiments=trials, progress=False, prune_floor=0.0,
                                   queue_ahead=QUEUE_AHEAD, transport=transport, log_events=LOG_EVENTS)
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
    "ours-ucb1-proxied": lambda c, n, d, t: ours(c, n, d, t, False, proxied=True),
    "ours-ucb1-tasks": lambda c, n, d, t: ours(c, n, d, t, False, transport="tasks"),
    "dask-bare": bare,
}


def scheduler_cpu(client: Any) -> float:
    """The scheduler process's CPU seconds so far (``time.process_time`` there: one call)."""
    return float(client.run_on_scheduler(time.process_time))


def idle_floor(client: Any, seconds: float = IDLE_SECONDS) -> float:
    """The scheduler's CPU seconds per second with nothing submitted (heartbeats, periodic
    callbacks, the client's own identity refresh)."""
    time.sleep(1.0)                                 # what the last call started settles
    c0, t0 = scheduler_cpu(client), time.perf_counter()
    time.sleep(seconds)
    return (scheduler_cpu(client) - c0) / (time.perf_counter() - t0)


def measure(client: Any, method: str, n: int, delay: float, trials: int,
            idle: float = 0.0) -> dict[str, float]:
    c0, s0, t0 = time.process_time(), scheduler_cpu(client), time.perf_counter()
    METHODS[method](client, n, delay, trials)
    wall = time.perf_counter() - t0
    client_cpu = time.process_time() - c0
    sched_cpu = scheduler_cpu(client) - s0
    return {"trials": trials, "wall_s": wall, "occupancy": trials * delay / (n * wall),
            "client_cpu_ms_per_trial": 1e3 * client_cpu / trials,
            "scheduler_cpu_ms_per_trial": 1e3 * sched_cpu / trials,
            "scheduler_cpu_net_ms_per_trial": 1e3 * (sched_cpu - idle * wall) / trials,
            "decisions_per_s": trials / wall}


def _ratios(cells: dict[str, dict]) -> dict[str, tuple[float, float | None]]:
    """Each peer's scheduler CPU per trial over each of ours', gross and net of the idle floor,
    per cell: ``{"<peer>/<ours>|<slots>|<delay>": (gross, net)}``."""
    out = {}
    for key, f in cells.items():
        method, n, delay = key.split("|")
        if not method.startswith("ours"):
            continue
        for peer in ("optuna-daskstorage-tpe", "optuna-daskstorage-random", "dask-bare"):
            g = cells.get(f"{peer}|{n}|{delay}")
            if g is None:
                continue
            ours_net = f["scheduler_cpu_net_ms_per_trial"]
            gross = g["scheduler_cpu_ms_per_trial"] / max(f["scheduler_cpu_ms_per_trial"], 1e-9)
            # ours' net figure within the idle floor's noise (0 or below): no ratio to speak of
            net = g["scheduler_cpu_net_ms_per_trial"] / ours_net if ours_net > 0 else None
            out[f"{peer}/{method}|{n}|{delay}"] = (gross, net)
    return out


def _other_runs() -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``--queue-ahead`` runs already in the results file (``cells_queue_ahead_*``,
    ``run_queue_ahead_*``) and their ``updated`` stamps: a new default run replaces its own
    figures, not theirs."""
    from benchmarks.harness import RESULTS

    try:
        old = json.loads((RESULTS / "bench_experiments_dask_peers.json").read_text())
        figures = old["figures"]
    except (OSError, ValueError, KeyError):
        return {}, {}
    kept = {k: v for k, v in figures.items()
            if k.startswith(("cells_queue_ahead_", "run_queue_ahead_", "cells_no_events", "run_no_events"))}
    return kept, {k: v for k, v in old.get("updated", {}).items() if k in kept}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    require("optuna", "optuna_integration", "optuna_distributed",
            benchmark="bench_experiments_dask_peers")
    import optuna
    from distributed import Client

    from dask_research.testing.processes import dask_processes

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--slots", default="2,4,8")
    ap.add_argument("--delays", default="0.005,0.05,0.5")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--queue-ahead", default=None,
                    help='ours: "auto", 0, 1, ... (default: research.experiments.queue-ahead)')
    ap.add_argument("--no-events", action="store_true",
                    help="ours without events to the scheduler's log (log_events=False); cells merged "
                         "into the JSON as cells_no_events")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    global QUEUE_AHEAD, LOG_EVENTS
    LOG_EVENTS = False if args.no_events else None
    QUEUE_AHEAD = (None if args.queue_ahead is None else
                   args.queue_ahead if args.queue_ahead == "auto" else int(args.queue_ahead))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.simplefilter("ignore")
    methods = args.methods.split(",")
    figures: dict[str, Any] = {"cells": {}, "idle_scheduler_cpu_ms_per_s": {},
                               "queue_ahead": "default" if QUEUE_AHEAD is None else QUEUE_AHEAD,
                               "uptime": {"before": load_averages()}}
    rows = []
    with LoadMonitor() as load:
        for n in (int(x) for x in args.slots.split(",")):
            with tempfile.TemporaryDirectory() as where, \
                    dask_processes(pathlib.Path(where), n_workers=n) as (client, _), \
                    Client(client.scheduler.address, direct_to_workers=False, set_as_default=False,
                           timeout=60) as proxied:
                global PROXIED
                PROXIED = proxied
                for m in methods:                  # warm-up: each method's first use of the cluster
                    METHODS[m](client, n, 0.005, 2 * n)
                idle = idle_floor(client)
                figures["idle_scheduler_cpu_ms_per_s"][str(n)] = 1e3 * idle
                print(f"{n} workers: idle scheduler CPU {1e3 * idle:.2f} ms/s", flush=True)
                for delay in (float(x) for x in args.delays.split(",")):
                    trials = TRIALS[delay] * (n if delay >= 0.5 else 1)
                    for m in methods:
                        f = measure(client, m, n, delay, trials, idle)
                        figures["cells"][f"{m}|{n}|{delay}"] = f
                        rows.append((m, n, f"{1e3 * delay:g} ms", trials,
                                     f"{100 * f['occupancy']:.1f} %",
                                     f"{f['client_cpu_ms_per_trial']:.2f}",
                                     f"{f['scheduler_cpu_ms_per_trial']:.2f}",
                                     f"{f['scheduler_cpu_net_ms_per_trial']:.2f}",
                                     f"{f['decisions_per_s']:.1f}"))
                        print(*rows[-1], sep="  ", flush=True)
    figures["machine_busy"] = load.machine_busy
    figures["uptime"]["after"] = load_averages()
    print_table(rows, ("method", "slots", "trial", "trials", "occupancy", "client CPU ms/trial",
                       "scheduler CPU ms/trial", "net of idle", "trials/s"))
    ratios = _ratios(figures["cells"])
    if ratios:
        figures["scheduler_cpu_ratios"] = ratios
        print("\nscheduler CPU per trial of each peer / ours (gross, net of the idle floor):")
        print_table([(k.replace("|", " "), f"{g:.1f}x", "-" if nt is None else f"{nt:.1f}x")
                     for k, (g, nt) in ratios.items()],
                    ("peer / ours, slots, trial", "gross", "net"))
    print(f"load: before {figures['uptime']['before']}; after {figures['uptime']['after']}")
    notes = ("Real dask scheduler + N one-thread dask worker processes on this machine; "
             "sleeping trials. The machine was shared with other sessions (machine_busy): "
             "wall-clock figures (occupancy, trials/s) are lower bounds, CPU figures compare.")
    if not args.no_write and args.no_events:
        path = update_results("bench_experiments_dask_peers", {
            "cells_no_events": figures["cells"],
            "run_no_events": {k: v for k, v in figures.items() if k != "cells"}})
        print(f"\nmerged into {path}")
    elif not args.no_write and QUEUE_AHEAD is not None:
        path = update_results("bench_experiments_dask_peers", {
            f"cells_queue_ahead_{QUEUE_AHEAD}": figures["cells"],
            f"run_queue_ahead_{QUEUE_AHEAD}": {k: v for k, v in figures.items() if k != "cells"}})
        print(f"\nmerged into {path}")
    elif not args.no_write:
        kept, stamps = _other_runs()
        path = write_results("bench_experiments_dask_peers", {**figures, **kept}, notes=notes)
        if stamps:                                 # when and where those were measured
            payload = json.loads(path.read_text())
            payload["updated"] = stamps
            path.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"\nwrote {path}")
    return figures


if __name__ == "__main__":
    main()
