"""Own-device power policy: a battery floor and a compute budget for Monte-Carlo workers.

A Monte-Carlo pool made of people's own laptops must not drain a battery nor burn more CPU than
its owner agreed to. :class:`PowerPolicy` is a :class:`distributed.WorkerPlugin` that checks,
every ``interval`` seconds on each worker:

* **battery floor**: on battery power with the charge below ``battery_floor``, the worker is
  paused (``Status.paused``, the state the memory monitor uses: it takes no new tasks and its
  running tasks finish). It resumes when plugged in, or when the charge is back at the floor.
  A machine without a battery never pauses for the floor.
* **compute budget**: once the worker process has used ``budget`` CPU-seconds since the
  policy started, the worker is paused for good (reason ``"budget"``).

Every transition is written to the worker log and to the Dask event log under the topic
``"research.power"`` (``client.get_events("research.power")``), and kept on the plugin
(:attr:`PowerPolicy.state`, :attr:`PowerPolicy.transitions`; :func:`power_state` reads them
from every worker). Shards are deterministic, so work a paused worker does not take simply runs
elsewhere or later: pausing never changes a result.

Three ways in:

.. code-block:: bash

    dask worker tcp://host:8786 --preload dask_research.montecarlo.power --battery-floor 30%
    dask-research worker tcp://host:8786 --battery-floor 30% --budget 3600

.. code-block:: python

    client.register_plugin(PowerPolicy(battery_floor="30%", budget=3600))

Examples
--------
>>> from dask_research.montecarlo.power import PowerPolicy, parse_battery_floor
>>> parse_battery_floor("30%"), parse_battery_floor(0.3), parse_battery_floor("0.25")
(0.3, 0.3, 0.25)
>>> policy = PowerPolicy(battery_floor="30%", budget="1h",
...                      battery=lambda: (12.0, False))   # 12 %, unplugged
>>> policy.battery_floor, policy.budget
(0.3, 3600.0)
>>> client.register_plugin(policy)                        # doctest: +SKIP
"""
from __future__ import annotations

import asyncio
import logging
import math
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import click
from distributed.core import Status
from distributed.diagnostics.plugin import WorkerPlugin

from .. import config
from ..exceptions import InputError

if TYPE_CHECKING:
    from distributed import Client, Worker
    from tornado.ioloop import PeriodicCallback

__all__ = [
    "PowerPolicy", "power_state", "parse_battery_floor", "parse_budget", "psutil_battery",
    "process_cpu_seconds", "worker_command", "build_worker_command", "dask_setup", "TOPIC",
]

#: Dask event-log topic of every power transition.
TOPIC = "research.power"

# A child of ``distributed.worker`` so that the messages reach the handlers ``dask worker``
# configures and the worker's own log (``client.get_worker_logs()``).
logger = logging.getLogger("distributed.worker.research_power")

BatteryReader = Callable[[], "tuple[float, bool] | None"]
CpuReader = Callable[[], float]

_FLOOR_EXPECTED = ("a fraction between 0 and 1 (e.g. 0.3) or a percentage between 0% and "
                   "100% (e.g. '30%')")
_BUDGET_EXPECTED = ("a positive number of CPU-seconds (e.g. 3600) or a duration "
                    "(e.g. '1h', '90 minutes')")
_INTERVAL_EXPECTED = "a positive number of seconds (e.g. 5) or a duration (e.g. '5s')"


# --------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------


def parse_battery_floor(value: float | str | None, where: str | None = "PowerPolicy") -> float | None:
    """Return the battery floor as a fraction in ``[0, 1]``, or ``None`` (no floor).

    Accepts a fraction (``0.3``, ``"0.3"``) or a percentage string (``"30%"``).

    >>> parse_battery_floor("30%"), parse_battery_floor("0.3"), parse_battery_floor(None)
    (0.3, 0.3, None)
    >>> parse_battery_floor(30)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    dask_research.exceptions.InputError: PowerPolicy: battery_floor=30 is invalid; expected a ...
    """
    if value is None:
        return None
    original = value
    scale = 1.0
    if isinstance(value, str):
        text = value.strip()
        if text.endswith("%"):
            text, scale = text[:-1].strip(), 100.0
        try:
            value = float(text)
        except ValueError:
            raise InputError("battery_floor", original, _FLOOR_EXPECTED, where=where) from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError("battery_floor", original, _FLOOR_EXPECTED, where=where)
    fraction = float(value) / scale
    if not math.isfinite(fraction) or not 0.0 <= fraction <= 1.0:
        raise InputError("battery_floor", original, _FLOOR_EXPECTED, where=where)
    return fraction


def _parse_seconds(name: str, value: float | str, expected: str, where: str | None) -> float:
    from dask.utils import parse_timedelta

    original = value
    if isinstance(value, str):
        text = value.strip()
        try:
            value = float(text)
        except ValueError:
            try:
                value = parse_timedelta(text, default="seconds")
            except (ValueError, KeyError, TypeError):
                raise InputError(name, original, expected, where=where) from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(name, original, expected, where=where)
    seconds = float(value)
    if not math.isfinite(seconds) or seconds <= 0:
        raise InputError(name, original, expected, where=where)
    return seconds


def parse_budget(value: float | str | None, where: str | None = "PowerPolicy") -> float | None:
    """Return the compute budget in CPU-seconds, or ``None`` (no budget).

    >>> parse_budget(3600), parse_budget("3600"), parse_budget("1h"), parse_budget(None)
    (3600.0, 3600.0, 3600.0, None)
    """
    if value is None:
        return None
    return _parse_seconds("budget", value, _BUDGET_EXPECTED, where)


def _parse_interval(value: float | str, where: str | None = "PowerPolicy") -> float:
    return _parse_seconds("interval", value, _INTERVAL_EXPECTED, where)


# --------------------------------------------------------------------------------------------
# Default readers
# --------------------------------------------------------------------------------------------


def psutil_battery() -> tuple[float, bool] | None:
    """Read the battery with :func:`psutil.sensors_battery`: ``(percent, plugged)`` or ``None``.

    ``None`` means the machine has no battery (or psutil cannot read one on this platform). When
    psutil cannot tell whether the machine is plugged in, it is treated as running on battery:
    a floor exists to protect the battery.
    """
    import psutil

    sensors_battery = getattr(psutil, "sensors_battery", None)
    if sensors_battery is None:
        return None
    battery = sensors_battery()
    if battery is None:
        return None
    return float(battery.percent), bool(battery.power_plugged)


def process_cpu_seconds() -> CpuReader:
    """Return a reader of the CPU-seconds (user + system) used by this process so far."""
    import psutil

    process = psutil.Process()

    def read() -> float:
        times = process.cpu_times()
        return float(times.user + times.system)

    return read


# --------------------------------------------------------------------------------------------
# The plugin
# --------------------------------------------------------------------------------------------


class PowerPolicy(WorkerPlugin):
    """Pause a worker below a battery floor on battery power; stop it when a CPU budget is spent.

    To use it:

    1. create one, e.g. ``PowerPolicy(battery_floor="30%", budget=3600)``;
    2. register it with :meth:`distributed.Client.register_plugin` (every current and future
       worker gets a copy), or start workers with
       ``dask worker ADDRESS --preload dask_research.montecarlo.power --battery-floor 30%``;
    3. read what happened with ``client.get_events("research.power")`` or :func:`power_state`.

    Parameters
    ----------
    battery_floor : float or str, optional
        On battery power, pause while the charge is below this: a fraction (``0.3``) or a
        percentage string (``"30%"``). The worker resumes when plugged in or when the charge is
        at or above the floor again. Machines without a battery never pause for the floor.
        Default: ``research.power.battery-floor`` (``null``: no floor).
    budget : float or str, optional
        CPU-seconds (user + system) the worker process may use after the policy starts; when
        they are spent the worker stops taking work for good. A duration string such as
        ``"1h"`` is accepted. Default: ``research.power.budget`` (``null``: no budget).
    interval : float or str, optional
        Seconds between checks. Default: ``research.power.interval``.
    battery : callable, optional
        ``battery() -> (percent 0-100, plugged) | None``. Default: :func:`psutil_battery`.
    cpu_seconds : callable, optional
        ``cpu_seconds() -> float``, a monotone counter of CPU-seconds used. Default: this
        process's user + system time (:func:`process_cpu_seconds`), read on the worker.

    Notes
    -----
    The worker is paused exactly as the memory monitor pauses it (``worker.status =
    Status.paused``). While the policy holds a worker paused, the memory monitor is kept from
    resuming it (and the pause is re-asserted at every check); when the policy lets go, the
    memory monitor may pause it again for memory. The budget counts from :meth:`setup`, so
    re-registering the plugin restarts it. Removing the plugin (``client.unregister_worker_plugin
    ("research-power")``) resumes a worker it paused. State lives on the worker's copy of the
    plugin: a registered instance is pickled, so read it with :func:`power_state`.

    Examples
    --------
    >>> policy = PowerPolicy(battery_floor="30%", budget=3600, interval=5)
    >>> client.register_plugin(policy)                            # doctest: +SKIP
    >>> client.get_events("research.power")                       # doctest: +SKIP
    ((1764470000.0, {'action': 'pause', 'reason': 'battery', 'battery_percent': 21.0, ...}),)
    >>> power_state(client)                                       # doctest: +SKIP
    {'tcp://10.0.0.7:40211': {'policy': 'paused', 'reason': 'battery', ...}}
    """

    name = "research-power"
    idempotent = False

    def __init__(
        self,
        battery_floor: float | str | None = None,
        budget: float | str | None = None,
        interval: float | str | None = None,
        battery: BatteryReader | None = None,
        cpu_seconds: CpuReader | None = None,
    ) -> None:
        self.battery_floor = parse_battery_floor(config.get("power.battery-floor", battery_floor))
        self.budget = parse_budget(config.get("power.budget", budget))
        self.interval = _parse_interval(config.get("power.interval", interval))
        if battery is not None and not callable(battery):
            raise InputError("battery", battery, "a callable returning (percent, plugged) or None",
                             where="PowerPolicy")
        if cpu_seconds is not None and not callable(cpu_seconds):
            raise InputError("cpu_seconds", cpu_seconds, "a callable returning CPU-seconds",
                             where="PowerPolicy")
        self.battery = battery
        self.cpu_seconds = cpu_seconds
        self._reset()

    def _reset(self) -> None:
        self.worker: Worker | None = None
        self.policy = "idle"            # idle (not set up), running, paused, stopped
        self.reason: str | None = None  # "battery" or "budget" while paused/stopped
        self.battery_percent: float | None = None
        self.plugged: bool | None = None
        self.cpu_used = 0.0
        self.checks = 0
        self.transitions: list[dict[str, Any]] = []
        self._cpu_start: float | None = None
        self._cpu_reader: CpuReader | None = None
        self._pc: PeriodicCallback | None = None
        self._first: asyncio.Task[None] | None = None
        self._guarded: Any = None        # the memory manager whose unpause we guard
        self._read_failed: set[str] = set()

    def __getstate__(self) -> dict[str, Any]:
        # Ship the settings only: runtime state belongs to the worker's copy.
        return {k: self.__dict__[k] for k in
                ("battery_floor", "budget", "interval", "battery", "cpu_seconds")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def __repr__(self) -> str:
        floor = "none" if self.battery_floor is None else f"{self.battery_floor:.0%}"
        budget = "none" if self.budget is None else f"{self.budget:g} CPU-s"
        return f"<PowerPolicy floor={floor} budget={budget} interval={self.interval:g}s {self.policy}>"

    # ---------------------------------------------------------------- state

    @property
    def holding(self) -> bool:
        """Whether the policy currently wants the worker paused."""
        return self.policy in ("paused", "stopped")

    @property
    def state(self) -> dict[str, Any]:
        """A snapshot of the policy on this worker (msgpack-friendly)."""
        return {
            "policy": self.policy,
            "reason": self.reason,
            "battery_floor": self.battery_floor,
            "budget": self.budget,
            "interval": self.interval,
            "battery_percent": self.battery_percent,
            "plugged": self.plugged,
            "cpu_seconds": self.cpu_used,
            "checks": self.checks,
            "worker_status": self.worker.status.name if self.worker is not None else None,
            "transitions": [dict(t) for t in self.transitions],
        }

    # ---------------------------------------------------------------- lifecycle

    def setup(self, worker: Worker) -> None:
        """Start checking: immediately if the worker is connected, else once it is."""
        self._reset()
        self.worker = worker
        self.policy = "running"
        self._cpu_reader = self.cpu_seconds or process_cpu_seconds()
        self._cpu_start = self._read_cpu()
        self._guard_memory_monitor(worker)

        from tornado.ioloop import PeriodicCallback

        self._pc = PeriodicCallback(self._tick, self.interval * 1000)
        self._pc.start()
        if self._ready():
            self.check()
        else:
            # Installed by a preload, before the worker registered with the scheduler (which
            # sets it running): check as soon as it is connected.
            self._first = asyncio.get_running_loop().create_task(self._check_when_ready())

    def teardown(self, worker: Worker) -> None:
        """Stop checking; resume the worker if the policy was holding it paused."""
        if self._pc is not None:
            self._pc.stop()
        if self._first is not None:
            self._first.cancel()
        self._unguard_memory_monitor()
        if self.holding and worker.status == Status.paused:
            self._transition("resume", "policy removed", resume=True)
        self.policy = "idle"

    # ---------------------------------------------------------------- checks

    def _ready(self) -> bool:
        w = self.worker
        if w is None or w.status not in (Status.running, Status.paused):
            return False
        stream = getattr(w, "batched_stream", None)
        comm = getattr(stream, "comm", None)
        return comm is not None and not comm.closed()

    async def _check_when_ready(self) -> None:
        deadline = time.monotonic() + 600
        while not self._ready() and time.monotonic() < deadline:
            if self.worker is None or self.worker.status in (Status.closing, Status.closed,
                                                             Status.closing_gracefully):
                return
            await asyncio.sleep(0.05)
        self.check()

    def _tick(self) -> None:
        if self._ready():
            self.check()

    def _read_cpu(self) -> float | None:
        try:
            assert self._cpu_reader is not None
            return float(self._cpu_reader())
        except Exception as e:  # a failing sensor must not kill the worker
            self._warn_once("cpu", f"cannot read CPU-seconds ({e!r}); the budget is not enforced")
            return None

    def _read_battery(self) -> tuple[float, bool] | None:
        reader = self.battery or psutil_battery
        try:
            reading = reader()
        except Exception as e:
            self._warn_once("battery", f"cannot read the battery ({e!r}); treating it as absent")
            return None
        if reading is None:
            return None
        percent, plugged = reading
        return float(percent), bool(plugged)

    def _warn_once(self, what: str, message: str) -> None:
        if what not in self._read_failed:
            self._read_failed.add(what)
            logger.warning("Power policy: %s", message)

    def check(self) -> dict[str, Any]:
        """Read the battery and the CPU counter once, pause or resume, and return :attr:`state`."""
        w = self.worker
        if w is None:
            raise RuntimeError("PowerPolicy.check() needs a worker; register the plugin first")
        self.checks += 1

        if self.policy == "stopped":
            self._reassert_pause()
            return self.state

        now = self._read_cpu() if self._cpu_start is not None else None
        if now is not None:
            self.cpu_used = max(0.0, now - self._cpu_start)
            if self.budget is not None and self.cpu_used >= self.budget:
                self.policy, self.reason = "stopped", "budget"
                self._transition(
                    "budget-spent",
                    f"compute budget spent: {self.cpu_used:.1f} of {self.budget:g} CPU-seconds "
                    "used; this worker takes no more work", pause=True)
                return self.state

        reading = self._read_battery()
        if reading is None:
            self.battery_percent = self.plugged = None
        else:
            self.battery_percent, self.plugged = reading
        low = (reading is not None and self.battery_floor is not None and not self.plugged
               and self.battery_percent < 100.0 * self.battery_floor)

        if low and self.policy == "running":
            self.policy, self.reason = "paused", "battery"
            self._transition(
                "pause",
                f"on battery at {self.battery_percent:.0f}%, below the floor of "
                f"{self.battery_floor:.0%}; running tasks finish, no new tasks start", pause=True)
        elif low:
            self._reassert_pause()
        elif self.policy == "paused":
            why = ("plugged in" if self.plugged else
                   "no battery" if reading is None else
                   f"battery at {self.battery_percent:.0f}%, at or above the floor")
            self.policy, self.reason = "running", None
            self._transition("resume", why, resume=True)
        return self.state

    def _reassert_pause(self) -> None:
        # Something (e.g. a memory monitor without our guard) resumed the worker: pause it again.
        if self.worker is not None and self.worker.status == Status.running:
            self.worker.status = Status.paused

    def _transition(self, action: str, why: str, pause: bool = False, resume: bool = False) -> None:
        w = self.worker
        assert w is not None
        if pause and w.status == Status.running:
            w.status = Status.paused
        elif resume and w.status == Status.paused:
            w.status = Status.running
        event = {
            "action": action,
            "reason": self.reason if not resume else None,
            "message": why,
            "battery_percent": self.battery_percent,
            "plugged": self.plugged,
            "battery_floor": self.battery_floor,
            "cpu_seconds": round(self.cpu_used, 3),
            "budget": self.budget,
            "worker": w.address,
            "time": time.time(),
        }
        self.transitions.append(event)
        log = logger.warning if pause else logger.info
        log("Power policy: %s worker %s: %s", "pausing" if pause else "resuming" if resume
            else action, w.address, why)
        try:
            w.log_event(TOPIC, dict(event))
        except Exception:  # the event log is best effort; the worker log has it
            logger.debug("could not send %s event", TOPIC, exc_info=True)

    # ---------------------------------------------------------------- memory monitor

    def _guard_memory_monitor(self, worker: Worker) -> None:
        """Keep the memory monitor from resuming a worker this policy holds paused.

        ``WorkerMemoryManager._maybe_pause_or_unpause`` resumes any paused worker whose memory
        is fine, every ``distributed.worker.memory.monitor-interval``; we wrap it on this
        worker's instance only, and restore it in :meth:`teardown`.
        """
        mm = getattr(worker, "memory_manager", None)
        original = getattr(mm, "_maybe_pause_or_unpause", None)
        if mm is None or original is None:
            return
        policy = self

        def maybe_pause_or_unpause(worker: Worker, memory: int) -> None:
            if policy.holding and worker.status == Status.paused:
                return  # paused by the power policy: only the policy resumes it
            original(worker, memory)

        maybe_pause_or_unpause.__wrapped__ = original  # type: ignore[attr-defined]
        mm._maybe_pause_or_unpause = maybe_pause_or_unpause
        self._guarded = mm

    def _unguard_memory_monitor(self) -> None:
        mm, self._guarded = self._guarded, None
        if mm is not None and "_maybe_pause_or_unpause" in vars(mm):
            del mm._maybe_pause_or_unpause


def _worker_state(dask_worker: Worker) -> dict[str, Any] | None:
    plugin = dask_worker.plugins.get(PowerPolicy.name)
    return plugin.state if isinstance(plugin, PowerPolicy) else None


def power_state(client: Client | None = None) -> Any:
    """The :attr:`PowerPolicy.state` of every worker, ``{address: state or None}``.

    With an asynchronous client this returns an awaitable.

    >>> power_state(client)["tcp://10.0.0.7:40211"]["policy"]     # doctest: +SKIP
    'paused'
    """
    if client is None:
        from distributed import get_client

        client = get_client()
    return client.run(_worker_state)


# --------------------------------------------------------------------------------------------
# Command line: the ``dask worker`` preload and the ``dask-research worker`` wrapper
# --------------------------------------------------------------------------------------------


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
           "--preload", __name__]
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
