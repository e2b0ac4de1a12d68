"""Load dask-research defaults into ``dask.config`` under the ``research`` namespace.

Every keyword argument in the public API defaults to ``None`` and is read from here at call
time, so ``dask.config.set({"research.montecarlo.verify": 0})`` or a YAML file in
``~/.config/dask/`` changes behaviour without touching code.

Examples
--------
>>> import dask
>>> from dask_research.config import get
>>> get("montecarlo.bins", None)
256
>>> with dask.config.set({"research.montecarlo.bins": 64}):
...     get("montecarlo.bins", None)
64
>>> get("montecarlo.bins", 32)   # an explicit argument wins
32
"""
from __future__ import annotations

import os
from typing import Any

import dask
import yaml

fn = os.path.join(os.path.dirname(__file__), "research.yaml")
schema_fn = os.path.join(os.path.dirname(__file__), "research-schema.yaml")

with open(fn) as f:
    defaults = yaml.safe_load(f)

dask.config.update_defaults(defaults)

_MISSING = object()


def get(key: str, value: Any = None, default: Any = _MISSING) -> Any:
    """Return ``value`` unless it is ``None``, else ``research.<key>`` from ``dask.config``."""
    if value is not None:
        return value
    if "research" not in dask.config.config:
        # Something replaced dask.config wholesale (e.g. a test harness restoring a snapshot
        # taken before we were imported): put our defaults back.
        dask.config.update_defaults(defaults)
    if default is _MISSING:
        return dask.config.get(f"research.{key}")
    return dask.config.get(f"research.{key}", default=default)
