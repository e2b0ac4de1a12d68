"""Progress bars that update wherever the user is: a terminal, a log, or a Jupyter notebook.

In a Jupyter kernel with ``ipywidgets`` importable, tqdm's widget; everywhere else, including
a notebook without ``ipywidgets``, tqdm's plain text bar (``tqdm.auto`` would warn "IProgress not
found" there and draw nothing useful). Bars redraw on time (``miniters=1``, at most every 0.1 s),
never throttled by tqdm's adaptive ``miniters``, and run no monitor thread.

Examples
--------
>>> import io
>>> from dask_research.progress import make_bar
>>> bar = make_bar(total=3, desc="work", unit="step", file=io.StringIO())
>>> _ = bar.update(3); bar.n
3
>>> bar.close()
"""
from __future__ import annotations

import importlib.util
import sys
from typing import Any

__all__ = ["bar_class", "make_bar"]


def _in_kernel() -> bool:
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()
        return shell is not None and "IPKernelApp" in shell.config
    except Exception:  # noqa: BLE001 - an odd IPython: treat as a terminal
        return False


def bar_class() -> type:
    """``tqdm.notebook.tqdm`` in a Jupyter kernel with ipywidgets, else ``tqdm.std.tqdm``."""
    if _in_kernel() and importlib.util.find_spec("ipywidgets") is not None:
        from tqdm.notebook import tqdm as notebook_tqdm

        return notebook_tqdm
    from tqdm.std import tqdm as text_tqdm

    return text_tqdm


_QUIET: dict[type, type] = {}


def make_bar(**kw: Any) -> Any:
    """A bar of :func:`bar_class` with time-based redraws and no monitor thread.

    tqdm starts its monitor thread in ``__init__`` unless the *class* says
    ``monitor_interval = 0``, so the bar is made from a subclass that says so.
    """
    kw.setdefault("miniters", 1)
    kw.setdefault("mininterval", 0.1)
    base = bar_class()
    cls = _QUIET.get(base)
    if cls is None:
        cls = _QUIET[base] = type(base.__name__, (base,), {"monitor_interval": 0})
    return cls(**kw)
