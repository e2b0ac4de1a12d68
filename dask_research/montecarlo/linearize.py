"""The delta method: what linearization predicts, next to what sampling found.

``g(mu)`` (the plug-in value) and ``sd_lin = sqrt(grad' C grad)`` with a central
finite-difference gradient at the input means and ``C`` the inputs' covariance (correlated
blocks included). Where the pipeline is strongly non-linear over the inputs' spread the two
disagree with the sampled mean and sd, which is the reason to run Monte-Carlo at all.

Examples
--------
>>> from dask_research.montecarlo import Job, Normal
>>> job = Job(lambda a, b: 2 * a + b, {"a": Normal(1, 0.1), "b": Normal(0, 0.2)}, range=(-9, 9))
>>> lin = linearize(job)
>>> round(lin.value, 12), round(lin.sd, 12)         # sqrt(4 * 0.01 + 0.04)
(2.0, 0.282842712475)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .. import config

__all__ = ["linearize", "Linearized"]


@dataclass
class Linearized:
    """Plug-in value ``g(mu)``, delta-method sd and the gradient at the input means."""

    value: float
    sd: float
    gradient: dict[str, float] = field(default_factory=dict)
    means: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"value": self.value, "sd": self.sd, "gradient": self.gradient, "means": self.means}


def _moments(job) -> tuple[np.ndarray, np.ndarray]:
    means, blocks = [], []
    for dist in job.inputs.values():
        means.append(dist.mean())
        blocks.append(dist.cov())
    k = sum(b.shape[0] for b in blocks)
    cov = np.zeros((k, k))
    i = 0
    for b in blocks:
        d = b.shape[0]
        cov[i:i + d, i:i + d] = b
        i += d
    return np.concatenate(means), cov


def linearize(job, step: float | None = None) -> Linearized | None:
    """Delta-method sd and plug-in value of a scalar pipeline; ``None`` for vector outputs."""
    step = float(config.resolve("montecarlo.finite-difference-step", step))
    names = job.names
    mu, cov = _moments(job)
    k = len(names)
    sd_in = np.sqrt(np.diag(cov))
    h = step * np.maximum(np.maximum(np.abs(mu), sd_in), 1e-12)
    pts = np.repeat(mu[None, :], 2 * k + 1, axis=0)
    for i in range(k):
        pts[2 * i + 1, i] += h[i]
        pts[2 * i + 2, i] -= h[i]
    with np.errstate(all="ignore"):
        y = np.asarray(job.pipeline(**{n: pts[:, i].copy() for i, n in enumerate(names)}), dtype=float)
    if y.shape != (2 * k + 1,):
        return None
    grad = np.array([(y[2 * i + 1] - y[2 * i + 2]) / (2 * h[i]) for i in range(k)])
    var = float(grad @ cov @ grad)
    return Linearized(float(y[0]), math.sqrt(var) if var >= 0 else math.nan,
                      {n: float(g) for n, g in zip(names, grad)}, {n: float(m) for n, m in zip(names, mu)})
