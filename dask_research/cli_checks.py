"""Checks of what a user types for the command line's Dask options, each a click usage error
(one line, exit 2) before anything starts: a scheduler address, and the options
``dask-research worker`` passes on to ``dask worker``.

Shared by :mod:`dask_research.cli` and :mod:`dask_research.montecarlo.power_cli`; it imports
neither, so a capability's command does not reach up into the command group.

>>> check_address("tcp://10.0.0.5:8786")
'tcp://10.0.0.5:8786'
>>> check_address("tcp//10.0.0.5:8786")
Traceback (most recent call last):
...
click.exceptions.BadParameter: 'tcp//10.0.0.5:8786' is not a scheduler address; expected PROTOCOL://HOST:PORT, e.g. tcp://10.0.0.5:8786
"""
from __future__ import annotations

import click

__all__ = ["check_address", "check_worker_arguments", "Whole"]


class Whole(click.IntRange):
    """A whole number of at least ``min``; ``--shard abc`` says "is not a whole number (>= 0)".

    (Click's own wording, "is not a valid integer range", names a type the user never typed.)

    >>> Whole(min=0).convert("7", None, None)
    7
    >>> Whole(min=1).convert("abc", None, None)
    Traceback (most recent call last):
    ...
    click.exceptions.BadParameter: 'abc' is not a whole number (expected one >= 1).
    """

    name = "integer"

    def convert(self, value, param, ctx):
        if isinstance(value, str):
            try:
                int(value.strip())
            except ValueError:
                self.fail(f"{value!r} is not a whole number (expected one >= {self.min}).", param, ctx)
        return super().convert(value, param, ctx)


def check_address(address: str) -> str:
    """``address`` if it is a scheduler address Dask can connect to; else a usage error."""
    from ._compat import address_host_port, comm_backend

    expected = "expected PROTOCOL://HOST:PORT, e.g. tcp://10.0.0.5:8786"
    text = str(address).strip()
    if "://" not in text and "/" in text:       # tcp//host:8786, tcp:/host:8786
        raise click.BadParameter(f"{address!r} is not a scheduler address; {expected}", param_hint="--scheduler")
    scheme = text.split("://", 1)[0] if "://" in text else "tcp"
    try:
        comm_backend(scheme)
    except ValueError:
        raise click.BadParameter(f"{address!r} has an unknown protocol {scheme!r}; {expected}",
                                 param_hint="--scheduler") from None
    try:
        host, port = address_host_port(text if "://" in text else f"tcp://{text}")
    except (ValueError, TypeError) as e:
        raise click.BadParameter(f"{address!r} is not a scheduler address ({e}); {expected}",
                                 param_hint="--scheduler") from None
    if not host or port is None or not 0 < int(port) < 65536:
        raise click.BadParameter(f"{address!r} is not a scheduler address; {expected}", param_hint="--scheduler")
    return text


def check_worker_arguments(scheduler: str, args: tuple[str, ...] | list[str]) -> None:
    """Check what ``dask-research worker`` passes to ``dask worker`` before it starts one: the
    scheduler address, then ``dask worker``'s own options by its own parser, and the values it
    reads only once running (``--nthreads``, ``--nworkers``, ``--memory-limit``, ``--resources``,
    ``--death-timeout``, ``--lifetime``, ``--lifetime-stagger``). Each bad value is one usage line
    (exit 2); before, a mistyped address or ``--memory-limit 4QB`` printed a 50-line traceback of
    the ``dask worker`` process.

    >>> check_worker_arguments("tcp://10.0.0.5:8786", ["--nthreads", "2", "--memory-limit", "8GiB"])
    >>> check_worker_arguments("tcp://10.0.0.5:8786", ["--memory-limit", "4QB"])
    Traceback (most recent call last):
    ...
    click.exceptions.BadParameter: '4QB' is not a memory limit; expected auto, a size such as 8GiB or 512MB, ...
    """
    try:
        check_address(scheduler)
    except click.BadParameter as e:
        e.param_hint = "SCHEDULER"
        raise
    if "--version" in args:                # dask worker --version: nothing runs, nothing to check
        return
    from dask.utils import parse_bytes, parse_timedelta

    from ._compat import dask_worker_command

    try:
        ctx = dask_worker_command().make_context("dask worker", [scheduler, *args])
    except click.UsageError as e:
        raise click.UsageError(f"dask worker: {e.format_message()}") from None
    p = ctx.params

    def bad(flag: str, what: str) -> click.BadParameter:
        return click.BadParameter(f"{p[flag.lstrip('-').replace('-', '_')]!r} {what}", param_hint=flag)

    if p["nthreads"] < 0:
        raise bad("--nthreads", "is not a thread count; expected a whole number >= 1 (0: the CPUs / --nworkers)")
    n_workers = p["n_workers"]
    if n_workers is not None and n_workers != "auto":
        import os

        cpus = os.cpu_count() or 1
        try:
            n = int(n_workers)
        except ValueError:
            n = 0
        if n == 0 or n < 0 and cpus + 1 + n <= 0:
            raise click.BadParameter(
                f"{n_workers!r} is not a number of worker processes; expected auto, a whole number >= 1, or -N "
                f"for all {cpus} CPUs but N-1", param_hint="--nworkers")
    limit = p["memory_limit"]
    if limit != "auto":
        try:
            size = float(limit)
        except ValueError:
            try:
                size = parse_bytes(limit)
            except (TypeError, ValueError):
                size = -1
        if not (size >= 0 and size != float("inf")):
            raise bad("--memory-limit", "is not a memory limit; expected auto, a size such as 8GiB or 512MB, a "
                                        "fraction of the machine's memory (0.5), or 0 for no limit")
    if p["resources"]:
        pairs = p["resources"].replace(",", " ").split()
        for pair in pairs:
            name, eq, amount = pair.partition("=")
            try:
                ok = bool(name and eq) and float(amount) >= 0
            except ValueError:
                ok = False
            if not ok:
                which = "" if pair == p["resources"].strip() else f" ({pair!r} is not one)"
                raise bad("--resources", f"is not a list of resources{which}; expected NAME=AMOUNT pairs such as "
                                         "'GPU=2 MEMORY=10e9'")
    for flag in ("--death-timeout", "--lifetime", "--lifetime-stagger"):
        value = p[flag[2:].replace("-", "_")]
        if value is None:
            continue
        try:
            seconds = parse_timedelta(value, default="seconds")
        except (TypeError, ValueError, KeyError):
            seconds = -1
        if seconds is None or seconds < 0:
            raise bad(flag, "is not a duration; expected seconds (60) or a duration such as 90s, 10 minutes or 1h")
