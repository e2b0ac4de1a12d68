"""Faults mid-study, side by side (issue 30): a worker killed, and the driver killed then resumed.

Run one benchmark at a time::

    flock /tmp/dask-research-bench.lock python benchmarks/bench_experiments_faults.py

Every case runs on its own real cluster (a ``dask scheduler`` and two one-thread ``dask worker``
processes, no nanny: a killed worker stays dead). A study has a budget of ``TRIALS`` trials of
``DELAY`` seconds each; every execution of a trial's objective appends ``start <id>`` and, if it
returns, ``end <id>`` to a log (one ``write`` each, ``O_APPEND``), so what ran is counted by
the objective itself, not by the system under test.

- **worker killed**: SIGKILL one worker once a quarter of the budget has ended; the study goes
  on on the other. Ours: ``IterationScheduler(runner, slots=2, client=client,
  max_experiments=TRIALS)``. Peer: Optuna with ``optuna_integration.DaskStorage`` and trials
  as ``client.submit(study.optimize, objective, n_trials=1)`` (the pattern of Optuna's docs).
- **driver killed, then resumed**: the driver is a process of its own, SIGKILLed once a third
  of the budget has ended, then started again to finish the budget. Ours: a checkpoint
  journal, ``IterationScheduler.resume(path, runner, client=...)``. Peer: Optuna's RDB storage
  on SQLite (``create_study(storage="sqlite:///...", load_if_exists=True)``), the storage Optuna
  documents for resuming, driven by ``optuna_distributed`` (trials as Dask futures), the
  second driver asking for the trials the study still lacks.

Ours runs with its defaults (``queue_ahead="auto"``: with trials of 0.4 s on this cluster it
queues one decided experiment behind each running one, so at a fault a worker holds one running
and one queued experiment); ``--queue-ahead 0`` runs ours without it. ``ahead`` counts ours'
dispatches that were queued ahead. ``ours (actors)`` is ours with ``transport="actors"`` (one
actor per slot, called directly: its client is made with ``direct_to_workers=True``, as a user of
that transport makes it); after the worker's death its two slots share the one actor left.

Figures per system and fault: trials the system counts as done (``COMPLETE`` for Optuna,
results for ours) and how many of them lie beyond the budget; *stale or lost* records (trials
the system recorded as started that never finish: Optuna leaves them ``RUNNING`` for ever, ours
would show a dispatch without an outcome); objective runs, and runs not counted (work done
again, or done for a trial the system lost). A thread cannot be
killed, so an experiment in flight when its driver dies runs to its end on the worker in every
system; what differs is whether its trial is lost, run again, or both.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.harness import load_averages, print_table, require, update_results, write_results  # noqa: E402

TRIALS = 24
DELAY = 0.4
QUEUE_AHEAD: Any = None                 # ours: None is research.experiments.queue-ahead


def _log(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


class Runner:
    """Ours: sleeps ``DELAY``, logs start and end under the hypothesis id."""

    def __init__(self, log: str):
        self.log = log

    def __call__(self, h: Any) -> float:
        _log(self.log, f"start {h.id}")
        time.sleep(DELAY)
        _log(self.log, f"end {h.id}")
        return 1.0 - (h.payload["x"] - 0.3) ** 2


class Objective:
    """Optuna's: the same, under ``t<trial number>``."""

    def __init__(self, log: str):
        self.log = log

    def __call__(self, trial: Any) -> float:
        x = trial.suggest_float("x", 0.0, 1.0)
        tid = f"t{trial.number}"
        _log(self.log, f"start {tid}")
        time.sleep(DELAY)
        _log(self.log, f"end {tid}")
        return 1.0 - (x - 0.3) ** 2


def hypotheses() -> list:
    from dask_research.experiments import Hypothesis

    return [Hypothesis(f"h{j}", f"b{j % 4}", {"x": (j % 10) / 10}) for j in range(TRIALS)]


def ended(log: str) -> int:
    try:
        return pathlib.Path(log).read_text().count("end ")
    except OSError:
        return 0


def executions(log: str) -> tuple[collections.Counter, collections.Counter]:
    starts: collections.Counter = collections.Counter()
    ends: collections.Counter = collections.Counter()
    for line in pathlib.Path(log).read_text().splitlines():
        kind, tid = line.split(" ", 1)
        (starts if kind == "start" else ends)[tid] += 1
    return starts, ends


def _figures(counted: int, lost: int, starts: collections.Counter, ahead: int | None = None) -> dict:
    runs = sum(starts.values())
    out = {"counted": counted, "budget_met": counted >= TRIALS, "over_budget": max(0, counted - TRIALS),
           "lost": lost, "wasted_runs": runs - counted, "executions": runs,
           "run_twice": sorted(t for t, k in starts.items() if k > 1)}
    if ahead is not None:
        out["ahead_dispatches"] = ahead
    return out


# -- a worker killed --------------------------------------------------------------------------
def worker_kill(system: str, where: pathlib.Path) -> dict:
    import threading

    from dask_research.testing.processes import process_cluster

    log = str(where / "trials.log")
    with process_cluster(where, 2) as cluster:
        client = cluster.client

        def killer() -> None:
            while ended(log) < TRIALS // 4:
                time.sleep(0.02)
            cluster.workers[1].send_signal(signal.SIGKILL)

        t = threading.Thread(target=killer, daemon=True)
        t.start()
        if system in ("ours", "ours-actors"):
            from distributed import Client

            from dask_research.experiments import IterationScheduler

            actors = system == "ours-actors"
            if actors:
                client = Client(cluster.client.scheduler.address, direct_to_workers=True,
                                set_as_default=False, timeout=60)
            sched = IterationScheduler(Runner(log), slots=2, client=client, max_experiments=TRIALS,
                                       progress=False, prune_floor=0.0, queue_ahead=QUEUE_AHEAD,
                                       transport="actors" if actors else None)
            sched.add(hypotheses())
            report = sched.run()
            if actors:
                client.close()
            counted, lost = report.total_runs, report.dispatched - report.total_runs - report.failures
            ahead: int | None = sum(1 for e in report.events.of("dispatch") if e.data.get("ahead"))
        else:
            import optuna
            from optuna_integration import DaskStorage

            study = optuna.create_study(storage=DaskStorage(client=client), direction="maximize",
                                        study_name="s", sampler=optuna.samplers.RandomSampler(seed=0))
            futures = [client.submit(study.optimize, Objective(log), n_trials=1, pure=False)
                       for _ in range(TRIALS)]
            client.gather(futures, errors="skip")
            states = collections.Counter(tr.state.name for tr in study.get_trials(deepcopy=False))
            counted, lost = states["COMPLETE"], states["RUNNING"] + states["FAIL"]
            ahead = None
        t.join(60)
        starts, _ = executions(log)
    return _figures(counted, lost, starts, ahead)


# -- the driver killed, then resumed ----------------------------------------------------------
DRIVER = """
import sys, warnings
sys.path.insert(0, {root!r})
warnings.simplefilter("ignore")
from distributed import Client
import benchmarks.bench_experiments_faults as bench
bench.QUEUE_AHEAD = {queue_ahead!r}
with Client(scheduler_file={sfile!r}, set_as_default=False, timeout=60,
            direct_to_workers={system!r} == "ours-actors") as client:
    bench.drive({system!r}, client, {log!r}, {state!r}, resume={resume!r})
"""


def drive(system: str, client: Any, log: str, state: str, resume: bool) -> None:
    """One driver process's study (called by :data:`DRIVER`)."""
    if system in ("ours", "ours-actors"):
        from dask_research.experiments import IterationScheduler

        if resume:                      # (the journal keeps the transport)
            sched = IterationScheduler.resume(state, Runner(log), client=client, progress=False)
        else:
            sched = IterationScheduler(Runner(log), slots=2, client=client, max_experiments=TRIALS,
                                       progress=False, prune_floor=0.0, checkpoint=state,
                                       queue_ahead=QUEUE_AHEAD,
                                       transport="actors" if system == "ours-actors" else None)
            sched.add(hypotheses())
        sched.run()
        return
    import optuna
    import optuna_distributed

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=f"sqlite:///{state}", study_name="s", load_if_exists=True,
                                direction="maximize", sampler=optuna.samplers.RandomSampler(seed=1 if resume else 0))
    done = sum(tr.state.name == "COMPLETE" for tr in study.get_trials(deepcopy=False))
    if TRIALS - done > 0:
        with client.as_current():
            optuna_distributed.from_study(study, client=client).optimize(Objective(log), n_trials=TRIALS - done,
                                                                          n_jobs=2)


def driver_kill(system: str, where: pathlib.Path) -> dict:
    from dask_research.testing.processes import process_cluster, subprocess_env

    log = str(where / "trials.log")
    ours = system in ("ours", "ours-actors")
    state = str(where / ("loop.jsonl" if ours else "study.db"))
    with process_cluster(where, 2):
        sfile = str(where / "scheduler.json")
        for resume in (False, True):
            script = where / f"driver_{int(resume)}.py"
            script.write_text(textwrap.dedent(DRIVER.format(root=str(ROOT), sfile=sfile, system=system, log=log,
                                                            state=state, resume=resume,
                                                            queue_ahead=QUEUE_AHEAD)))
            proc = subprocess.Popen([sys.executable, str(script)], env=subprocess_env(), cwd=where,
                                    stdout=subprocess.DEVNULL, stderr=open(where / f"driver_{int(resume)}.log", "wb"))
            if not resume:
                deadline = time.monotonic() + 300
                while ended(log) < TRIALS // 3 and proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.02)
                proc.send_signal(signal.SIGKILL)
            proc.wait(300)
        time.sleep(2 * DELAY)           # experiments the killed driver left running end on their workers
        starts, _ = executions(log)
    if ours:
        from dask_research.experiments.checkpoint import Journal

        records = Journal(state).load().records
        outcomes = {r["e"]["hypothesis"] for r in records if r["kind"] == "event"
                    and r["e"]["kind"] in ("result", "failure")}
        dispatched = {r["e"]["hypothesis"] for r in records if r["kind"] == "event" and r["e"]["kind"] == "dispatch"}
        counted, lost = len(outcomes), len(dispatched - outcomes)
        ahead: int | None = sum(1 for r in records if r["kind"] == "event" and r["e"]["kind"] == "dispatch"
                                and r["e"].get("ahead"))
    else:
        import optuna

        study = optuna.load_study(storage=f"sqlite:///{state}", study_name="s")
        states = collections.Counter(tr.state.name for tr in study.get_trials(deepcopy=False))
        counted, lost = states["COMPLETE"], states["RUNNING"] + states["FAIL"]
        ahead = None
    return _figures(counted, lost, starts, ahead)


def main(argv: list[str] | None = None) -> dict:
    require("optuna", "optuna_integration", "optuna_distributed", benchmark="bench_experiments_faults")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--queue-ahead", default=None,
                    help='ours: "auto", 0, 1, ... (default: research.experiments.queue-ahead)')
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--systems", default="ours,ours-actors,optuna",
                    help="which of ours, ours-actors, optuna to run")
    args = ap.parse_args(argv)
    systems = args.systems.split(",")
    global QUEUE_AHEAD
    QUEUE_AHEAD = (None if args.queue_ahead is None else
                   args.queue_ahead if args.queue_ahead == "auto" else int(args.queue_ahead))
    warnings.simplefilter("ignore")
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    uptime_before = load_averages()
    cases = {(fault, name): (fn, system) for fault, name, fn, system in (
        ("worker killed", "ours", worker_kill, "ours"),
        ("worker killed", "ours (actors)", worker_kill, "ours-actors"),
        ("worker killed", "optuna-daskstorage", worker_kill, "optuna"),
        ("driver killed, resumed", "ours", driver_kill, "ours"),
        ("driver killed, resumed", "ours (actors)", driver_kill, "ours-actors"),
        ("driver killed, resumed", "optuna-rdb-sqlite", driver_kill, "optuna")) if system in systems}
    figures: dict = {"trials": TRIALS, "trial_seconds": DELAY, "cases": {},
                     "queue_ahead": "default" if QUEUE_AHEAD is None else QUEUE_AHEAD}
    rows = []
    for (fault, system), (fn, which) in cases.items():
        with tempfile.TemporaryDirectory() as where:
            f = fn(which, pathlib.Path(where))
        figures["cases"][f"{fault}|{system}"] = f
        rows.append((fault, system, f"{f['counted']}/{TRIALS}", f["over_budget"], f["lost"], f["executions"],
                     f["wasted_runs"], ",".join(f["run_twice"]) or "-", f.get("ahead_dispatches", "-")))
        print(*rows[-1], sep="  ", flush=True)
    print_table(rows, ("fault", "system", "trials done", "beyond budget", "stale or lost records", "objective runs",
                       "runs not counted", "run twice", "ahead"))
    figures["uptime"] = {"before": uptime_before, "after": load_averages()}
    if not args.no_write and len(systems) < 3:      # some systems again: merge their cases
        try:
            old = json.loads((ROOT / "benchmarks" / "results" / "bench_experiments_faults.json").read_text())
            figures["cases"] = {**old["figures"]["cases"], **figures["cases"]}
        except (OSError, ValueError, KeyError):
            pass
        figures[f"uptime_{'_'.join(systems)}"] = figures.pop("uptime")
        path = update_results("bench_experiments_faults", {"cases": figures["cases"],
                                                           f"uptime_{'_'.join(systems)}": figures[f"uptime_{'_'.join(systems)}"]})
        print(f"\nmerged into {path}")
    elif not args.no_write:
        path = write_results("bench_experiments_faults", figures, notes=(
            "Real dask scheduler + 2 one-thread dask workers (no nanny) per case; trials sleep; "
            "counts from the objective's own log and each system's records"))
        print(f"\nwrote {path}")
    return figures


if __name__ == "__main__":
    main()
