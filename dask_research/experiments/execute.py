"""Run one experiment safely: call the runner, time it, turn whatever it returns into a Result.

A runner is ``Hypothesis -> Result``, sync or ``async def``. It may also return a bare number
(the reward) or a ``(reward, metrics)`` pair; both are wrapped into a :class:`Result`. Nothing
here raises: an exception in the runner, a non-finite reward, a reward outside [0, 1] when
rewards are bounded, or a Result for another hypothesis all become a failed result
(``Result.error``), which the scheduler records and counts against the branch.

Examples
--------
>>> from dask_research.experiments import Hypothesis
>>> from dask_research.experiments.execute import execute_sync
>>> execute_sync(lambda h: 0.25, Hypothesis("h1", "a"), bounded=True).reward
0.25
>>> bad = execute_sync(lambda h: 1.5, Hypothesis("h1", "a"), bounded=True)
>>> print(bad.error)  # doctest: +ELLIPSIS
ExperimentError: runner returned reward=1.5 for 'h1'; bounded rewards must lie in [0, 1] ...
"""
from __future__ import annotations

import asyncio
import dataclasses
import inspect
import math
import numbers
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from .timeouts import AbandonablePool
from .types import ExperimentResult, Hypothesis

__all__ = ["coerce_result", "execute_async", "execute_sync", "is_async_callable"]


def is_async_callable(fn: Callable[..., Any]) -> bool:
    """``async def`` functions, partials of them and objects with an ``async def __call__``."""
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - its __call__ method is inspected
    return call is not None and inspect.iscoroutinefunction(call)


def _problem(hyp: Hypothesis, text: str, duration: float) -> ExperimentResult:
    return ExperimentResult.failure(hyp, f"ExperimentError: {text}", duration)


def _vector(reward: Any, hyp: Hypothesis, objectives: tuple[str, ...], bounded: bool,
            duration: float) -> tuple[float, ...] | ExperimentResult:
    names = ", ".join(objectives)
    if isinstance(reward, dict):
        if set(reward) != set(objectives):
            return _problem(hyp, f"runner returned reward keys {sorted(reward)} for {hyp.id!r}; "
                            f"expected exactly the objectives {names}", duration)
        values = [reward[o] for o in objectives]
    elif isinstance(reward, (list, tuple)) or hasattr(reward, "__array__"):
        values = list(reward.tolist() if hasattr(reward, "tolist") else reward)
    else:
        return _problem(hyp, f"runner returned reward={reward!r:.80} for {hyp.id!r}; expected "
                        f"a vector of {len(objectives)} numbers ({names}) or a dict of them",
                        duration)
    if len(values) != len(objectives) or not all(
            isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
            for v in values):
        return _problem(hyp, f"runner returned reward={values!r:.80} for {hyp.id!r}; expected "
                        f"{len(objectives)} finite numbers ({names})", duration)
    if bounded and not all(0.0 <= v <= 1.0 for v in values):
        return _problem(hyp, f"runner returned reward={values!r} for {hyp.id!r}; bounded "
                        "rewards must lie in [0, 1] (pass bounded=False for other scales)",
                        duration)
    return tuple(float(v) for v in values)


def coerce_result(out: Any, hyp: Hypothesis, duration: float, bounded: bool,
                  objectives: tuple[str, ...] | None = None) -> ExperimentResult:
    """Turn a runner's return value into a checked :class:`Result` (failed if unusable).

    With ``objectives`` the reward must be a vector of that length (or a dict keyed by them);
    it comes back as a tuple of floats in objective order.
    """
    if objectives:
        if isinstance(out, ExperimentResult):
            if out.hypothesis.id != hyp.id or out.hypothesis.branch != hyp.branch:
                return coerce_result(out, hyp, duration, bounded)   # the same complaint
            if out.error is not None:
                return out.with_duration(duration)
            reward, metrics = out.reward, out.metrics
        elif isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict) and not (
                isinstance(out[1], dict) and set(out[1]) == set(objectives)):
            reward, metrics = out
        else:
            reward, metrics = out, {}
        vec = _vector(reward, hyp, objectives, bounded, duration)
        if isinstance(vec, ExperimentResult):
            return vec
        if isinstance(out, ExperimentResult):
            return dataclasses.replace(out, reward=vec).with_duration(duration)
        return ExperimentResult(hyp, vec, dict(metrics), duration)
    if isinstance(out, ExperimentResult):
        if out.hypothesis.id != hyp.id or out.hypothesis.branch != hyp.branch:
            return _problem(
                hyp,
                f"runner returned a Result for hypothesis {out.hypothesis.id!r} on branch "
                f"{out.hypothesis.branch!r} while running {hyp.id!r} on branch {hyp.branch!r}; "
                "return Result(hypothesis, ...) with the hypothesis it was given",
                duration,
            )
        if out.error is not None:
            return out.with_duration(duration)
        result = out.with_duration(duration)
    elif isinstance(out, numbers.Real) and not isinstance(out, bool):
        result = ExperimentResult(hyp, float(out), {}, duration)
    elif (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], numbers.Real)
          and isinstance(out[1], dict)):
        result = ExperimentResult(hyp, float(out[0]), dict(out[1]), duration)
    else:
        return _problem(
            hyp,
            f"runner returned {type(out).__name__} {out!r:.80} for {hyp.id!r}; expected a "
            "Result, a number (the reward) or a (reward, metrics-dict) pair",
            duration,
        )
    reward = result.reward
    if (not isinstance(reward, numbers.Real) or isinstance(reward, bool)
            or not math.isfinite(reward)):
        return _problem(hyp, f"runner returned reward={reward!r} for {hyp.id!r}; expected a "
                        "finite number", duration)
    if bounded and not 0.0 <= float(reward) <= 1.0:
        return _problem(hyp, f"runner returned reward={reward!r} for {hyp.id!r}; bounded "
                        "rewards must lie in [0, 1] (pass bounded=False for other scales)",
                        duration)
    return result


async def execute_async(
    runner: Callable[[Hypothesis], Any],
    hyp: Hypothesis,
    bounded: bool,
    executor: Executor | AbandonablePool | None = None,
    is_async: bool | None = None,
    objectives: tuple[str, ...] | None = None,
) -> ExperimentResult:
    """Run ``runner(hyp)`` on the current event loop (sync runners in ``executor``).

    Cancelling the coroutine cancels an ``async def`` runner; a sync runner already running
    in an :class:`~.timeouts.AbandonablePool` is abandoned there (its thread goes on).
    """
    t0 = time.perf_counter()
    if is_async is None:
        is_async = is_async_callable(runner)
    try:
        if is_async:
            out = await runner(hyp)
        else:
            if isinstance(executor, AbandonablePool):
                cfut = executor.submit(runner, hyp)
                try:
                    out = await asyncio.wrap_future(cfut)
                except asyncio.CancelledError:
                    executor.abandon(cfut)       # a thread cannot be killed: give it up
                    raise
            else:
                out = await asyncio.get_running_loop().run_in_executor(executor, runner, hyp)
            if inspect.isawaitable(out):
                out = await out
    except Exception as exc:  # noqa: BLE001 - a failing experiment must not kill the loop
        return ExperimentResult.failure(hyp, exc, time.perf_counter() - t0)
    return coerce_result(out, hyp, time.perf_counter() - t0, bounded, objectives)


async def _await(aw: Any) -> Any:
    return await aw


class _ThreadLoop:
    """One event loop per worker thread for ``async def`` runners, closed with the thread.

    ``asyncio.run`` builds and tears down a loop per call (about 130 us here, holding the GIL
    that the worker's other threads need); a loop kept per thread costs about 10 us. Tasks a
    runner leaves behind are cancelled after each call, as ``asyncio.run`` would.
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def run(self, aw: Any) -> Any:
        loop = self.loop
        asyncio.set_event_loop(loop)
        try:
            return loop.run_until_complete(_await(aw))
        finally:
            leftover = asyncio.all_tasks(loop)
            if leftover:
                for task in leftover:
                    task.cancel()
                loop.run_until_complete(asyncio.gather(*leftover, return_exceptions=True))
            asyncio.set_event_loop(None)

    def __del__(self) -> None:
        if not self.loop.is_closed():
            self.loop.close()


_per_thread = threading.local()


def _run_coroutine(aw: Any) -> Any:
    holder = getattr(_per_thread, "holder", None)
    if holder is None:
        holder = _per_thread.holder = _ThreadLoop()
    return holder.run(aw)


def execute_sync(runner: Callable[[Hypothesis], Any], hyp: Hypothesis, bounded: bool,
                 objectives: tuple[str, ...] | None = None) -> ExperimentResult:
    """Run ``runner(hyp)`` in this thread (a Dask worker); coroutines get their own loop."""
    t0 = time.perf_counter()
    try:
        out = runner(hyp)
        if inspect.isawaitable(out):
            out = _run_coroutine(out)
    except Exception as exc:  # noqa: BLE001
        return ExperimentResult.failure(hyp, exc, time.perf_counter() - t0)
    return coerce_result(out, hyp, time.perf_counter() - t0, bounded, objectives)
