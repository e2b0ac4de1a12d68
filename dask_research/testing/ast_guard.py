"""A guard for a CPython bug that fails ``ast.parse`` at random in threaded programs.

On CPython 3.11 before 3.11.8 (and 3.12 before 3.12.2), ``ast.parse`` keeps the depth of the
AST it is building in one per-interpreter counter (python/cpython#106905, fixed by #113035).
When a garbage collection runs in the middle of a parse and a finalizer parses too, which
Python 3.11's traceback formatting does to place its ``^^^`` marks (an asyncio task logging
"exception was never retrieved", say), or when another thread's parse interleaves, the
counter comes back wrong and the outer parse raises ``SystemError: AST constructor recursion
depth mismatch``. The source is fine. In this test suite the parses are pytest's assertion
rewriting, ``inspect.getsource`` under Hypothesis and doctest, and the finalizers of a Dask
client's tasks. One CI run failed a stateful test this way.

:func:`install` (the root ``conftest.py`` calls it) wraps ``ast.parse`` so that it parses once
more, with the garbage collector paused, when it meets that error. The retry has no
finalizer and no thread switch in the middle: the AST is built in C, and with the collector
paused no Python code runs during the build. On a CPython without the bug, :func:`install`
does nothing.

Examples
--------
>>> import ast
>>> guarded = guard(ast.parse)
>>> type(guarded("x + 1")).__name__, guarded.__wrapped__ is ast.parse
('Module', True)
>>> affected((3, 11, 7)), affected((3, 11, 8)), affected((3, 12, 1)), affected((3, 13, 0))
(True, False, True, False)
"""
from __future__ import annotations

import ast
import functools
import gc
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["MESSAGE", "affected", "guard", "install"]

#: The start of the error the bug raises.
MESSAGE = "AST constructor recursion depth mismatch"


def affected(version: tuple[int, ...] = tuple(sys.version_info[:3])) -> bool:
    """Whether the CPython ``version`` has the bug: 3.11.0-3.11.7 and 3.12.0-3.12.1."""
    return (3, 11) <= version < (3, 11, 8) or (3, 12) <= version < (3, 12, 2)


def guard(parse: Callable[..., Any]) -> Callable[..., Any]:
    """``parse`` (``ast.parse``), parsing once more with the collector paused after the bug's
    ``SystemError``; any other error, and a second failure, are raised as they are."""
    @functools.wraps(parse)
    def parse_guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            return parse(*args, **kwargs)
        except SystemError as error:
            if not str(error).startswith(MESSAGE):
                raise
        collecting = gc.isenabled()
        gc.disable()
        try:
            return parse(*args, **kwargs)
        finally:
            if collecting:
                gc.enable()

    return parse_guarded


def install() -> None:
    """Guard ``ast.parse`` where this CPython has the bug; nothing otherwise, and nothing twice."""
    if affected() and not hasattr(ast.parse, "__wrapped__"):
        ast.parse = guard(ast.parse)
