"""A deterministic research loop run in a subprocess that the tests kill with SIGKILL.

Importable by the tests and by the script they write to ``tmp_path``. Rewards depend only on
the hypothesis id, so an interrupted-and-resumed run can be compared with an uninterrupted one.
"""
import asyncio
import hashlib
import os

from dask_research.experiments import (
    Hypothesis,
    IterationScheduler,
    Result,
    make_followup_expander,
)

BRANCHES = {"attention": 0.55, "recurrence": 0.35, "convolution": 0.45, "mlp": 0.1}


def reward(h: Hypothesis) -> float:
    """A fixed reward per hypothesis id around its branch's level."""
    jitter = int(hashlib.sha1(h.id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return round(min(1.0, max(0.0, BRANCHES[h.branch] + 0.4 * (jitter - 0.5))), 6)


class LoggingRunner:
    """Sleeps ``delay`` seconds, appends the id to ``log`` (one line), returns the reward."""

    def __init__(self, log: str | None, delay: float):
        self.log = log
        self.delay = delay
        self.calls: list[str] = []

    async def __call__(self, h: Hypothesis) -> Result:
        self.calls.append(h.id)
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.log:
            with open(self.log, "a") as f:
                f.write(h.id + "\n")
                f.flush()
                os.fsync(f.fileno())
        return Result(h, reward(h), {"seed": len(h.id)})


EXPANDER = make_followup_expander(threshold=0.6, fanout=2, max_generation=1)


def hypotheses(per_branch: int = 10) -> list[Hypothesis]:
    return [Hypothesis(f"{b}-{k}", b, {"k": k}) for k in range(per_branch) for b in BRANCHES]


def scheduler(runner, checkpoint=None, slots: int = 1, prune: bool = True, **kw):
    sched = IterationScheduler(runner, slots=slots, c=0.5, progress=False,
                               prune_floor=0.2 if prune else 0.0, paper_threshold=0.62,
                               expander=EXPANDER, checkpoint=checkpoint, **kw)
    sched.add(hypotheses())
    return sched
