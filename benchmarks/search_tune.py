"""Choose the max-objective search configuration on tuning seeds, away from the benchmark's.

::

    python benchmarks/search_tune.py --seeds 100-129 [--cands NAME,...] [--name FILE]

Every candidate runs on both datasets of ``bench_search.py`` (cached scores, same budget and
slots) for the given seeds, next to Optuna TPE on the same seeds; each row is the paired
comparison of :func:`benchmarks.search_stats.paired`. Parameters are picked on seeds
100-129 (and checked on 130-199); the benchmark's seeds 0-29 stay held out.
"""
from __future__ import annotations

import argparse
import pathlib
import sys
from collections.abc import Callable
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks import bench_search as bs  # noqa: E402
from benchmarks import search_space as sp  # noqa: E402
from benchmarks.search_stats import paired  # noqa: E402

Method = Callable[[bs.Problem, int], dict[str, Any]]


def ours(policy: Callable[[], Any] | None = None, unique: bool = False, startup: int = 5,
         sampler: bool = True, max_policy: str = "threshold-ascent",
         gp: tuple[str, ...] = (), deterministic: bool = False) -> Method:
    """A candidate: ``objective="max"``, a policy factory (default: ``max_policy``), and
    OptunaSource (``unique``: never proposes a configuration twice); the families in ``gp``
    get Optuna's ``GPSampler`` (``startup`` random trials, ``deterministic``: a noise-free
    GP) instead of the default TPE sampler."""
    from dask_research.experiments import OptunaSource

    def source(f: str, s: int) -> Any:
        smp = None
        if f in gp:
            import warnings

            import optuna
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")     # deterministic_objective: experimental
                smp = optuna.samplers.GPSampler(seed=s, n_startup_trials=startup,
                                                deterministic_objective=deterministic,
                                                warn_independent_sampling=False)
        return OptunaSource(bs._encode(f), seed=s, startup=startup, unique=unique, sampler=smp)

    def run(prob: bs.Problem, seed: int) -> dict[str, Any]:
        kw = {} if policy is None else {"policy": policy()}
        return bs.run_ours(prob, seed, "max", max_policy, sampler, source=source, **kw)
    return run


def _ta(top: int = 5, delta: float = 0.1) -> Callable[[], Any]:
    from dask_research.experiments.policies.maxbandit import ThresholdAscentPolicy
    return lambda: ThresholdAscentPolicy(top, delta)


def _mu(alpha: float) -> Callable[[], Any]:
    from benchmarks.search_policies import MaxUCBPolicy
    return lambda: MaxUCBPolicy(alpha)


def _rta(top: int = 5, delta: float = 0.1, window: int = 6,
         distinct: bool = False) -> Callable[[], Any]:
    """Threshold Ascent over each branch's last ``window`` results (``distinct``: the
    rejected :class:`~benchmarks.search_policies.DistinctThresholdAscent`)."""
    if distinct:
        from benchmarks.search_policies import DistinctThresholdAscent
        return lambda: DistinctThresholdAscent(top, delta, window)
    from dask_research.experiments.policies.maxbandit import ThresholdAscentPolicy
    return lambda: ThresholdAscentPolicy(top, delta, window=window)


def _rise(window: int) -> Callable[[], Any]:
    from benchmarks.search_policies import RisingPolicy
    return lambda: RisingPolicy(bs.BUDGET, window)


CANDIDATES: dict[str, Method] = {
    "ta": ours(),
    "ta-unique": ours(unique=True),
    **{f"ta-d{d:g}": ours(_ta(delta=d)) for d in (1, 10, 30, 100)},
    **{f"ta-d{d:g}-unique": ours(_ta(delta=d), unique=True) for d in (1, 10, 30, 100)},
    **{f"maxucb-a{a:g}": ours(_mu(a)) for a in (0.1, 0.25, 0.5, 1.0)},
    **{f"maxucb-a{a:g}-unique": ours(_mu(a), unique=True) for a in (0.1, 0.25, 0.5, 1.0)},
    **{f"ta-s{s}-d{d:g}-unique": ours(_ta(s, d), unique=True) for s in (2, 3, 10)
       for d in (0.1, 1, 10)},
    **{f"rta-w{w}-d{d:g}-unique": ours(_rta(5, d, w), unique=True) for w in (4, 6, 8, 10)
       for d in (0.1, 1, 10, 30, 100)},
    **{f"rta-s{s}-w{w}-d{d:g}-unique": ours(_rta(s, d, w), unique=True) for s in (3, 10)
       for w in (6, 8) for d in (1, 10, 30)},
    **{f"rta-w{w}-d{d:g}": ours(_rta(5, d, w)) for w in (6, 8) for d in (1, 10)},
    **{f"rta-s{s}-w6-d10-st{n}-unique": ours(_rta(s, 10, 6), unique=True, startup=n)
       for s in (3, 5) for n in (3, 8)},
    **{f"rta-distinct-s{s}-w6-d{d:g}-unique": ours(_rta(s, d, 6, True), unique=True)
       for s in (3, 5) for d in (1, 10)},
    **{f"rising-w{w}-unique": ours(_rise(w), unique=True) for w in (3, 5, 8)},
    # GPSampler as the per-family proposer (the SVC family only, or every family)
    **{f"rta-s3-w6-d10-gp{g}{'-det' if det else ''}-unique": ours(
        _rta(3, 10, 6), unique=True, gp=fams, deterministic=det)
       for g, fams in (("svc", ("svc",)), ("all", sp.FAMILIES)) for det in (False, True)},
}


def seeds_arg(text: str) -> list[int]:
    """``"100-129"`` or ``"0,3,5"`` as a list of seeds.

    >>> seeds_arg("3-5"), seeds_arg("1,7")
    ([3, 4, 5], [1, 7])
    """
    if "-" in text:
        lo, hi = map(int, text.split("-"))
        return list(range(lo, hi + 1))
    return [int(x) for x in text.split(",")]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="100-129")
    ap.add_argument("--cands", default=",".join(CANDIDATES))
    ap.add_argument("--name", default=None, help="results file name (default: no file)")
    args = ap.parse_args(argv)
    seeds = seeds_arg(args.seeds)
    cache = sp.load_cache()
    out: dict[str, Any] = {}
    tpe: dict[str, list[float]] = {}
    for d in sp.DATASETS:
        prob = bs.Problem(d, cache)
        tpe[d] = [bs.run_tpe(prob, s)["best"] for s in seeds]
    for name in args.cands.split(","):
        row = {}
        for d in sp.DATASETS:
            prob = bs.Problem(d, cache)
            rs = [CANDIDATES[name](prob, s) for s in seeds]
            st = paired([r["best"] for r in rs], tpe[d])
            st["svc_runs"] = sum(r["runs"].get(prob.best_family, 0) for r in rs) / len(rs)
            st["found_best"] = sum(r["best"] == prob.best_score for r in rs)
            st["decide_ms"] = sum(r["decide_ms"] for r in rs) / len(rs)
            row[d] = st
        out[name] = row
        print(name.ljust(24) + "  ".join(
            f"{d[:6]} {s['mean']:.4f}-{s['peer_mean']:.4f} d={1e4 * s['mean_diff']:+5.1f}e-4 "
            f"[{1e4 * s['ci95'][0]:+5.1f},{1e4 * s['ci95'][1]:+5.1f}] "
            f"{'/'.join(map(str, s['better_tied_worse']))} p={s['sign_p']:.2f} "
            f"svc={s['svc_runs']:.1f} top={s['found_best']} {s['decide_ms']:.2f}ms"
            for d, s in row.items()), flush=True)
    if args.name:
        from benchmarks.harness import write_results
        write_results(args.name, {"seeds": args.seeds, "candidates": out}, notes=(
            "Paired against joint Optuna TPE on the same seeds; mean_diff and ci95 (bootstrap) "
            "of best-score differences, sign_p an exact sign test, svc_runs per seed."))
    return out


if __name__ == "__main__":
    main()
