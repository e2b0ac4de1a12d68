"""The power policy's command lines: the ``dask worker`` preload and ``dask-research worker``.

>>> from dask_research.montecarlo.power_cli import build_worker_command
>>> build_worker_command("tcp://h:8786", "30%")[-4:]
['--preload', 'dask_research.montecarlo.power', '--battery-floor', '0.3']
"""
from __future__ import annotations

import logging
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

import click

from ..exceptions import InputError
from .power_parse import parse_battery_floor, parse_budget
from .power_policy import PowerPolicy

__all__ = ["dask_setup", "build_worker_command", "worker_command", "BATTERY_FLOOR", "CPU_BUDGET"]

#: The module ``dask worker --preload`` loads (it re-exports :func:`dask_setup`).
PRELOAD = "dask_research.montecarlo.power"

logger = logging.getLogger("distributed.worker.research_power")


class _ParsedType(click.ParamType):
    """A click type from one of this module's parsers, with its message for bad values."""

    def __init__(self, name: str, parse: Callable[..., float | None], what: str):
        self.name, self.parse, self.what = name, parse, what

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            out = self.parse(value, where=None)
        except InputError as e:
            self.fail(f"{value!r} is not {self.what}; expected {e.expected}", param, ctx)
        assert out is not None
        return out


BATTERY_FLOOR = _ParsedType("FLOOR", parse_battery_floor, "a battery floor")
CPU_BUDGET = _ParsedType("CPU_SECONDS", parse_budget, "a compute budget")

_floor_help = ("Pause the worker on battery power below this charge: '30%' or 0.3. "
               "Default: research.power.battery-floor.")
_budget_help = ("CPU-seconds (or a duration like '1h') the worker may use before it stops taking "
                "work. Default: research.power.budget.")


@click.command(name="dask_setup", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--battery-floor", type=BATTERY_FLOOR, default=None, help=_floor_help)
@click.option("--budget", type=CPU_BUDGET, default=None, help=_budget_help)
async def dask_setup(worker: Any, battery_floor: float | None, budget: float | None) -> None:
    """``dask worker`` preload: install :class:`PowerPolicy` on this worker, and the malloc
    settings of :class:`dask_research.malloc.MallocTuning`.

    .. code-block:: bash

        dask worker tcp://host:8786 --preload dask_research.montecarlo.power --battery-floor 30%
    """
    from distributed import Worker

    if not isinstance(worker, Worker):
        raise TypeError(f"dask_research.montecarlo.power is a worker preload (dask worker "
                        f"--preload ...); it was loaded by a {type(worker).__name__}")
    from ..malloc import MallocTuning

    plugin = PowerPolicy(battery_floor=battery_floor, budget=budget)
    result = await worker.plugin_add(plugin, name=plugin.name, catch_errors=False)
    logger.info("Power policy installed by preload: %r", plugin)
    assert result.get("status") == "OK", result
    tuning = MallocTuning()                # NumPy temporaries off the page-fault path
    await worker.plugin_add(tuning, name=tuning.name, catch_errors=False)


def build_worker_command(
    scheduler: str,
    battery_floor: float | str | None = None,
    budget: float | str | None = None,
    args: Sequence[str] = (),
) -> list[str]:
    """The ``dask worker`` command line that :data:`worker_command` runs.

    >>> cmd = build_worker_command("tcp://h:8786", "30%", 3600, ["--nthreads", "2"])
    >>> cmd[1:6]
    ['-m', 'distributed.cli.dask_worker', 'tcp://h:8786', '--nthreads', '2']
    >>> cmd[6:]
    ['--preload', 'dask_research.montecarlo.power', '--battery-floor', '0.3', '--budget', '3600']
    """
    floor = parse_battery_floor(battery_floor, where="dask-research worker")
    seconds = parse_budget(budget, where="dask-research worker")
    cmd = [sys.executable, "-m", "distributed.cli.dask_worker", scheduler, *args,
           "--preload", PRELOAD]
    if floor is not None:
        cmd += ["--battery-floor", repr(floor)]
    if seconds is not None:
        cmd += ["--budget", f"{seconds:g}"]
    return cmd


@click.command(
    name="worker",
    context_settings={"ignore_unknown_options": True, "help_option_names": ["-h", "--help"]},
)
@click.argument("scheduler", metavar="SCHEDULER")
@click.option("--battery-floor", type=BATTERY_FLOOR, default=None, help=_floor_help)
@click.option("--budget", type=CPU_BUDGET, default=None, help=_budget_help)
@click.argument("dask_worker_args", nargs=-1, type=click.UNPROCESSED, metavar="[DASK WORKER ARGS]...")
@click.pass_context
def worker_command(ctx: click.Context, scheduler: str, battery_floor: float | None,
                   budget: float | None, dask_worker_args: tuple[str, ...]) -> int:
    """Run `dask worker SCHEDULER` with the own-device power policy.

    Below the battery floor on battery power the worker pauses, and resumes when plugged in;
    when the CPU budget is spent it stops taking work. Other arguments go to `dask worker`:

    \b
        dask-research worker tcp://10.0.0.5:8786 --battery-floor 30% --budget 3600 --nthreads 2
    """
    from ..cli import check_worker_arguments  # one usage line (exit 2) before dask worker starts

    check_worker_arguments(scheduler, dask_worker_args)
    cmd = build_worker_command(scheduler, battery_floor, budget, dask_worker_args)
    proc = subprocess.Popen(cmd)

    def forward(signum: int, frame: Any) -> None:  # `kill PID` reaches dask worker too
        if proc.poll() is None:
            proc.send_signal(signum)

    try:
        previous = signal.signal(signal.SIGTERM, forward)
    except ValueError:  # not the main thread (e.g. a test runner): nothing to forward
        previous = None
    try:
        rc = proc.wait()
    except KeyboardInterrupt:
        # The terminal sent SIGINT to the whole group; give dask worker time to close cleanly.
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    ctx.exit(rc)
    return rc  # pragma: no cover (ctx.exit raises)
