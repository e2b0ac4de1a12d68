"""A research loop on the UCB iteration scheduler: which model family fits the data best?

Four research branches (model families) compete for three experiment slots. Each hypothesis
is one hyper-parameter setting; the runner fits it on a training split of a synthetic,
noisy regression problem and returns the validation R^2 (clipped to [0, 1]) as the reward.
UCB1 spends the slots where the evidence is promising, the pruning gate drops families that
keep scoring low, a family whose mean passes the paper threshold triggers the "paper" stage
(here: a short markdown summary written by a paper writer running in parallel), and the
expander refines the settings of any hypothesis that scored well.

Run::

    python examples/experiments_ucb.py                      # asyncio, numpy in threads
    python examples/experiments_ucb.py --local-cluster      # the same on Dask futures
    python examples/experiments_ucb.py --scheduler tcp://host:8786
"""
from __future__ import annotations

import argparse
import pathlib
import tempfile

import numpy as np

from dask_research.experiments import BranchStats, Hypothesis, IterationScheduler, Result

# -- the problem: y = sin(3x) + 0.5 x^2 + noise, 1-d, 400 training and 400 validation points
rng = np.random.default_rng(7)
X = rng.uniform(-2, 2, 800)
Y = np.sin(3 * X) + 0.5 * X ** 2 + rng.normal(0, 0.3, 800)
X_TRAIN, Y_TRAIN, X_VALID, Y_VALID = X[:400], Y[:400], X[400:], Y[400:]


def _features(x: np.ndarray, family: str, p: dict) -> np.ndarray:
    if family == "linear":
        return np.column_stack([np.ones_like(x), x])
    if family == "polynomial":
        return np.vander(x / 2, p["degree"] + 1)
    if family == "fourier":                      # random Fourier features of an RBF kernel
        w = np.random.default_rng(p["seed"]).normal(0, p["scale"], p["width"])
        b = np.random.default_rng(p["seed"] + 1).uniform(0, 2 * np.pi, p["width"])
        return np.cos(np.outer(x, w) + b)
    raise ValueError(family)


def _fit_predict(family: str, p: dict) -> np.ndarray:
    if family == "knn":
        d = np.abs(X_VALID[:, None] - X_TRAIN[None, :])
        nearest = np.argpartition(d, p["k"], axis=1)[:, : p["k"]]
        return Y_TRAIN[nearest].mean(axis=1)
    a, v = _features(X_TRAIN, family, p), _features(X_VALID, family, p)
    lam = p.get("ridge", 1e-6)
    coef = np.linalg.solve(a.T @ a + lam * np.eye(a.shape[1]), a.T @ Y_TRAIN)
    return v @ coef


def runner(h: Hypothesis) -> Result:
    """Fit one setting; reward = validation R^2 clipped to [0, 1]."""
    pred = _fit_predict(h.branch, h.payload)
    r2 = 1 - np.mean((pred - Y_VALID) ** 2) / np.var(Y_VALID)
    return Result(h, float(np.clip(r2, 0.0, 1.0)), {"r2": float(r2)})


def refine(result: Result) -> list[Hypothesis]:
    """Expander: two neighbouring settings around any result with R^2 above 0.85."""
    h = result.hypothesis
    if result.reward <= 0.85 or h.generation >= 2:
        return []
    p = dict(h.payload)
    if h.branch == "fourier":
        out = [dict(p, scale=p["scale"] * f) for f in (0.8, 1.25)]
    elif h.branch == "polynomial":
        out = [dict(p, degree=d) for d in (p["degree"] - 1, p["degree"] + 1) if d >= 1]
    elif h.branch == "knn":
        out = [dict(p, k=k) for k in (max(1, p["k"] - 3), p["k"] + 3)]
    else:
        return []
    return [h.followup(f".{j + 1}", payload) for j, payload in enumerate(out)]


def make_paper_writer(folder: pathlib.Path):
    def write_paper(branch: str, stats: BranchStats, best: Result) -> str:
        path = folder / f"{branch}.md"
        path.write_text(f"# {branch}\n\nmean R^2 {stats.mean:.3f} over {stats.runs} runs; "
                        f"trigger: {best.hypothesis.id} {best.hypothesis.payload}\n")
        return str(path)

    return write_paper


def hypotheses() -> list[Hypothesis]:
    hs = [Hypothesis(f"linear-{k}", "linear", {"ridge": r})
          for k, r in enumerate([1e-6, 1e-2, 1, 10])]
    hs += [Hypothesis(f"poly-{d}", "polynomial", {"degree": d, "ridge": 1e-6})
           for d in range(2, 12)]
    hs += [Hypothesis(f"rff-{w}-{s}", "fourier",
                      {"width": w, "scale": s, "seed": 11, "ridge": 1e-3})
           for w in (20, 80) for s in (0.5, 1.5, 3.0, 6.0)]
    hs += [Hypothesis(f"knn-{k}", "knn", {"k": k}) for k in (1, 3, 7, 15, 31, 63)]
    return hs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--local-cluster", action="store_true", help="run on a LocalCluster")
    ap.add_argument("--scheduler", help="address of a running Dask scheduler")
    args = ap.parse_args()
    client = cluster = None
    if args.scheduler or args.local_cluster:
        from distributed import Client, LocalCluster

        if args.scheduler:
            client = Client(args.scheduler)
        else:
            cluster = LocalCluster(n_workers=1, threads_per_worker=3, processes=False,
                                   dashboard_address=None)
            client = Client(cluster)
    papers = pathlib.Path(tempfile.mkdtemp(prefix="experiments-papers-"))
    try:
        sched = IterationScheduler(
            runner, slots=3, prune_after_runs=3, prune_floor=0.5, paper_threshold=0.8,
            expander=refine, paper_writer=make_paper_writer(papers), max_experiments=60,
            client=client, progress=False)
        sched.add(hypotheses())
        report = sched.run()
    finally:
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.close()
    print(report)
    best = max(report.results, key=lambda r: r.reward)
    print(f"\nbest setting: {best.hypothesis.id} {best.hypothesis.payload} "
          f"R^2={best.metrics['r2']:.3f}")
    print(f"papers: {report.papers}")
    print(f"dropped by pruning: {len(report.dropped)} hypotheses; "
          f"occupancy while queued {100 * report.occupancy:.1f} %")
    print("\nfirst decisions:")
    for ev in report.events.of("select")[:6]:
        top = sorted(report.events.scores(ev).items(), key=lambda kv: -kv[1])[:3]
        print(f"  t={ev.t * 1e3:7.2f} ms  pick {ev.branch:<10} {ev.hypothesis:<14} "
              + "  ".join(f"{b}={s:.3g}" for b, s in top))


if __name__ == "__main__":
    main()
