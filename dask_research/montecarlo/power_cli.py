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

from ..exceptions import ConfigError, InputError
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


class _PowerCommand(click.Command):
    """A command whose power settings left to ``research.power.*`` are checked as it is parsed.

    ``dask worker`` runs a preload's ``dask_setup`` only once the worker starts, and logs its
    error and carries on: a bad configured floor would leave a worker running without the policy.
    Parsing is before anything starts, and a usage error there stops ``dask worker`` (exit 2).
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        rest = super().parse_args(ctx, args)
        try:
            PowerPolicy(battery_floor=ctx.params.get("battery_floor"), budget=ctx.params.get("budget"))
        except InputError as e:  # the options are checked already: this value is configured
            raise click.UsageError(f"config research.power.{e.name.replace('_', '-')}={e.value!r} "
                                   f"is invalid; expected {e.expected}", ctx) from None
        except ConfigError as e:
            raise click.UsageError(str(e), ctx) from None
        return rest


BATTERY_FLOOR = _ParsedType("FLOOR", parse_battery_floor, "a battery floor")
CPU_BUDGET = _ParsedType("CPU_SECONDS", parse_budget, "a compute budget")

_floor_help = ("Pause the worker on battery power below this charge: '30%' or 0.3. "
               "Default: research.power.battery-floor.")
_budget_help = ("CPU-seconds (or a duration like '1h') the worker may use before it stops taking "
                "work. Default: research.power.budget.")


@click.command(name="dask_setup", cls=_PowerCommand, context_settings={"help_option_names": ["-h", "--help"]})
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
        cmd += ["--budget", repr(seconds).removesuffix(".0")]   # exact: no 6-digit rounding
    return cmd


@click.command(
    name="worker",
    cls=_PowerCommand,
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
    from ..cli_checks import check_worker_arguments  # one usage line (exit 2) before dask worker starts

    check_worker_arguments(scheduler, dask_worker_args)
    cmd = build_worker_command(scheduler, battery_floor, budget, dask_worker_args)
    # POSIX: dask worker gets its own session and process group, so that a signal reaches it once, from
    # here: `kill -INT PID` as well as Ctrl-C (which the terminal sends to this group only; the
    # nanny then closes its worker process itself, rather than have it interrupted too).
    posix = sys.platform != "win32"
    proc = subprocess.Popen(cmd, start_new_session=posix)   # its own group (process_group= needs 3.11)

    def forward(signum: int, frame: Any) -> None:  # `kill PID` reaches dask worker too
        if proc.poll() is None:
            proc.send_signal(signum)

    previous: dict[int, Any] = {}
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP) if posix else (signal.SIGTERM,):
        if signal.getsignal(signum) == signal.SIG_IGN:   # e.g. nohup: dask worker ignores it too
            continue
        try:
            previous[signum] = signal.signal(signum, forward)
        except ValueError:  # not the main thread (e.g. a test runner): nothing to forward
            break
    try:
        rc = proc.wait()
    except KeyboardInterrupt:
        # Ctrl-C where it is not forwarded (Windows: the console's whole group has it): give
        # dask worker time to close cleanly.
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
        for number, handler in previous.items():
            signal.signal(number, handler)
    rc = 128 - rc if rc < 0 else rc   # killed by signal N: 128 + N, as a shell reports it
    ctx.exit(rc)
    return rc  # pragma: no cover (ctx.exit raises)
