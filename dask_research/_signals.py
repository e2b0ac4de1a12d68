"""SIGTERM as Ctrl-C while a command's work is ours to clean up: the one place that does it.

A batch system ending a job, or ``kill PID``, sends SIGTERM, whose default action ends the process
at once: a run's store lease would stay behind for the next run to take over, and a SLURM
cluster's pending jobs would start later with no scheduler. Inside :func:`terminate_as_interrupt`
SIGTERM raises :class:`KeyboardInterrupt` instead, so the ``finally`` blocks and the command's
own Ctrl-C handling run.

>>> import os, signal
>>> with terminate_as_interrupt():
...     try:
...         os.kill(os.getpid(), signal.SIGTERM)
...         signal.pause() if hasattr(signal, "pause") else None
...     except KeyboardInterrupt as e:
...         print(e)
signal 15
>>> signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
True
"""
from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

__all__ = ["terminate_as_interrupt", "interrupt_exit_code"]


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def interrupt_exit_code(exc: BaseException) -> int:
    """The shell's exit status of a command ended by ``exc``: 128 + the signal (130 for Ctrl-C,
    143 for SIGTERM raised as :func:`terminate_as_interrupt` raises it), so that a script can
    tell an interrupted command from a failed one (1).

    >>> interrupt_exit_code(KeyboardInterrupt()), interrupt_exit_code(KeyboardInterrupt("signal 15"))
    (130, 143)
    """
    text = str(exc)
    if text.startswith("signal ") and text[7:].isdigit():
        return 128 + int(text[7:])
    return 128 + int(signal.SIGINT)


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """While the block runs, SIGTERM raises ``KeyboardInterrupt`` in the main thread.

    Only where SIGTERM has its default action and only in the main thread: a program that
    embeds us and handles SIGTERM itself keeps its handler, and nested uses are one (the inner
    one sees the outer one's handler and changes nothing). The default is restored on exit.
    """
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
