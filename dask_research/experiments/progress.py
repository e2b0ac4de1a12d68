"""The scheduler's progress bar: counts the budget, ends at 100 %, and updates in notebooks.

The bar's total is ``max_experiments`` when the run has that budget (experiments a resumed run
already spent count as done), else the work known so far (done + in flight + queued, which
grows as the expander queues follow-ups). When the run stops, for whatever reason, the total
becomes what was done, so the bar ends at 100 % and its postfix says why it stopped.

Which bar: in a Jupyter kernel with ``ipywidgets`` importable, tqdm's widget; everywhere else,
including a notebook without ``ipywidgets``, tqdm's plain text bar (``tqdm.auto`` would warn
"IProgress not found" there). Redraws are time-based (``miniters=1``, at most one every
0.1 s), never throttled by tqdm's adaptive ``miniters`` (which, after a fast start, skipped
every later redraw: the bars that froze at 12 % and 61 %), and there is no monitor thread.
"""
from __future__ import annotations

import importlib.util
import sys
from typing import Any

__all__ = ["bar_class", "ProgressBar"]


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


class ProgressBar:
    """One run's bar (see the module docstring).

    Parameters
    ----------
    budget : int, optional
        ``max_experiments``; the bar's total when given.
    done : int
        Outcomes already counted (restored from a checkpoint).
    queued : int
        Hypotheses waiting now (the total without a budget).
    """

    def __init__(self, budget: int | None, done: int, queued: int, **kw: Any):
        cls = bar_class()
        self.budget = budget
        total = budget if budget is not None else done + queued
        self.bar = cls(total=max(total, done), initial=done, desc="experiments", unit="exp",
                       miniters=1, mininterval=0.1, leave=True, **kw)
        try:
            self.bar.monitor_interval = 0
        except Exception:  # noqa: BLE001 - not every tqdm has it
            pass

    def update(self, done: int, in_flight: int, queued: int) -> None:
        """Show ``done`` outcomes (redrawn at most every 0.1 s)."""
        bar = self.bar
        if self.budget is None:
            bar.total = done + in_flight + queued
        elif done > bar.total:                    # re-dispatched work beyond the budget
            bar.total = done
        bar.update(done - bar.n)

    def finish(self, done: int, reason: str | None) -> None:
        """The run stopped: the bar ends at 100 % of what was done, with the reason."""
        bar = self.bar
        bar.total = done
        bar.n = done
        if reason:
            bar.set_postfix_str(reason, refresh=False)
        bar.refresh()
        bar.close()
