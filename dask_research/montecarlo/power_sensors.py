"""What the power policy reads on a worker: the battery and the process's CPU-seconds.

Both are :mod:`psutil` readings; a :class:`~dask_research.montecarlo.power.PowerPolicy` takes
any callables of the same shape instead (a test's, or a platform's own sensor).

>>> from dask_research.montecarlo.power_sensors import process_cpu_seconds
>>> read = process_cpu_seconds()
>>> read() >= 0.0
True
"""
from __future__ import annotations

from collections.abc import Callable

__all__ = ["BatteryReader", "CpuReader", "psutil_battery", "process_cpu_seconds"]

BatteryReader = Callable[[], "tuple[float, bool] | None"]
CpuReader = Callable[[], float]


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
