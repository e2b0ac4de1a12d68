"""The scheduler's progress bar: counts the budget, ends at 100 %, and updates in notebooks.

The bar's total is ``max_experiments`` when the run has that budget (experiments a resumed run
already spent count as done), else the work known so far (done + in flight + queued, which
grows as the expander queues follow-ups). That total never moves backwards during the run:
queued hypotheses that will not run (a pruned branch's) stay in it, counted in the postfix
(``3 dropped from the queue``). When the run stops, for whatever reason, the total becomes what
was done, so the bar ends at 100 % and its postfix says why it stopped.

Which bar: in a Jupyter kernel with ``ipywidgets`` importable, tqdm's widget; everywhere else,
including a notebook without ``ipywidgets``, tqdm's plain text bar (``tqdm.auto`` would warn
"IProgress not found" there). Redraws are time-based (``miniters=1``, at most one every
0.1 s), never throttled by tqdm's adaptive ``miniters`` (which, after a fast start, skipped
every later redraw: the bars that froze at 12 % and 61 %), and there is no monitor thread.

Examples
--------
A run with a budget of 10 that stops early ends its bar at 100 % of what it did, saying why:

>>> import io
>>> out = io.StringIO()
>>> bar = ProgressBar(budget=10, done=0, queued=4, file=out)
>>> bar.update(done=3, in_flight=1, queued=0)
>>> bar.finish(done=4, reason="queue_empty")
>>> (bar.bar.n, bar.bar.total), "queue_empty" in out.getvalue()
((4, 4), True)

Without a budget, a pruned branch's queued hypotheses leave the total where it was and say so:

>>> bar = ProgressBar(budget=None, done=0, queued=18, file=out)
>>> bar.update(done=6, in_flight=3, queued=6)          # 3 queued hypotheses were pruned
>>> bar.bar.total, bar.bar.postfix
(18, '3 dropped from the queue')
>>> bar.update(done=8, in_flight=3, queued=10)         # the expander queued 8 more
>>> bar.bar.total, bar.bar.postfix
(24, '3 dropped from the queue')
"""
from __future__ import annotations

from typing import Any

from ..progress import bar_class, make_bar

__all__ = ["bar_class", "ProgressBar"]


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
        self.budget = budget
        self.dropped = 0              # queued work that left the queue without running
        total = budget if budget is not None else done + queued
        self.bar = make_bar(total=max(total, done), initial=done, desc="experiments", unit="exp",
                            leave=True, **kw)

    def update(self, done: int, in_flight: int, queued: int) -> None:
        """Show ``done`` outcomes (redrawn at most every 0.1 s)."""
        bar = self.bar
        if self.budget is None:
            known = done + in_flight + queued + self.dropped
            if known < bar.total:                 # left the queue unrun: keep it, say so
                self.dropped += bar.total - known
                bar.set_postfix_str(f"{self.dropped} dropped from the queue", refresh=False)
            bar.total = done + in_flight + queued + self.dropped
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
