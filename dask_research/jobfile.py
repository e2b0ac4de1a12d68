"""Load the object a ``MODULE:NAME`` reference names: the command line's job files.

``MODULE`` is a dotted module name or the path of a ``.py`` file. A file runs as a private
module that is not left in ``sys.modules`` (nor are the modules next to it that it imports), so
Dask ships its functions to workers by value: the workers need not see the file. Every bad
reference is one :class:`click.BadParameter` line.

Examples
--------
>>> load_object("dask_research.demo:quick_job").__name__
'quick_job'
>>> load_object("dask_research.demo:nope")
Traceback (most recent call last):
    ...
click.exceptions.BadParameter: 'dask_research.demo' has no attribute 'nope'; it has [...]
>>> load_job("dask_research.demo:quick_job").shards          # a function marked @job_factory is called
64
>>> one_line(ValueError("first line\\nsecond line"))
'ValueError: first line'
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import io
import os
import signal
import sys
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import click

from .exceptions import ConfigError

__all__ = ["load_object", "load_job", "one_line", "describe_object"]


def _sibling_modules(directory: str, before: set[str]) -> list[str]:
    """Modules imported since ``before`` from next to a job file (found through ``directory``).

    A module counts if its top-level package was new and lies directly in ``directory``
    (``directory/name.py``, ``directory/name/``): libraries imported by the job file, a
    virtual environment inside the project, or submodules of a package imported before
    (``dask_research`` itself, when the job file sits at the root of a checkout) do not.
    """
    def top_is_here(top: str) -> bool:
        mod = sys.modules.get(top)
        if mod is None:
            return False
        file = getattr(mod, "__file__", None)
        places = [os.path.dirname(file)] if file else []
        if hasattr(mod, "__path__"):            # a package: where its folder is
            places = [os.path.dirname(os.path.abspath(p)) for p in mod.__path__]
        return any(os.path.abspath(p) == directory for p in places)

    new = [n for n in list(sys.modules) if n not in before]
    tops = {n.partition(".")[0] for n in new}
    local = {t for t in tops if t not in before and top_is_here(t)}
    return [n for n in new if n.partition(".")[0] in local]


def _exec_job_file(path: str):
    """Execute the file ``path`` as a module that Dask ships to workers by value.

    The module runs with its directory first on ``sys.path`` (as ``python FILE`` would), so it
    may import modules next to it. Afterwards it and those sibling modules are taken out of
    ``sys.modules`` and the directory out of ``sys.path``: for pickle and cloudpickle they are
    then dynamic modules, so the pipeline, the helpers in the file and the sibling modules'
    functions travel by value to workers that do not have the files (plain pickle cannot find
    them and Dask falls back to cloudpickle, which pickles code of unimported modules by value;
    ``cloudpickle.register_pickle_by_value`` alone is not enough, because Dask consults it only
    for the outermost object it pickles). The content address is unaffected: it hashes the
    code, not the module name.
    """
    directory = os.path.dirname(os.path.abspath(path))
    mod_name = f"_dask_research_user_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise click.BadParameter(f"{path!r} is not a Python file (expected a .py file)")
    module = importlib.util.module_from_spec(spec)
    before = set(sys.modules)
    sys.modules[mod_name] = module          # dataclasses and friends look the module up while it runs
    sys.path.insert(0, directory)
    write_bytecode, sys.dont_write_bytecode = sys.dont_write_bytecode, True   # as `python FILE`: no __pycache__
    try:
        with _bounded_import(path):
            spec.loader.exec_module(module)
    except SyntaxError as e:
        where = f"{e.filename or path}, line {e.lineno}" if e.lineno else path
        raise click.BadParameter(f"{where}: syntax error: {e.msg}") from None
    except (click.BadParameter, ConfigError):
        raise
    except Exception as e:
        raise click.BadParameter(f"loading {path} failed: {one_line(e)}") from e
    finally:
        sys.dont_write_bytecode = write_bytecode
        try:
            sys.path.remove(directory)
        except ValueError:
            pass
        for name in _sibling_modules(directory, before):
            sys.modules.pop(name, None)
        sys.modules.pop(mod_name, None)
    return module


class _ImportTimedOut(BaseException):
    """Raised in the main thread when a job file's import outlives ``research.cli.import-timeout``
    (a BaseException, so the file's own ``except Exception`` cannot swallow it)."""


def _import_timeout() -> float:
    """``research.cli.import-timeout`` in seconds (``None``/0: unbounded)."""
    from . import config

    value = config.resolve("cli.import-timeout", default=None)
    return config_seconds("cli.import-timeout", value) if value else 0.0


def config_seconds(key: str, value: Any) -> float:
    """``research.<key>``, a duration such as "60s" or seconds, in seconds; a malformed or negative
    one is a :class:`~dask_research.exceptions.ConfigError` naming the key (before, "abc" was
    Dask's KeyError listing every time unit, blamed on the job file).

    >>> config_seconds("cli.import-timeout", "1m")
    60.0
    """
    import dask.utils

    try:
        seconds = float(dask.utils.parse_timedelta(value, default="s"))
    except (TypeError, ValueError, KeyError):
        seconds = -1.0
    if not seconds >= 0:
        raise ConfigError(key, value, 'a duration such as "60s", or seconds >= 0')
    return seconds


@contextlib.contextmanager
def _bounded_import(what: str) -> Iterator[None]:
    """Import a job file or module as ``python FILE`` would, bounded, with one line for what goes wrong.

    While it runs, ``sys.argv`` is ``[what]`` (a file that parses the command line at import
    sees none of the CLI's arguments) and what it writes to ``sys.stderr`` is held back: a
    ``sys.exit`` at import (another program's usage) becomes one :class:`click.BadParameter`
    line, otherwise the text is passed on. In the main thread the import is bounded by
    ``research.cli.import-timeout`` (a file that loops forever at import is named, not waited on).
    """
    seconds = _import_timeout()
    bounded = seconds > 0 and threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")

    def expire(signum, frame):
        raise _ImportTimedOut()

    timed_out = (f"importing {what} did not finish within {seconds:g} s (research.cli.import-timeout): does it "
                 "run work or loop at import? Keep that under `if __name__ == \"__main__\":`")
    argv, sys.argv = sys.argv, [what]
    held = io.StringIO()
    ctx = click.get_current_context(silent=True)     # None: called from Python, not the command line
    previous = signal.signal(signal.SIGALRM, expire) if bounded else None
    watchdog = None
    if bounded:
        signal.setitimer(signal.ITIMER_REAL, seconds)
        if ctx is not None:         # the command line: a file that swallows the alarm is not waited on either
            watchdog = threading.Timer(seconds + _IMPORT_GRACE, _give_up, (timed_out, ctx))
            watchdog.daemon = True
            watchdog.start()
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(contextlib.redirect_stderr(held))
            if ctx is not None:
                # What a job file prints at import is a diagnostic, never the command's output
                # (it would corrupt --json): it goes to stderr with the rest. os._exit, which
                # would end the command silently with the file's status, is an error here.
                stack.enter_context(contextlib.redirect_stdout(held))
                stack.enter_context(_no_os_exit())
            yield
    except _ExitAtImport as e:
        raise click.BadParameter(
            f"importing {what} called os._exit({e.status!r}): a job file must not end the process when "
            "imported (keep that under `if __name__ == \"__main__\":`)") from None
    except SystemExit as e:
        first = next((line for line in held.getvalue().splitlines() if line.strip()), "")
        shown = f" after printing {first.strip()[:80]!r}" if first else ""
        raise click.BadParameter(
            f"importing {what} called sys.exit({e.code!r}){shown}: a job file must not parse the command "
            "line or exit when imported (keep that under `if __name__ == \"__main__\":`)") from e
    except _ImportTimedOut:
        raise click.BadParameter(timed_out) from None
    else:
        sys.stderr.write(held.getvalue())
    finally:
        if watchdog is not None:
            watchdog.cancel()
        if bounded:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        sys.argv = argv


#: Seconds past ``research.cli.import-timeout`` after which the command line stops a job file
#: that caught the timeout (``except BaseException``, a bare ``except:``) or replaced SIGALRM's handler.
_IMPORT_GRACE = 2.0


class _ExitAtImport(BaseException):
    """``os._exit(status)`` called by a job file while the command line imports it."""

    def __init__(self, status: Any):
        super().__init__(status)
        self.status = status


_os_exit = os._exit     # the real one, for this module's own exit while a job file is imported


@contextlib.contextmanager
def _no_os_exit() -> Iterator[None]:
    pid = os.getpid()

    def refuse(status: Any) -> None:
        if os.getpid() == pid and threading.current_thread() is threading.main_thread():
            raise _ExitAtImport(status)
        _os_exit(status)          # a forked child's or another thread's exit: unchanged

    os._exit = refuse             # type: ignore[assignment]
    try:
        yield
    finally:
        os._exit = _os_exit


def _give_up(message: str, ctx: click.Context) -> None:
    """The usage line for an import that outlived the timeout and its grace, then exit 2 at once:
    the main thread is inside the job file's code, which will not let go."""
    error = click.BadParameter(message, ctx=ctx, param_hint="MODULE:JOB")
    stream = sys.__stderr__
    if stream is not None:
        stream.write(f"Error: {error.format_message()} (see '{ctx.command_path} --help')\n")
        stream.flush()
    _os_exit(2)


def load_object(ref: str) -> Any:
    """Load ``MODULE:NAME`` where MODULE is a dotted module name or a path to a ``.py`` file.

    A file is executed as a private module that is not left in ``sys.modules``, so Dask ships
    its functions (and those of modules next to it that it imports) to workers by value; see
    :func:`_exec_job_file`. Bad references raise :class:`click.BadParameter` with one line.
    """
    if not isinstance(ref, str) or ":" not in ref:
        raise click.BadParameter(f"{ref!r} is not MODULE:NAME (e.g. examples/saturating_pipeline.py:job)")
    mod_ref, _, name = ref.rpartition(":")
    if not name.isidentifier():
        raise click.BadParameter(f"{name!r} in {ref!r} is not a Python name (expected MODULE:NAME)")
    if mod_ref.endswith(".py") or os.sep in mod_ref or (os.altsep and os.altsep in mod_ref):
        if not os.path.exists(mod_ref):
            raise click.BadParameter(f"file {mod_ref!r} does not exist")
        if not os.path.isfile(mod_ref) or not mod_ref.endswith(".py"):
            raise click.BadParameter(f"{mod_ref!r} is not a Python file (expected a .py file or a module name)")
        module = _exec_job_file(mod_ref)
    else:
        if not all(part.isidentifier() for part in mod_ref.split(".")):
            raise click.BadParameter(f"{mod_ref!r} is not a module name or a .py file")
        try:
            with _bounded_import(mod_ref):
                module = importlib.import_module(mod_ref)
        except ImportError as e:
            raise click.BadParameter(f"cannot import module {mod_ref!r}: {e}") from None
        except SyntaxError as e:
            raise click.BadParameter(f"{e.filename}, line {e.lineno}: syntax error: {e.msg}") from None
        except (click.BadParameter, ConfigError):
            raise
        except Exception as e:
            raise click.BadParameter(f"importing {mod_ref} failed: {one_line(e)}") from e
    try:
        obj = getattr(module, name)
    except AttributeError:
        raise click.BadParameter(missing_name(module, mod_ref, name)) from None
    return obj


def missing_name(module: Any, mod_ref: str, name: str) -> str:
    """The line for a ``MODULE:NAME`` whose module has no ``name``: the closest name, and what it has.

    The modules it imported (``np``, ``mc``) are not among the names it offers.

    >>> import types
    >>> m = types.ModuleType("myjob")
    >>> m.job, m.f, m.np, m._private = object(), print, types, 1
    >>> missing_name(m, "myjob.py", "jobb")
    "'myjob.py' has no attribute 'jobb' (did you mean 'job'?); it has ['f', 'job']"
    """
    import difflib

    public = sorted(k for k, v in vars(module).items() if not k.startswith("_") and not inspect.ismodule(v))
    close = difflib.get_close_matches(name, public, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{mod_ref!r} has no attribute {name!r}{hint}; it has {public}"


def one_line(e: BaseException) -> str:
    """``Type: message`` on one line (the first line of the message)."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def describe_object(obj: Any) -> str:
    """What ``obj`` is, in a few words, for a refusal.

    >>> def saturating(a, b, *, c=1): ...
    >>> describe_object(saturating)
    'a function saturating(a, b, *, c=1)'
    >>> describe_object(3)
    'an int'
    """
    if inspect.isclass(obj):
        return f"a class {obj.__qualname__}"
    if inspect.isfunction(obj) or inspect.ismethod(obj):
        try:
            sig = str(inspect.signature(obj))
        except (TypeError, ValueError):
            sig = "(...)"
        return f"a function {obj.__qualname__}{sig}"
    if inspect.ismodule(obj):
        return f"a module {obj.__name__}"
    name = type(obj).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def load_job(ref: str):
    """The :class:`~dask_research.montecarlo.Job` that ``MODULE:NAME`` names.

    NAME must be a ``Job`` or a zero-argument function marked with
    :func:`~dask_research.montecarlo.job.job_factory` (which is then called). Anything else is
    refused with one line saying what it is, *before* anything runs: ``FILE:main`` (a program's
    entry point) is never called, nor is the pipeline itself.

    >>> load_job("dask_research.demo:quick_job").shards          # a marked factory is called
    64
    >>> load_job("dask_research.demo:saturating")
    Traceback (most recent call last):
        ...
    click.exceptions.BadParameter: dask_research.demo:saturating is a function saturating(a, b, c, d, e, f, g), ...
    """
    from .montecarlo import Job
    from .montecarlo.job import is_job_factory

    try:
        obj = load_object(ref)
    except click.BadParameter as e:
        if e.param is None and e.param_hint is None:
            e.param_hint = "MODULE:JOB"
        raise
    if isinstance(obj, Job):
        return obj
    if not is_job_factory(obj):
        hint = ("name the Job object (e.g. FILE:job, where job = Job(pipeline, inputs, ...)) or mark a "
                "zero-argument function that returns one with @dask_research.montecarlo.job.job_factory")
        raise click.BadParameter(f"{ref} is {describe_object(obj)}, not a dask_research.montecarlo.Job; {hint}",
                                 param_hint="MODULE:JOB")
    try:
        obj = obj()
    except (Exception, SystemExit) as e:
        raise click.BadParameter(f"{ref}() failed: {one_line(e)}", param_hint="MODULE:JOB") from e
    if not isinstance(obj, Job):
        raise click.BadParameter(f"{ref}() returned {describe_object(obj)}, not a dask_research.montecarlo.Job",
                                 param_hint="MODULE:JOB")
    return obj
