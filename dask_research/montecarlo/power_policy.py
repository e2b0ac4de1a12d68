"""The power policy's worker plugin, and :func:`power_state` that reads it from every worker.

See :mod:`dask_research.montecarlo.power` for what the policy does and how to install it.

>>> from dask_research.montecarlo.power_policy import PowerPolicy
>>> PowerPolicy(battery_floor="30%", budget=3600, battery=lambda: None)
<PowerPolicy floor=30% budget=3600 CPU-s interval=5s idle>
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from distributed import Status, WorkerPlugin

from .. import config, events
from .._compat import guard_memory_pause, worker_stream_open
from ..exceptions import InputError
from .power_parse import parse_battery_floor, parse_budget, parse_interval
from .power_sensors import BatteryReader, CpuReader, process_cpu_seconds, psutil_battery

if TYPE_CHECKING:
    from collections.abc import Callable

    from distributed import Client, Worker
    from tornado.ioloop import PeriodicCallback

__all__ = ["PowerPolicy", "power_state"]

# A child of ``distributed.worker`` so that the messages reach the handlers ``dask worker``
# configures and the worker's own log (``client.get_worker_logs()``).
logger = logging.getLogger("distributed.worker.research_power")

#: Seconds a battery reading may take: a sensor that blocks (a hung driver, a FIFO where a sysfs
#: file was) must not freeze the worker's event loop, which the check runs on.
READ_TIMEOUT = 1.0
#: Readings left hanging (each on a daemon thread) before the checks stop trying at each check;
#: then they try once after ``READ_RETRY[0]`` seconds, doubling up to ``READ_RETRY[1]``: a
#: sensor that answers again is heard again, and one that never does costs few threads.
MAX_STUCK_READS = 4
READ_RETRY = (60.0, 3600.0)


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
        self.battery_floor = parse_battery_floor(config.resolve("power.battery-floor", battery_floor))
        self.budget = parse_budget(config.resolve("power.budget", budget))
        self.interval = parse_interval(config.resolve("power.interval", interval))
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
        self._restore_memory_monitor: Callable[[], None] | None = None
        self._read_failed: set[str] = set()
        self._stuck_reads: list[threading.Thread] = []
        self._retry_at, self._retry_delay = 0.0, READ_RETRY[0]

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
        # Keep the memory monitor from resuming a worker this policy holds paused; a Dask
        # that moved the monitor's step raises here (DaskCompatError), never skips the guard.
        self._restore_memory_monitor = guard_memory_pause(
            worker, lambda w: self.holding and w.status == Status.paused)

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
        restore, self._restore_memory_monitor = self._restore_memory_monitor, None
        if restore is not None:
            restore()
        if self.holding and worker.status == Status.paused:
            self._transition("resume", "policy removed", resume=True)
        self.policy = "idle"

    # ---------------------------------------------------------------- checks

    def _ready(self) -> bool:
        w = self.worker
        if w is None or w.status not in (Status.running, Status.paused):
            return False
        return worker_stream_open(w)

    async def _check_when_ready(self) -> None:
        deadline = time.monotonic() + 600
        while not self._ready() and time.monotonic() < deadline:
            if self.worker is None or self.worker.status in (Status.closing, Status.closed,
                                                             Status.closing_gracefully):
                return
            await asyncio.sleep(0.05)
        await self._tick()

    async def _tick(self) -> None:
        """The periodic check, on the worker's event loop: the battery is read off the loop.

        A sensor read runs on a thread of its own; the loop awaits it (``READ_TIMEOUT`` at most)
        instead of joining it, so a slow or hung sensor never stalls the worker's heartbeats,
        transfers and task dispatch (``check()``, called directly, still joins it).
        """
        if not self._ready():
            return
        reading = await self._read_battery_async() if self.policy != "stopped" else None
        if self._ready():
            self._check(lambda: reading)

    def _read_cpu(self) -> float | None:
        try:
            assert self._cpu_reader is not None
            return float(self._cpu_reader())
        except Exception as e:  # a failing sensor must not kill the worker
            self._warn_once("cpu", f"cannot read CPU-seconds ({e!r}); the budget is not enforced")
            return None

    def _read_battery(self) -> tuple[float, bool] | None:
        """Read the battery on a thread, joined for ``READ_TIMEOUT`` at most (blocks the caller)."""
        started = self._begin_read()
        if started is None:
            return None
        thread, box = started
        thread.join(READ_TIMEOUT)
        return self._end_read(thread, box)

    async def _read_battery_async(self) -> tuple[float, bool] | None:
        """:meth:`_read_battery` awaited on the running loop instead of joined."""
        loop = asyncio.get_running_loop()
        done = asyncio.Event()

        def wake() -> None:
            with contextlib.suppress(RuntimeError):     # the loop closed while the sensor hung
                loop.call_soon_threadsafe(done.set)

        started = self._begin_read(on_done=wake)
        if started is None:
            return None
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(done.wait(), READ_TIMEOUT)
        return self._end_read(*started)

    def _begin_read(self, on_done: Callable[[], None] | None = None) -> tuple[threading.Thread, dict] | None:
        """Start one battery read on a daemon thread; ``None`` while the sensor keeps hanging."""
        reader = self.battery or psutil_battery
        self._stuck_reads = [t for t in self._stuck_reads if t.is_alive()]
        if not self._stuck_reads:
            self._retry_delay = READ_RETRY[0]
        elif len(self._stuck_reads) >= MAX_STUCK_READS and time.monotonic() < self._retry_at:
            return None                   # the sensor keeps hanging: absent until the retry
        box: dict[str, Any] = {}

        def read() -> None:
            try:
                box["reading"] = reader()
            except Exception as e:  # reported by _end_read
                box["error"] = e
            finally:
                box["done"] = True            # before waking the loop: the thread may not have exited yet
                if on_done is not None:
                    on_done()

        thread = threading.Thread(target=read, name="research-power-battery", daemon=True)
        thread.start()
        return thread, box

    def _end_read(self, thread: threading.Thread, box: dict) -> tuple[float, bool] | None:
        """The reading of a read begun by :meth:`_begin_read`; a read not done yet is stuck."""
        if not box.get("done"):
            self._stuck_reads.append(thread)
            if len(self._stuck_reads) >= MAX_STUCK_READS:
                self._retry_at = time.monotonic() + self._retry_delay
                self._retry_delay = min(2 * self._retry_delay, READ_RETRY[1])
            self._warn_once("battery", f"the battery reading did not answer within {READ_TIMEOUT:g} s; "
                                       "treating it as absent")
            return None
        reading = box.get("reading")
        try:
            if "error" in box:
                raise box["error"]
            if reading is None:
                return None
            percent, plugged = reading
            percent = float(percent)
            if not (math.isfinite(percent) and 0.0 <= percent <= 100.0):
                raise ValueError(f"{percent!r} is not a percentage between 0 and 100")
        except Exception as e:
            self._warn_once("battery", f"cannot read the battery ({e!r}); treating it as absent")
            return None
        return percent, bool(plugged)

    def _warn_once(self, what: str, message: str) -> None:
        if what not in self._read_failed:
            self._read_failed.add(what)
            logger.warning("Power policy: %s", message)

    def check(self) -> dict[str, Any]:
        """Read the battery and the CPU counter once, pause or resume, and return :attr:`state`."""
        return self._check(self._read_battery)

    def _check(self, read_battery: Callable[[], tuple[float, bool] | None]) -> dict[str, Any]:
        w = self.worker
        if w is None:
            raise RuntimeError("PowerPolicy.check() needs a worker; register the plugin first")
        self.checks += 1

        if self.policy == "stopped":
            self._reassert_pause()
            return self.state

        start = self._cpu_start
        now = self._read_cpu() if start is not None else None
        if start is not None and now is not None:
            self.cpu_used = max(0.0, now - start)
            if self.budget is not None and self.cpu_used >= self.budget:
                self.policy, self.reason = "stopped", "budget"
                self._transition(
                    "budget-spent",
                    f"compute budget spent: {self.cpu_used:.1f} of {self.budget:g} CPU-seconds "
                    "used; this worker takes no more work", pause=True)
                return self.state

        reading = read_battery()
        if reading is None:
            self.battery_percent = self.plugged = None
        else:
            self.battery_percent, self.plugged = reading
        low = (reading is not None and self.battery_floor is not None and not reading[1]
               and reading[0] < 100.0 * self.battery_floor)

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
        event = events.envelope(
            "power", action, None, action=action,
            reason=self.reason if not resume else None, message=why,
            battery_percent=self.battery_percent, plugged=self.plugged,
            battery_floor=self.battery_floor, cpu_seconds=round(self.cpu_used, 3),
            budget=self.budget, worker=w.address)
        self.transitions.append(event)
        log = logger.warning if pause else logger.info
        log("Power policy: %s worker %s: %s", "pausing" if pause else "resuming" if resume
            else action, w.address, why)
        events.Outbox(w, "power", worker=True).put(dict(event))   # best effort, never raising; the worker log has it


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
