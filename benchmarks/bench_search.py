"""Benchmark of the scheduler as a hyperparameter search (issue 17).

Run one benchmark at a time::

    flock /tmp/dask-research-bench.lock python benchmarks/bench_search.py [--seeds 6]

The problem: scikit-learn's bundled ``load_digits`` and ``load_breast_cancer`` (no downloads);
branches are five model families (RBF SVC, logistic regression, random forest, k-NN, extra
trees) over the grids of :mod:`benchmarks.search_space` (which include regions that score
badly, like an SVC with a tiny ``gamma`` and ``C``); the reward of a configuration is its
3-fold CV accuracy; budget 60 experiments, 3 slots, seeds 0-5. CV scores are cached per
(dataset, configuration) (``benchmarks/results/bench_search_cache.json``, filled on first
use), so every method sees the same evaluations and reruns are cheap; "eval s" is the CV time a
method's evaluations took when they were computed, "decide ms" the measured decision overhead
per experiment (the whole loop minus the cache lookups, or Optuna's ask + tell).

Methods (same budget, same space):

- ``ours-<objective>-<policy>``: the scheduler with random configurations of each family
  queued in random order (what a user without a sampler does), ``objective="mean"`` (UCB1)
  or ``"max"`` (quantile UCB, Threshold Ascent); 3 slots, ``apply_order="dispatch"``
  (reproducible).
- ``ours-<objective>-<policy>+optuna``: the same, each branch a lazy
  :class:`~dask_research.experiments.OptunaSource` (TPE per family), so nothing is pre-drawn.
- ``ours-max-recent-ta+unique``: the configuration chosen on tuning seeds 100-199
  (``benchmarks/search_tune.py``): Threshold Ascent (top 3, delta 10) whose hit rate counts a
  branch's last 6 results (``ThresholdAscentPolicy(top=3, delta=10.0, window=6)``), over
  per-family TPE samplers that never propose a configuration twice
  (``OptunaSource(..., unique=True)``).
- ``optuna-tpe``: one Optuna TPE study over the joint space (the family a categorical, its
  parameters conditional), sequential ask/tell (TPE's best case: no pending trials).
- ``optuna-tpe-unique``: the same study, but a configuration it asks for again is told its
  known score without counting against the budget (a stronger peer than the issue's).
- ``random``: uniform over families, then over the family's grid.

Figures go to ``benchmarks/results/bench_search.json``: mean best score, seeds won against TPE
(better / tied / worse), the paired difference to TPE with a bootstrap 95 % interval and a sign
test (:mod:`benchmarks.search_stats`), wall and eval time, decision overhead, runs on the family that holds
the best configuration and whether a method ignored it (at most one run).
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time
import warnings
from typing import Any

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks import search_space as sp  # noqa: E402
from benchmarks.harness import LoadMonitor, finish, print_table, require  # noqa: E402
from benchmarks.search_stats import paired  # noqa: E402

BUDGET = 60
SLOTS = 3


def _encode(family: str) -> dict[str, Any]:
    """Optuna distributions of ``family``: ordered grids as an integer index, the rest as a
    categorical of the value's repr (so TPE sees order where there is one)."""
    import optuna

    out: dict[str, Any] = {}
    for name, values in sp.SPACE[family].items():
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            out[name] = optuna.distributions.IntDistribution(0, len(values) - 1)
        else:
            out[name] = optuna.distributions.CategoricalDistribution([repr(v) for v in values])
    return out


def _decode(family: str, params: dict[str, Any]) -> dict[str, Any]:
    config = {}
    for name, values in sp.SPACE[family].items():
        v = params[name]
        config[name] = values[v] if isinstance(v, int) else next(x for x in values
                                                                 if repr(x) == v)
    return config


class Problem:
    """One dataset: cached scores, the best configuration and its family."""

    def __init__(self, dataset: str, cache: dict[str, list[float]]):
        self.dataset = dataset
        self.cache = cache
        best = max((cache[sp.key(dataset, f, c)][0], f) for f in sp.FAMILIES
                    for c in sp.configs(f))
        self.best_score, self.best_family = best
        self.lookups = 0
        self.lookup_s = 0.0
        self.eval_s = 0.0

    def score(self, family: str, config: dict[str, Any]) -> float:
        t0 = time.perf_counter()
        acc, sec = self.cache[sp.key(self.dataset, family, config)]
        self.lookups += 1
        self.eval_s += sec
        self.lookup_s += time.perf_counter() - t0
        return acc

    def reset(self) -> None:
        self.lookups, self.lookup_s, self.eval_s = 0, 0.0, 0.0


def run_ours(prob: Problem, seed: int, objective: str, max_policy: str | None,
             sampler: bool, startup: int = 5, source: Any = None, **kw: Any) -> dict[str, Any]:
    """One seeded run of the scheduler; ``source(family, seed)`` (default: an
    :class:`~dask_research.experiments.OptunaSource` over the family's grid) makes each
    branch's proposer when ``sampler`` is true; ``kw`` go to the scheduler."""
    from dask_research.experiments import Branch, Hypothesis, IterationScheduler, OptunaSource

    def runner(h: Any) -> float:
        config = h.payload["config"] if "config" in h.payload else _decode(h.branch, h.payload)
        return prob.score(h.branch, config)

    args: dict[str, Any] = dict(slots=SLOTS, max_experiments=BUDGET, objective=objective,
                                progress=False, apply_order="dispatch", seed=seed,
                                prune_floor=0.0 if objective == "mean" else None)
    if objective == "max":
        args["max_policy"] = max_policy
    args.update(kw)
    sched = IterationScheduler(runner, **args)
    rng = np.random.default_rng(seed)
    if sampler:
        if source is None:
            def source(f: str, s: int) -> Any:
                return OptunaSource(_encode(f), seed=s, startup=startup)
        sched.add([Branch(f, propose=source(f, seed * 10 + k))
                   for k, f in enumerate(sp.FAMILIES)])
    else:
        hyps = []
        for f in sp.FAMILIES:
            grid = sp.configs(f)
            for n, j in enumerate(rng.permutation(len(grid))[:BUDGET]):
                hyps.append(Hypothesis(f"{f}-{n}", f, {"config": grid[j]}))
        # interleave the families so insertion order favours none of them
        hyps.sort(key=lambda h: int(h.id.rsplit("-", 1)[1]))
        sched.add(hyps)
    prob.reset()
    t0 = time.perf_counter()
    report = sched.run()
    wall = time.perf_counter() - t0
    runs = {b: s.runs for b, s in report.branches.items()}
    best = report.best_result
    assert best is not None
    return {"best": float(best.reward), "best_family": best.hypothesis.branch, "wall_s": wall,
            "decide_ms": 1e3 * (wall - prob.lookup_s) / max(report.dispatched, 1),
            "eval_s": prob.eval_s, "runs": runs, "report_best": report.best,
            "pruned": [b for b, s in report.branches.items() if s.pruned]}


def run_tpe(prob: Problem, seed: int, unique: bool = False) -> dict[str, Any]:
    """Joint Optuna TPE, sequential; ``unique``: a configuration asked for again is told its
    known score without counting against the budget (a stronger peer than the issue's)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study = optuna.create_study(direction="maximize",
                                    sampler=optuna.samplers.TPESampler(seed=seed))
    enc = {f: _encode(f) for f in sp.FAMILIES}
    runs = dict.fromkeys(sp.FAMILIES, 0)
    best, best_family = -1.0, None
    known: dict[str, float] = {}
    prob.reset()
    t0 = time.perf_counter()
    while sum(runs.values()) < BUDGET:
        trial = study.ask()
        f = trial.suggest_categorical("family", list(sp.FAMILIES))
        params = {}
        for name, dist in enc[f].items():
            if isinstance(dist, optuna.distributions.IntDistribution):
                params[name] = trial.suggest_int(f"{f}.{name}", dist.low, dist.high)
            else:
                params[name] = trial.suggest_categorical(f"{f}.{name}", list(dist.choices))
        k = sp.key(prob.dataset, f, _decode(f, params))
        if unique and k in known and len(study.trials) < 20 * BUDGET:
            study.tell(trial, known[k])
            continue
        acc = prob.score(f, _decode(f, params))
        known[k] = acc
        study.tell(trial, acc)
        runs[f] += 1
        if acc > best:
            best, best_family = acc, f
    wall = time.perf_counter() - t0
    return {"best": best, "best_family": best_family, "wall_s": wall,
            "decide_ms": 1e3 * (wall - prob.lookup_s) / BUDGET, "eval_s": prob.eval_s,
            "runs": runs}


def run_random(prob: Problem, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(10_000 + seed)
    runs = dict.fromkeys(sp.FAMILIES, 0)
    best, best_family = -1.0, None
    grids = {f: sp.configs(f) for f in sp.FAMILIES}
    seen: set[tuple[str, int]] = set()
    prob.reset()
    t0 = time.perf_counter()
    while sum(runs.values()) < BUDGET:
        f = sp.FAMILIES[int(rng.integers(len(sp.FAMILIES)))]
        j = int(rng.integers(len(grids[f])))
        if (f, j) in seen:
            continue
        seen.add((f, j))
        acc = prob.score(f, grids[f][j])
        runs[f] += 1
        if acc > best:
            best, best_family = acc, f
    wall = time.perf_counter() - t0
    return {"best": best, "best_family": best_family, "wall_s": wall,
            "decide_ms": 1e3 * (wall - prob.lookup_s) / BUDGET, "eval_s": prob.eval_s,
            "runs": runs}


def run_recent_ta(prob: Problem, seed: int) -> dict[str, Any]:
    """The configuration chosen on tuning seeds 100-199 (``search_tune.py``): sliding-window
    Threshold Ascent (top 3, delta 10, window 6) over per-family samplers that never repeat
    a configuration."""
    from dask_research.experiments import OptunaSource
    from dask_research.experiments.policies.maxbandit import ThresholdAscentPolicy

    def source(f: str, s: int) -> Any:
        return OptunaSource(_encode(f), seed=s, startup=5, unique=True)
    return run_ours(prob, seed, "max", "threshold-ascent", True, source=source,
                    policy=ThresholdAscentPolicy(top=3, delta=10.0, window=6))


def run_recent_ta_gp(prob: Problem, seed: int) -> dict[str, Any]:
    """The same, with Optuna's noise-free ``GPSampler`` as the SVC family's proposer (TPE for
    the others); chosen on tuning seeds 100-199 (``search_tune.py``,
    ``rta-s3-w6-d10-gpsvc-det-unique``)."""
    import optuna

    from dask_research.experiments import OptunaSource
    from dask_research.experiments.policies.maxbandit import ThresholdAscentPolicy

    def source(f: str, s: int) -> Any:
        sampler = None
        if f == "svc":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")     # deterministic_objective: experimental
                sampler = optuna.samplers.GPSampler(seed=s, n_startup_trials=5,
                                                    deterministic_objective=True,
                                                    warn_independent_sampling=False)
        return OptunaSource(_encode(f), seed=s, startup=5, unique=True, sampler=sampler)
    return run_ours(prob, seed, "max", "threshold-ascent", True, source=source,
                    policy=ThresholdAscentPolicy(top=3, delta=10.0, window=6))


METHODS: dict[str, Any] = {
    "ours-mean-ucb1": lambda p, s: run_ours(p, s, "mean", None, False),
    "ours-max-quantile-ucb": lambda p, s: run_ours(p, s, "max", "quantile-ucb", False),
    "ours-max-threshold-ascent": lambda p, s: run_ours(p, s, "max", "threshold-ascent", False),
    "ours-mean-ucb1+optuna": lambda p, s: run_ours(p, s, "mean", None, True),
    "ours-max-quantile-ucb+optuna": lambda p, s: run_ours(p, s, "max", "quantile-ucb", True),
    "ours-max-threshold-ascent+optuna": lambda p, s: run_ours(p, s, "max",
                                                              "threshold-ascent", True),
    "ours-max-recent-ta+unique": run_recent_ta,
    "ours-max-recent-ta+gp-svc": run_recent_ta_gp,
    "optuna-tpe": run_tpe,
    "optuna-tpe-unique": lambda p, s: run_tpe(p, s, unique=True),
    "random": run_random,
}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    require("optuna", "sklearn", benchmark="bench_search")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--name", default="bench_search", help="results file name")
    args = ap.parse_args(argv)
    methods = args.methods.split(",")
    cache = sp.fill_cache()
    figures: dict[str, Any] = {"budget": BUDGET, "slots": SLOTS, "seeds": args.seeds,
                               "families": list(sp.FAMILIES), "datasets": {}}
    with LoadMonitor() as load:
        for dataset in sp.DATASETS:
            prob = Problem(dataset, cache)
            per: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
            for seed in range(args.seeds):
                for m in methods:
                    per[m].append(METHODS[m](prob, seed))
            tpe = [r["best"] for r in per.get("optuna-tpe", [])]
            rows, table = [], {}
            for m in methods:
                rs = per[m]
                bests = [r["best"] for r in rs]
                on_best = [r["runs"].get(prob.best_family, 0) for r in rs]
                won = ([sum(b > t for b, t in zip(bests, tpe)), sum(b == t for b, t in
                        zip(bests, tpe)), sum(b < t for b, t in zip(bests, tpe))]
                       if tpe and m != "optuna-tpe" else None)
                table[m] = {
                    "mean_best": statistics.mean(bests), "bests": bests,
                    "vs_tpe_better_tied_worse": won,
                    "vs_tpe_paired": (paired(bests, tpe) if tpe and m != "optuna-tpe"
                                      else None),
                    "found_best_config": sum(b == prob.best_score for b in bests),
                    "wall_s": statistics.mean(r["wall_s"] for r in rs),
                    "eval_s": statistics.mean(r["eval_s"] for r in rs),
                    "decide_ms_per_experiment": statistics.mean(r["decide_ms"] for r in rs),
                    "runs_on_best_family": on_best,
                    "ignored_best_family": sum(n <= 1 for n in on_best),
                    "pruned": [r.get("pruned", []) for r in rs],
                }
                pst = table[m]["vs_tpe_paired"]
                rows.append((m, f"{table[m]['mean_best']:.4f}",
                             "-" if won is None else "/".join(map(str, won)),
                             "-" if pst is None else "{:+.4f} [{:+.4f}, {:+.4f}] p={:.2f}".format(
                                 pst["mean_diff"], *pst["ci95"], pst["sign_p"]),
                             table[m]["found_best_config"],
                             f"{table[m]['wall_s']:.2f}", f"{table[m]['eval_s']:.1f}",
                             f"{table[m]['decide_ms_per_experiment']:.2f}",
                             min(on_best), table[m]["ignored_best_family"]))
            print(f"\n{dataset}: best configuration {prob.best_score:.4f} "
                  f"({prob.best_family})")
            print_table(rows, ("method", "mean best", "vs TPE +/=/-",
                               "diff vs TPE [95% CI] sign p", "found best",
                               "wall s", "eval s", "decide ms", "min runs best fam",
                               "ignored"))
            figures["datasets"][dataset] = {"best_score": prob.best_score,
                                            "best_family": prob.best_family,
                                            "methods": table}
    return finish(args, figures, load, notes=(
        "Cached 3-fold CV accuracy (unshuffled StratifiedKFold) of grid configurations; "
        "decide ms = loop wall minus cache lookups per experiment; eval s = CV seconds of "
        "the evaluated configurations when they were computed (n_jobs=1)."))


if __name__ == "__main__":
    main()
