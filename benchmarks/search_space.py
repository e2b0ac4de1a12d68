"""The search problem of ``bench_search.py``: five model families on bundled scikit-learn data.

Every family has a finite grid of configurations (log-spaced ranges, including regions that
score badly, such as an RBF SVC with a tiny ``gamma`` and ``C``), so the 3-fold CV accuracy of
every (dataset, configuration) pair can be cached on disk and all methods share evaluations:
a rerun of the benchmark costs table lookups, and a comparison never depends on which method
happened to pay for an evaluation. Each cached entry keeps the seconds its CV took, so the
benchmark reports the evaluation time a method *would* have spent next to its measured
decision overhead.

Run ``python benchmarks/search_space.py`` to fill the cache (``n_jobs=1``; a few minutes).
"""
from __future__ import annotations

import itertools
import json
import os
import pathlib
import sys
import time
import warnings
from typing import Any

CACHE = pathlib.Path(__file__).resolve().parent / "results" / "bench_search_cache.json"
DATASETS = ("digits", "breast_cancer")


def _logs(lo: float, hi: float, step: float) -> list[float]:
    n = int(round((hi - lo) / step)) + 1
    return [float(f"{10 ** (lo + k * step):.6g}") for k in range(n)]


#: ``{family: {parameter: list of values}}``; a configuration is one value per parameter.
SPACE: dict[str, dict[str, list[Any]]] = {
    "svc": {"C": _logs(-2, 3, 0.5), "gamma": _logs(-5, 0, 0.5)},
    "logreg": {"C": _logs(-4, 2, 0.5), "class_weight": [None, "balanced"]},
    "random_forest": {"n_estimators": [10, 25, 50], "max_depth": [2, 4, 8, None],
                      "max_features": ["sqrt", 0.5], "min_samples_leaf": [1, 4]},
    "knn": {"n_neighbors": [1, 3, 5, 7, 9, 13, 17, 25, 35, 50], "weights": ["uniform",
                                                                          "distance"],
            "p": [1, 2]},
    "extra_trees": {"n_estimators": [10, 25, 50], "max_depth": [2, 4, 8, None],
                    "max_features": ["sqrt", 0.5], "min_samples_leaf": [1, 4]},
}
FAMILIES = tuple(SPACE)


def configs(family: str) -> list[dict[str, Any]]:
    """Every configuration of ``family`` (grid order)."""
    names = list(SPACE[family])
    return [dict(zip(names, vals)) for vals in itertools.product(*SPACE[family].values())]


def key(dataset: str, family: str, config: dict[str, Any]) -> str:
    """Cache key of one evaluation."""
    return f"{dataset}|{family}|" + json.dumps(config, sort_keys=True)


def _model(family: str, config: dict[str, Any]) -> Any:
    from sklearn.ensemble import ExtraTreesClassifier, RandomForestClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.neighbors import KNeighborsClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import SVC

    if family == "svc":
        return make_pipeline(StandardScaler(), SVC(kernel="rbf", **config))
    if family == "logreg":
        return make_pipeline(StandardScaler(), LogisticRegression(max_iter=300, **config))
    if family == "knn":
        return make_pipeline(StandardScaler(), KNeighborsClassifier(**config))
    if family == "random_forest":
        return RandomForestClassifier(random_state=0, n_jobs=1, **config)
    return ExtraTreesClassifier(random_state=0, n_jobs=1, **config)


_DATA: dict[str, Any] = {}


def data(dataset: str) -> tuple[Any, Any]:
    """``(X, y)`` of a bundled dataset (no downloads)."""
    if dataset not in _DATA:
        from sklearn import datasets

        loader = {"digits": datasets.load_digits,
                  "breast_cancer": datasets.load_breast_cancer}[dataset]
        _DATA[dataset] = loader(return_X_y=True)
    return _DATA[dataset]


def evaluate(dataset: str, family: str, config: dict[str, Any]) -> tuple[float, float]:
    """``(3-fold CV accuracy, seconds)`` of one configuration (stratified, unshuffled)."""
    from sklearn.model_selection import cross_val_score
    from threadpoolctl import threadpool_limits

    X, y = data(dataset)
    t0 = time.perf_counter()
    with warnings.catch_warnings(), threadpool_limits(1):   # n_jobs=1 also for BLAS
        warnings.simplefilter("ignore")
        score = float(cross_val_score(_model(family, config), X, y, cv=3, n_jobs=1).mean())
    return score, time.perf_counter() - t0


def load_cache() -> dict[str, list[float]]:
    """``{key: [accuracy, seconds]}`` from disk (empty when there is no cache yet)."""
    try:
        return json.loads(CACHE.read_text())
    except (OSError, ValueError):
        return {}


def save_cache(cache: dict[str, list[float]]) -> None:
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    tmp = CACHE.with_suffix(".tmp")
    tmp.write_text(json.dumps(cache, indent=0, sort_keys=True))
    os.replace(tmp, CACHE)


def fill_cache(datasets: tuple[str, ...] = DATASETS, verbose: bool = True) -> dict:
    """Evaluate every configuration not yet cached (saving every 20 evaluations)."""
    cache = load_cache()
    todo = [(d, f, c) for d in datasets for f in FAMILIES for c in configs(f)
            if key(d, f, c) not in cache]
    for n, (d, f, c) in enumerate(todo, 1):
        cache[key(d, f, c)] = list(evaluate(d, f, c))
        if n % 20 == 0 or n == len(todo):
            save_cache(cache)
            if verbose:
                print(f"{n}/{len(todo)} evaluated", file=sys.stderr, flush=True)
    return cache


if __name__ == "__main__":
    fill_cache()
