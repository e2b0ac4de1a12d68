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


def journal_cuts(path) -> list[bytes]:
    """Every way a crash can leave the journal at ``path``: cut after each line, and cut in
    the middle of every seventh line."""
    with open(path, "rb") as f:
        lines = f.read().splitlines(keepends=True)
    cuts = [b"".join(lines[:n]) for n in range(1, len(lines))]
    cuts += [b"".join(lines[:n]) + lines[n][:len(lines[n]) // 2] for n in range(1, len(lines), 7)]
    return cuts


def run_and_kill(script, journal: str, results: int = 12, timeout: float = 60) -> None:
    """Run ``script`` (a driver) in a subprocess and SIGKILL it once ``journal`` holds
    ``results`` results; the driver must still be running then."""
    import signal
    import subprocess
    import sys

    from dask_research.testing.processes import wait_for

    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: os.path.exists(journal) and open(journal).read().count('"kind": "result"') >= results
                 or proc.poll() is not None, timeout, f"{results} results in the journal")
        assert proc.poll() is None, proc.stderr.read()
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(30)


def resume_killed(journal: str, log: str, **kw):
    """Resume the run a test killed (its journal lock names a dead process: one warning)."""
    import pytest

    from dask_research.experiments.lock import JournalLockWarning

    with pytest.warns(JournalLockWarning, match=r"its process, pid \d+ on this host, is gone"):
        return IterationScheduler.resume(journal, LoggingRunner(log, 0.0), expander=EXPANDER,
                                         progress=False, **kw)


def run_twice(report, log: str, **kw) -> set[str]:
    """Check that a resumed run made the uninterrupted run's decisions (``kw``: that run's
    settings) and that every hypothesis it counted ran; the ids that ran more than once."""
    from exp_scenarios import summary
    from test_checkpoint_resume import _stats

    whole = scheduler(LoggingRunner(None, 0.0), **kw).run()
    assert summary(report) == summary(whole) and _stats(report) == _stats(whole)
    with open(log) as f:
        done = f.read().split()
    assert sorted(set(done)) == sorted(r.hypothesis.id for r in report.results)
    return {h for h in done if done.count(h) > 1}
