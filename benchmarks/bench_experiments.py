"""Benchmark of ``dask_research.experiments``: decision overhead, slot occupancy, regret.

Run one benchmark at a time::

    flock /tmp/dask-research-bench.lock python benchmarks/bench_experiments.py [--quick]

Figures (written to ``benchmarks/results/bench_experiments.json``):

1. **Decision overhead** with 10,000 queued hypotheses over 1,000 branches (goal < 100 us):
   (a) the decision alone, ``BranchLedger.select`` + ``pop`` (UCB1 over every branch,
   vectorised) with results recorded as they would arrive with 3 slots; (b) the live loop: the
   gap between a result and the refill of its slot, read from the trace of a real run with an
   instant runner (decision + event records + task submission), and the loop's wall time per
   experiment.
2. **Slot occupancy while work is queued** (goal >= 99 %) with the deterministic runner at
   5 ms, 3 slots: without a client (asyncio tasks) and with Dask futures (LocalCluster,
   processes=False). Next to it the *runner share*: the fraction of busy slot-time spent inside
   the runner; the rest is transport (the Dask round trip), which the occupancy counts as busy.
3. **The bandit problem of PEERS.md section 2** (20 Beta(2, 5) arms, horizon 300, common
   random numbers, seeds 0-9): pseudo-regret and decision time of our UCB1 (c = sqrt 2, the
   default), round-robin, greedy and Optuna TPE ask/tell (if ``optuna`` is importable), plus
   UCB1 with 3 pending pulls per decision batch (how the scheduler decides with 3 slots), and
   a horizon-3000 extension without Optuna (too slow there: its cost grows with history).
"""
from __future__ import annotations

import argparse
import math
import pathlib
import statistics
import sys
import time
import warnings

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
        runs = [_occupancy_figures(_occupancy_scheduler(client, n, branches).run())
                for _ in range(reps)]
        out["dask_futures"] = _median_of(runs)
        t0 = time.perf_counter()
        client.gather(client.map(lambda x: x, range(500), pure=False))
        out["dask_futures"]["noop_task_ms"] = 1e3 * (time.perf_counter() - t0) / 500
    return out


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
    args = ap.parse_args()
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
              f"{occ['dask_futures']['noop_task_ms']:.2f} ms)")

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
    figures["load"] = {"machine_busy": load.machine_busy, "own_busy": load.own_busy}
    foreign = load.machine_busy - load.own_busy
    print(f"\nmachine busy {100 * load.machine_busy:.0f} %, this process "
          f"{100 * load.own_busy:.0f} % (foreign load ~{100 * max(foreign, 0):.0f} %)")
    notes = ("occupancy = busy slot-time / available slot-time over the periods in which work "
             "was queued, from the scheduler's own trace; runner_share = time inside the "
             "runner / busy slot-time (the rest is transport). Regret is pseudo-regret "
             "sum(max p - p_chosen).")
    if not math.isnan(load.machine_busy) and foreign > 0.05:
        notes += f" Foreign load during the run: {100 * foreign:.0f} % of the machine."
    path = write_results("bench_experiments", figures, notes=notes)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
