"""dask-research: research workflows on Dask.

Three capabilities on one engine (Dask distributed), one configuration namespace
(``research.*`` in ``dask.config``) and one event vocabulary:

- :mod:`dask_research.montecarlo`: sharded, verified, replayable Monte-Carlo.
- :mod:`dask_research.experiments`: a UCB iteration scheduler for research loops.
- :mod:`dask_research.replay`: an experience data plane for distributed RL.

Subpackages are imported on first use, so ``import dask_research`` stays light.

Examples
--------
>>> import dask_research
>>> from dask_research import montecarlo as mc
>>> mc.Normal(1.0, 0.1)
Normal(mu=1.0, sd=0.1)
"""
from __future__ import annotations

import importlib

from . import config  # noqa: F401  (first: loads research.yaml into dask.config)
from ._version import __version__
from .exceptions import ResearchError

_SUBPACKAGES = ("montecarlo", "experiments", "replay", "dashboard", "testing")

__all__ = ["__version__", "ResearchError", *_SUBPACKAGES]


def __getattr__(name: str):
    if name in _SUBPACKAGES:
        module = importlib.import_module(f".{name}", __name__)
        globals()[name] = module
        return module
    raise AttributeError(f"module 'dask_research' has no attribute {name!r}")
