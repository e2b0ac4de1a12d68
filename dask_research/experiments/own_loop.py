"""Running a coroutine to its end from synchronous code, wherever that code is called from.

Where no event loop runs in this thread, ``asyncio.run``. Where one does (Jupyter, where
``asyncio.run`` refuses), the coroutine gets a loop of its own in a helper thread, and this
thread waits for it. A KeyboardInterrupt while it waits (Ctrl-C, "interrupt the kernel") cancels
the coroutine on its loop and is raised once the coroutine has wound down: an untimed
``Thread.join`` deferred it until the end, and a join that Ctrl-C interrupts marks the thread
stopped while it still runs (CPython 3.11), so the wait is on an Event, in timed steps that let a
signal's handler run. The one place :meth:`IterationScheduler.run` without a client and an
``async def`` paper writer in ask/tell run their coroutines.

>>> async def answer():
...     return 42
>>> run_to_end(answer, "doctest")
42
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

__all__ = ["run_to_end"]

T = TypeVar("T")


def run_to_end(make: Callable[[], Awaitable[T]], name: str) -> T:
    """``await make()`` to its end, here and now (see the module docstring); ``name``: the helper thread's."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_awaited(make))
    box: dict[str, Any] = {}
    guard = threading.Lock()
    done = threading.Event()

    async def main() -> T:
        with guard:
            if box.get("interrupted"):
                raise asyncio.CancelledError
            box["task"], box["loop"] = asyncio.current_task(), asyncio.get_running_loop()
        return await make()

    def target() -> None:
        try:
            box["out"] = asyncio.run(main())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=target, name=name, daemon=True).start()
    try:
        while not done.wait(0.25):
            pass
    except KeyboardInterrupt:
        with guard:
            box["interrupted"] = True
            task, loop = box.get("task"), box.get("loop")
        if task is not None and loop is not None:
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:        # its loop is closed: the coroutine has ended anyway
                pass
        while not done.wait(0.25):      # it winds down (a run: experiments cancelled, journal closed)
            pass
        raise
    if "error" in box:
        raise box["error"]
    return box["out"]


async def _awaited(make: Callable[[], Awaitable[T]]) -> T:
    return await make()
