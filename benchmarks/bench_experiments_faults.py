"""Faults mid-study, side by side (issue 30): a worker killed, and the driver killed then resumed.

Run one benchmark at a time::

    flock /tmp/dask-research-bench.lock python benchmarks/bench_experiments_faults.py

Every case runs on its own real cluster (a ``dask scheduler`` and two one-thread ``dask worker``
processes, no nanny: a killed worker stays dead). A study has a budget of ``TRIALS`` trials of
``DELAY`` seconds each; every execution of a trial's objective appends ``start <id>`` and, if it
returns, ``end <id>`` to a log (one ``write`` each, ``O_APPEND``), so what ran is counted by
the objective itself, not by the system under test.

- **worker killed**: SIGKILL one worker once a given share of the budget has ended (the kill
  point); the study goes on on the other. Ours: ``IterationScheduler(runner, slots=2, client=client,
  max_experiments=TRIALS)``. Peer: Optuna with ``optuna_integration.DaskStorage`` and trials
  as ``client.submit(study.optimize, objective, n_trials=1)`` (the pattern of Optuna's docs).
- **driver killed, then resumed**: the driver is a process of its own, SIGKILLed at the kill
  point, then started again to finish the budget. Ours: a checkpoint
  journal, ``IterationScheduler.resume(path, runner, client=...)``. Peer: Optuna's RDB storage
  on SQLite (``create_study(storage="sqlite:///...", load_if_exists=True)``), the storage Optuna
  documents for resuming, driven by ``optuna_distributed`` (trials as Dask futures), the
  second driver asking for the trials the study still lacks.

Ours runs with its defaults (``queue_ahead="auto"``: with trials of 0.4 s on this cluster it
queues one decided experiment behind each running one, so at a fault a worker holds one running
and one queued experiment); ``--queue-ahead 0`` runs ours without it. ``ahead`` counts ours'
dispatches that were queued ahead. Its default transport is ``"actors"`` (one actor per slot,
its experiments on a holder task's thread, called directly: the cluster listens on this
machine's loopback); after the worker's death its two slots share the one actor left.
``ours (tasks)`` is ours with ``transport="tasks"`` (one Dask task per experiment).

Each fault is repeated at several kill points (``--kill-at``: shares of the budget ended,
default a quarter, a half and three quarters) and in two phases (``--phases``): ``end``, the
moment a trial's end is logged (experiments that started together end together, and a queued
one starts then), and ``mid``, half a trial later (every slot in the middle of a trial);
``--repeats`` runs of each, every system in turn before the next run, so that the machine's
drift falls on all alike.

Figures per system and fault, per run and summed up over the runs: trials the system counts as done (``COMPLETE`` for Optuna,
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

from benchmarks.harness import load_averages, print_table, require, write_results  # noqa: E402

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
def _wait_kill_point(log: str, kill_after: int, phase: str, alive: Any = lambda: True,
                     deadline: float = 300.0) -> None:
    """Return at the kill point: ``kill_after`` trials ended (``end``), or half a trial after (``mid``)."""
    stop = time.monotonic() + deadline
    while ended(log) < kill_after and alive() and time.monotonic() < stop:
        time.sleep(0.01)
    if phase == "mid":
        time.sleep(DELAY / 2)


def worker_kill(system: str, where: pathlib.Path, kill_after: int = TRIALS // 4, phase: str = "end") -> dict:
    import threading

    from dask_research.testing.processes import process_cluster

    log = str(where / "trials.log")
    with process_cluster(where, 2) as cluster:
        client = cluster.client

        def killer() -> None:
            _wait_kill_point(log, kill_after, phase)
            cluster.workers[1].send_signal(signal.SIGKILL)

        t = threading.Thread(target=killer, daemon=True)
        t.start()
        if system in ("ours", "ours-tasks"):
            from dask_research.experiments import IterationScheduler

            sched = IterationScheduler(Runner(log), slots=2, client=client, max_experiments=TRIALS,
                                       progress=False, prune_floor=0.0, queue_ahead=QUEUE_AHEAD,
                                       transport="tasks" if system == "ours-tasks" else None)
            sched.add(hypotheses())
            report = sched.run()
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
with Client(scheduler_file={sfile!r}, set_as_default=False, timeout=60) as client:
    bench.drive({system!r}, client, {log!r}, {state!r}, resume={resume!r})
"""


def drive(system: str, client: Any, log: str, state: str, resume: bool) -> None:
    """One driver process's study (called by :data:`DRIVER`)."""
    if system in ("ours", "ours-tasks"):
        from dask_research.experiments import IterationScheduler

        if resume:                      # (the journal keeps the transport)
            sched = IterationScheduler.resume(state, Runner(log), client=client, progress=False)
        else:
            sched = IterationScheduler(Runner(log), slots=2, client=client, max_experiments=TRIALS,
                                       progress=False, prune_floor=0.0, checkpoint=state,
                                       queue_ahead=QUEUE_AHEAD,
                                       transport="tasks" if system == "ours-tasks" else None)
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


def driver_kill(system: str, where: pathlib.Path, kill_after: int = TRIALS // 3, phase: str = "end") -> dict:
    from dask_research.testing.processes import process_cluster, subprocess_env

    log = str(where / "trials.log")
    ours = system in ("ours", "ours-tasks")
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
                _wait_kill_point(log, kill_after, phase, alive=lambda p=proc: p.poll() is None)
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


FAULTS = {"worker killed": worker_kill, "driver killed, resumed": driver_kill}
SYSTEMS = {"ours": ("ours", "ours"), "ours-tasks": ("ours (tasks)", "ours (tasks)"),
           "optuna": ("optuna-daskstorage", "optuna-rdb-sqlite")}     # per fault: worker, driver


def summarize(runs: list[dict], by: tuple[str, ...] = ("fault", "system")) -> dict:
    """Per ``fault|system`` (or the fields ``by``), the runs' figures summed up: what every run
    kept and the worst of them; ``extra_runs`` are the objective's runs beyond the budget.

    >>> run = {"counted": 24, "over_budget": 0, "lost": 0, "executions": 26, "wasted_runs": 2,
    ...        "run_twice": ["h7", "h8"], "budget_met": True}
    >>> s = summarize([{"fault": "f", "system": "s", "figures": run},
    ...                {"fault": "f", "system": "s", "figures": {**run, "wasted_runs": 4, "executions": 28}}])
    >>> s["f|s"]["runs"], s["f|s"]["wasted_runs"], s["f|s"]["budget_met_in"], s["f|s"]["over_budget_max"]
    (2, [2, 3.0, 4], '2 of 2', 0)
    >>> summarize([{"fault": "f", "system": "s", "phase": "mid", "figures": run}], by=("system", "phase"))["s|mid"]["extra_runs"]
    [2, 2, 2]
    """
    import statistics

    out: dict = {}
    def key_of(r: dict) -> str:
        return "|".join(str(r[b]) for b in by)

    for key in dict.fromkeys(key_of(r) for r in runs):
        figs = [{**r["figures"], "extra_runs": r["figures"]["executions"] - TRIALS} for r in runs if key_of(r) == key]

        def span(name: str, figs: list = figs) -> list:
            vals = [f[name] for f in figs]
            return [min(vals), statistics.median(vals), max(vals)]

        out[key] = {"runs": len(figs), "counted": span("counted"), "over_budget_max": max(f["over_budget"] for f in figs),
                    "runs_over_budget": sum(f["over_budget"] > 0 for f in figs),
                    "lost": span("lost"), "executions": span("executions"), "extra_runs": span("extra_runs"),
                    "wasted_runs": span("wasted_runs"),
                    "budget_met_in": f"{sum(f['budget_met'] for f in figs)} of {len(figs)}",
                    "runs_with_a_trial_run_twice": sum(bool(f["run_twice"]) for f in figs),
                    "max_run_twice": max(len(f["run_twice"]) for f in figs)}
        if all("ahead_dispatches" in f for f in figs):
            out[key]["ahead_dispatches"] = span("ahead_dispatches")
    return out


def selection(systems: str, faults: str, kill_at: str, phases: str, repeats: int,
              queue_ahead: str | None = None) -> dict:
    """The runs the command line asks for, checked; ``ValueError`` names what is not valid.

    >>> selection("ours,ours", "driver", "0.5", "mid", 1)["systems"], selection("ours", "worker", "0.5", "end", 1)["faults"]
    (['ours'], ['worker killed'])
    >>> selection("ours", "worker,bogus", "0.5,x,0.99", "end", 0)
    Traceback (most recent call last):
    ...
    ValueError: not valid: fault bogus (worker, driver); kill point x, 0.99 (a share of the budget with at least one trial before and after it: 0.04-0.96 of 24); repeats 0 (at least 1)
    """
    bad = []
    names = list(dict.fromkeys(systems.split(",")))
    bad += [f"system {n} ({', '.join(SYSTEMS)})" for n in names if n not in SYSTEMS]
    wanted = list(dict.fromkeys(faults.split(",")))
    bad += [f"fault {n} (worker, driver)" for n in wanted if n not in ("worker", "driver")]
    shares, wrong = [], []
    for text in dict.fromkeys(kill_at.split(",")):
        try:
            ok = 1 <= round(float(text) * TRIALS) <= TRIALS - 1
        except ValueError:
            ok = False
        if ok:
            shares.append(float(text))
        else:
            wrong.append(text)
    if wrong:
        bad.append(f"kill point {', '.join(wrong)} (a share of the budget with at least one trial before and "
                   f"after it: {1 / TRIALS:.2f}-{1 - 1 / TRIALS:.2f} of {TRIALS})")
    kinds = list(dict.fromkeys(phases.split(",")))
    bad += [f"phase {n} (end, mid)" for n in kinds if n not in ("end", "mid")]
    if repeats < 1:
        bad.append(f"repeats {repeats} (at least 1)")
    ahead: Any = None
    if queue_ahead is not None:
        ahead = queue_ahead if queue_ahead == "auto" else int(queue_ahead) if queue_ahead.isdigit() else None
        if ahead is None:
            bad.append(f"queue-ahead {queue_ahead} (auto, or a count: 0, 1, ...)")
    if bad:
        raise ValueError("not valid: " + "; ".join(bad))
    return {"systems": names, "faults": [f for f in FAULTS if f.split()[0] in wanted], "kill_at": shares,
            "phases": kinds, "queue_ahead": ahead}


def _span(v: list) -> str:
    lo, mid, hi = (f"{x:g}" for x in v)
    return lo if lo == hi else f"{lo}-{hi} (median {mid})"


def main(argv: list[str] | None = None) -> dict:
    require("optuna", "optuna_integration", "optuna_distributed", benchmark="bench_experiments_faults")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--queue-ahead", default=None,
                    help='ours: "auto", 0, 1, ... (default: research.experiments.queue-ahead)')
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--systems", default="ours,ours-tasks,optuna",
                    help="which of ours, ours-tasks, optuna to run")
    ap.add_argument("--faults", default="worker,driver", help="which of worker, driver to run")
    ap.add_argument("--kill-at", default="0.25,0.5,0.75",
                    help="kill points: shares of the budget ended before the kill (default 0.25,0.5,0.75)")
    ap.add_argument("--phases", default="end,mid",
                    help="end: as a trial's end is logged; mid: half a trial later (default both)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of every case (default 3)")
    ap.add_argument("--name", default=None,
                    help="results file under benchmarks/results/ (default bench_experiments_faults; "
                         "a run of other than every system, fault, kill point, phase and the default "
                         "repeats: bench_experiments_faults_partial)")
    args = ap.parse_args(argv)
    try:
        choice = selection(args.systems, args.faults, args.kill_at, args.phases, args.repeats, args.queue_ahead)
    except ValueError as e:
        ap.error(str(e))
    systems, faults, kill_at, phases = choice["systems"], choice["faults"], choice["kill_at"], choice["phases"]
    global QUEUE_AHEAD
    QUEUE_AHEAD = choice["queue_ahead"]
    warnings.simplefilter("ignore")
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    load_before = load_averages()
    runs: list[dict] = []
    for fault in faults:
        for share in kill_at:
            for phase in phases:
                for repeat in range(args.repeats):
                    for system in systems:      # every system in turn: the machine's drift falls on all alike
                        name = SYSTEMS[system][0 if fault == "worker killed" else 1]
                        with tempfile.TemporaryDirectory() as where:
                            f = FAULTS[fault](system, pathlib.Path(where), kill_after=round(share * TRIALS),
                                              phase=phase)
                        runs.append({"fault": fault, "system": name, "kill_at": share, "phase": phase,
                                     "repeat": repeat, "figures": f})
                        print(fault, name, share, phase, repeat, f"{f['counted']}/{TRIALS}", f["over_budget"],
                              f["lost"], f["executions"], f["wasted_runs"], ",".join(f["run_twice"]) or "-",
                              f.get("ahead_dispatches", "-"), sep="  ", flush=True)
    summary = summarize(runs)
    print()
    print_table([(*key.split("|"), v["runs"], v["budget_met_in"], v["over_budget_max"], _span(v["lost"]),
                  _span(v["executions"]), _span(v["wasted_runs"]), v["runs_with_a_trial_run_twice"])
                 for key, v in summary.items()],
                ("fault", "system", "runs", "budget met", "most beyond budget", "stale or lost records",
                 "objective runs", "runs not counted", "runs with a trial run twice"))
    figures: dict = {"trials": TRIALS, "trial_seconds": DELAY, "kill_at": kill_at, "phases": phases,
                     "repeats": args.repeats, "queue_ahead": "default" if QUEUE_AHEAD is None else QUEUE_AHEAD,
                     "summary": summary,
                     "summary_by_phase": summarize(runs, ("fault", "system", "phase")),
                     "summary_by_kill_point": summarize(runs, ("fault", "system", "kill_at")), "runs": runs,
                     "load_average": {"before": load_before, "after": load_averages()}}
    if not args.no_write:
        partial = (len(systems) < len(SYSTEMS) or len(faults) < len(FAULTS)
                   or any(getattr(args, k) != ap.get_default(k) for k in ("kill_at", "phases", "repeats")))
        name = args.name or ("bench_experiments_faults_partial" if partial else "bench_experiments_faults")
        path = write_results(name, figures, notes=(
            "Real dask scheduler + 2 one-thread dask workers (no nanny) per run; trials sleep; "
            "counts from the objective's own log and each system's records; every case at each kill point "
            "and phase, repeated, systems interleaved"))
        print(f"\nwrote {path}")
    return figures


if __name__ == "__main__":
    main()
