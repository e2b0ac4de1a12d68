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
``research.power.event-topic`` (``client.get_events("research.power")``), in the envelope of
:mod:`dask_research.events` with the transition as ``action``, and kept on the plugin
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

from .power_cli import BATTERY_FLOOR, CPU_BUDGET, build_worker_command, dask_setup, worker_command
from .power_parse import parse_battery_floor, parse_budget, parse_interval
from .power_policy import PowerPolicy, power_state
from .power_sensors import BatteryReader, CpuReader, process_cpu_seconds, psutil_battery

__all__ = [
    "PowerPolicy", "power_state", "parse_battery_floor", "parse_budget", "parse_interval",
    "psutil_battery", "process_cpu_seconds", "worker_command", "build_worker_command",
    "dask_setup", "TOPIC", "BATTERY_FLOOR", "CPU_BUDGET", "BatteryReader", "CpuReader",
]

#: The default of ``research.power.event-topic``, where every power transition is logged.
TOPIC = "research.power"
