"""Own-device power policy: battery floor, compute budget, events, the preload and the CLI."""
from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time

import dask
import pytest
from click.testing import CliRunner
from distributed import Client, Status, get_worker
from distributed.utils_test import gen_cluster, inc

from dask_research._cluster import workers_info
from dask_research.events import topic as event_topic
from dask_research.exceptions import InputError
from dask_research.montecarlo import power
from dask_research.montecarlo.power import (
    PowerPolicy,
    build_worker_command,
    parse_battery_floor,
    parse_budget,
    power_state,
    worker_command,
)


class Readings:
    """A battery and a CPU counter the test sets by hand."""

    def __init__(self, percent: float | None = 80.0, plugged: bool = False, cpu: float = 0.0):
        self.percent, self.plugged, self.cpu = percent, plugged, cpu

    def battery(self):
        return None if self.percent is None else (self.percent, self.plugged)

    def cpu_seconds(self):
        return self.cpu


async def install(worker, readings, **kwargs):
    """Install a policy directly (no pickling), so the test keeps hold of `readings`."""
    kwargs.setdefault("interval", 3600)  # the test calls check(); the periodic callback idles
    plugin = PowerPolicy(battery=readings.battery, cpu_seconds=readings.cpu_seconds, **kwargs)
    await worker.plugin_add(plugin, name=plugin.name)
    return plugin


async def until(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def memory_monitor_would_resume(worker):
    """Run the memory monitor's pause/resume step as if memory were fine."""
    mm = worker.memory_manager
    limit, fraction = mm.memory_limit, mm.memory_pause_fraction
    mm.memory_limit, mm.memory_pause_fraction = limit or 2**30, fraction or 0.8
    try:
        mm._maybe_pause_or_unpause(worker, 0)
    finally:
        mm.memory_limit, mm.memory_pause_fraction = limit, fraction


def where():
    return get_worker().address


def scheduler_sees(s, worker, status):
    return lambda: s.workers[worker.address].status == status


# ------------------------------------------------------------------------------ parsing


@pytest.mark.parametrize("value, expected", [
    ("30%", 0.3), (" 30 % ", 0.3), ("0.3", 0.3), (0.3, 0.3), (0, 0.0), ("100%", 1.0), (1, 1.0),
    (None, None),
])
def test_parse_battery_floor(value, expected):
    floor = parse_battery_floor(value)
    assert floor is None if expected is None else floor == pytest.approx(expected)


@pytest.mark.parametrize("value", [30, "30", "130%", "-5%", -0.1, "low", True, float("nan"), [0.3]])
def test_bad_battery_floor_names_the_value(value):
    with pytest.raises(InputError, match=r"battery_floor=.* is invalid; expected a fraction "
                                         r"between 0 and 1 .* or a percentage") as info:
        PowerPolicy(battery_floor=value)
    assert info.value.value is value  # the error keeps what was given


@pytest.mark.parametrize("value, expected", [(3600, 3600.0), ("3600", 3600.0), ("1h", 3600.0),
                                             ("90 minutes", 5400.0), (0.5, 0.5), (None, None)])
def test_parse_budget(value, expected):
    assert parse_budget(value) == expected


@pytest.mark.parametrize("value", [0, -1, "soon", True, float("inf")])
def test_bad_budget_names_the_value(value):
    with pytest.raises(InputError, match=r"budget=.* is invalid; expected a positive number of "
                                         r"CPU-seconds"):
        PowerPolicy(budget=value)


def test_defaults_come_from_config_at_call_time():
    p = PowerPolicy()
    assert (p.battery_floor, p.budget, p.interval) == (None, None, 5.0)
    with dask.config.set({"research.power.battery-floor": "25%", "research.power.budget": "2h",
                          "research.power.interval": "250ms"}):
        p = PowerPolicy()
        assert (p.battery_floor, p.budget, p.interval) == (0.25, 7200.0, 0.25)
        assert PowerPolicy(battery_floor=0.5).battery_floor == 0.5  # an argument wins
    with dask.config.set({"research.power.interval": 0}):
        with pytest.raises(InputError, match="interval=0 is invalid"):
            PowerPolicy()


def test_pickled_policy_ships_settings_not_state():
    import cloudpickle

    p = PowerPolicy(battery_floor="30%", budget=10, battery=lambda: (10.0, False))
    p.transitions.append({"action": "pause"})
    q = cloudpickle.loads(cloudpickle.dumps(p))
    assert (q.battery_floor, q.budget, q.battery()) == (0.3, 10.0, (10.0, False))
    assert q.transitions == [] and q.policy == "idle"


# ------------------------------------------------------------------------------ cluster


@gen_cluster(client=True)
async def test_pause_below_floor_on_battery_and_resume_when_plugged(c, s, a, b):
    r = Readings(percent=80.0, plugged=False)
    plugin = await install(a, r, battery_floor="30%")
    assert plugin.state["policy"] == "running" and a.status == Status.running

    r.percent = 21.0
    state = plugin.check()
    assert state["policy"] == "paused" and state["reason"] == "battery"
    assert a.status == Status.paused
    await until(scheduler_sees(s, a, Status.paused))

    # Work submitted while `a` is paused runs on `b`.
    addresses = await c.gather([c.submit(where, pure=False) for _ in range(6)])
    assert set(addresses) == {b.address}

    # Still low, still on battery: stays paused; the memory monitor may not resume it.
    r.percent = 15.0
    assert plugin.check()["policy"] == "paused"
    memory_monitor_would_resume(a)
    assert a.status == Status.paused

    r.plugged = True
    state = plugin.check()
    assert state["policy"] == "running" and state["reason"] is None
    assert a.status == Status.running
    await until(scheduler_sees(s, a, Status.running))
    assert [t["action"] for t in plugin.transitions] == ["pause", "resume"]
    assert "plugged in" in plugin.transitions[-1]["message"]

    # Back on battery but above the floor: no pause. Above-floor charge also resumes.
    r.plugged, r.percent = False, 50.0
    assert plugin.check()["policy"] == "running"
    r.percent = 10.0
    assert plugin.check()["policy"] == "paused"
    r.percent = 30.0
    assert plugin.check()["policy"] == "running"


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_task_submitted_while_paused_runs_after_resume(c, s, a):
    r = Readings(percent=5.0, plugged=False)
    plugin = await install(a, r, battery_floor=0.3)
    assert plugin.state["policy"] == "paused"
    await until(scheduler_sees(s, a, Status.paused))

    fut = c.submit(inc, 1)
    await asyncio.sleep(0.3)
    assert not fut.done() and a.state.executed_count == 0

    r.plugged = True
    plugin.check()
    assert await fut == 2


@gen_cluster(client=True)
async def test_budget_spent_stops_work_for_good(c, s, a, b):
    r = Readings(percent=None, cpu=100.0)  # no battery; 100 CPU-s used before the policy
    plugin = await install(a, r, budget=10)
    r.cpu = 105.0
    assert plugin.check()["cpu_seconds"] == pytest.approx(5.0)
    assert a.status == Status.running

    r.cpu = 110.5
    state = plugin.check()
    assert state["policy"] == "stopped" and state["reason"] == "budget"
    assert a.status == Status.paused
    await until(scheduler_sees(s, a, Status.paused))
    assert set(await c.gather([c.submit(where, pure=False) for _ in range(4)])) == {b.address}

    # For good: nothing brings it back, not a battery, not the memory monitor, not a status flip.
    r.percent, r.plugged = 100.0, True
    assert plugin.check()["policy"] == "stopped"
    memory_monitor_would_resume(a)
    assert a.status == Status.paused
    a.status = Status.running
    plugin.check()
    assert a.status == Status.paused
    assert [t["action"] for t in plugin.transitions] == ["budget-spent"]
    assert "10.5 of 10 CPU-seconds" in plugin.transitions[0]["message"]
    assert any("compute budget spent" in rec.getMessage() for rec in a.logs)


@gen_cluster(client=True)
async def test_no_battery_never_pauses(c, s, a, b):
    r = Readings(percent=None)
    plugin = await install(a, r, battery_floor="99%")
    for _ in range(3):
        state = plugin.check()
    assert state["policy"] == "running" and state["battery_percent"] is None
    assert state["checks"] == 4 and a.status == Status.running and plugin.transitions == []


@gen_cluster(client=True)
async def test_transitions_are_dask_events(c, s, a, b):
    r = Readings(percent=12.0, plugged=False)
    plugin = await install(a, r, battery_floor="30%")
    r.plugged = True
    plugin.check()

    async def events():
        return [msg for _, msg in await c.get_events(event_topic("power"))]

    deadline = time.monotonic() + 5
    while len(await events()) < 2:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    pause, resume = await events()
    assert pause["action"] == "pause" and pause["reason"] == "battery"
    assert pause["battery_percent"] == 12.0 and pause["plugged"] is False
    assert pause["battery_floor"] == 0.3 and pause["worker"] == a.address
    assert resume["action"] == "resume" and resume["plugged"] is True

    states = await power_state(c)
    assert states[a.address]["policy"] == "running"
    assert [t["action"] for t in states[a.address]["transitions"]] == ["pause", "resume"]
    assert states[b.address] is None


@gen_cluster(client=True)
async def test_registered_through_the_client_with_a_periodic_check(c, s, a, b):
    # The real path: pickled to the scheduler and every worker; checks run on their own.
    plugin = PowerPolicy(battery_floor="30%", interval=0.05, battery=lambda: (10.0, False))
    await c.register_plugin(plugin)
    for w in (a, b):
        await until(scheduler_sees(s, w, Status.paused))
        assert w.plugins["research-power"].state["reason"] == "battery"
    await until(lambda: all(w.plugins["research-power"].state["checks"] >= 3 for w in (a, b)))

    # Removing the policy resumes the workers it paused.
    await c.unregister_worker_plugin("research-power")
    for w in (a, b):
        await until(scheduler_sees(s, w, Status.running))
    assert await c.submit(inc, 41) == 42


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_failing_sensor_does_not_kill_the_worker(c, s, a):
    def broken():
        raise OSError("no /sys/class/power_supply")

    plugin = PowerPolicy(battery_floor="30%", budget=10, battery=broken, cpu_seconds=broken,
                         interval=3600)
    await a.plugin_add(plugin, name=plugin.name)
    assert plugin.check()["policy"] == "running"
    assert await c.submit(inc, 1) == 2


def test_default_readers_work_here():
    reading = power.psutil_battery()
    assert reading is None or (0 <= reading[0] <= 100 and isinstance(reading[1], bool))
    cpu = power.process_cpu_seconds()
    assert 0 < cpu() <= cpu()


# ------------------------------------------------------------------------------ CLI


def test_worker_command_rejects_a_bad_floor():
    result = CliRunner().invoke(worker_command, ["tcp://127.0.0.1:1", "--battery-floor", "30"])
    assert result.exit_code == 2
    assert "Invalid value for '--battery-floor'" in result.output
    assert "'30' is not a battery floor" in result.output and "'30%'" in result.output
    result = CliRunner().invoke(worker_command, ["tcp://127.0.0.1:1", "--budget", "lots"])
    assert result.exit_code == 2 and "'lots' is not a compute budget" in result.output


def test_build_worker_command_passes_other_args_through():
    cmd = build_worker_command("tcp://h:8786", "30%", "1h", ["--nthreads", "2", "--no-nanny"])
    assert cmd[:3] == [sys.executable, "-m", "distributed.cli.dask_worker"]
    assert cmd[3:] == ["tcp://h:8786", "--nthreads", "2", "--no-nanny", "--preload",
                       "dask_research.montecarlo.power", "--battery-floor", "0.3",
                       "--budget", "3600"]
    assert build_worker_command("tcp://h:8786")[4:] == ["--preload", "dask_research.montecarlo.power"]


def test_preload_rejects_a_bad_floor():
    from distributed.cli.dask_worker import main as dask_worker

    result = CliRunner().invoke(dask_worker, ["tcp://127.0.0.1:1", "--preload",
                                              "dask_research.montecarlo.power",
                                              "--battery-floor", "150%"])
    assert result.exit_code == 2 and "'150%' is not a battery floor" in result.output


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="process groups")
def test_preload_and_worker_command_install_the_plugin(tmp_path):
    """A real scheduler, one `dask worker --preload ...` and one `dask-research worker ...`."""
    address = f"tcp://127.0.0.1:{_free_port()}"
    env = dict(os.environ, DASK_DISTRIBUTED__WORKER__DAEMON="False")
    common = ["--host", "127.0.0.1", "--no-dashboard"]
    spawn = dict(cwd=tmp_path, env=env, start_new_session=True,
                 stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    procs = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler",
                               "--host", "127.0.0.1", "--port", address.rsplit(":", 1)[1],
                               "--no-dashboard"], **spawn)]
    try:
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_worker", address, *common,
             "--nthreads", "1", "--name", "preloaded",
             "--preload", "dask_research.montecarlo.power", "--battery-floor", "30%",
             "--budget", "3600"], **spawn))
        procs.append(subprocess.Popen(
            [sys.executable, "-c", "from dask_research.montecarlo.power import worker_command; "
             "worker_command()", address, "--battery-floor", "0.25", *common,
             "--nthreads", "1", "--name", "wrapped", "--no-nanny"], **spawn))
        with Client(address, timeout=20) as client:
            client.wait_for_workers(2, timeout=20)
            plugins = client.run(lambda dask_worker: sorted(dask_worker.plugins))
            assert all("research-power" in names and "research-malloc-tuning" in names
                       for names in plugins.values()), plugins
            states = power_state(client)
            info = workers_info(client)
            by_name = {info[addr]["name"]: st for addr, st in states.items()}
            assert by_name["preloaded"]["battery_floor"] == 0.3
            assert by_name["preloaded"]["budget"] == 3600.0
            assert by_name["wrapped"]["battery_floor"] == 0.25
            assert by_name["wrapped"]["budget"] is None
            # This machine's real battery decides; either way the pool answers or pauses cleanly.
            for st in states.values():
                assert st["policy"] in ("running", "paused")
            # The first check waits until the worker is connected (preloads run before that).
            deadline = time.monotonic() + 10
            while not all(st["checks"] >= 1 for st in power_state(client).values()):
                assert time.monotonic() < deadline, power_state(client)
                time.sleep(0.05)
        # SIGTERM to the wrapper reaches its dask worker; it exits with the worker's code.
        wrapper = procs[2]
        wrapper.send_signal(signal.SIGTERM)
        assert wrapper.wait(timeout=15) is not None
    finally:
        for proc in reversed(procs):
            _stop(proc)


# ------------------------------------------------------------------------------ the Dask fence


def test_a_memory_monitor_without_its_pause_step_fails_the_setup_loudly():
    """If Dask moved ``_maybe_pause_or_unpause``, the guard would do nothing: set-up raises."""
    import types

    from dask_research._compat import DaskCompatError

    r = Readings()
    worker = types.SimpleNamespace(memory_manager=object(), status=Status.running)
    plugin = PowerPolicy(battery=r.battery, cpu_seconds=r.cpu_seconds, interval=3600)
    with pytest.raises(DaskCompatError, match="_maybe_pause_or_unpause"):
        plugin.setup(worker)


def test_transitions_are_events_in_the_shared_envelope():
    import types

    from dask_research.events import envelope

    logged = []
    worker = types.SimpleNamespace(address="tcp://w:1", status=Status.running,
                                   log_event=lambda topic, msg: logged.append((topic, msg)))
    plugin = PowerPolicy(battery_floor="30%", battery=lambda: (10.0, False), interval=3600)
    plugin.worker, plugin.policy = worker, "running"
    plugin.check()
    ((topic, msg),) = logged
    assert topic == "research.power" and worker.status == Status.paused
    assert list(msg)[:5] == list(envelope("power", "pause"))
    assert msg["source"] == "power" and msg["event"] == msg["action"] == "pause" and msg["run"] is None
    assert msg == plugin.transitions[-1]


# ------------------------------------------------------------------------------ audit regressions


def _checked_worker(**kwargs):
    """A policy on a stand-in worker (no cluster), set up as far as check() needs."""
    import types

    worker = types.SimpleNamespace(address="tcp://w:1", status=Status.running,
                                   log_event=lambda topic, msg: None)
    plugin = PowerPolicy(battery_floor="30%", interval=3600, **kwargs)
    plugin.worker, plugin.policy = worker, "running"
    return plugin, worker


@pytest.mark.parametrize("reading", [
    (float("nan"), False), (-3.0, False), (150.0, False), (10.0, False, 5), ("ten", False), 10.0,
])
def test_a_battery_reading_that_lies_is_absent_not_a_crash(reading):
    plugin, worker = _checked_worker(battery=lambda: reading)
    state = plugin.check()                         # before: raised, or paused/resumed on a lie
    assert state["battery_percent"] is None and state["plugged"] is None
    assert state["policy"] == "running" and worker.status == Status.running
    assert plugin._read_failed == {"battery"}     # warned once


def test_a_hanging_battery_reading_does_not_block_the_event_loop(monkeypatch):
    import threading

    from dask_research.montecarlo import power_policy

    monkeypatch.setattr(power_policy, "READ_TIMEOUT", 0.2, raising=False)
    release, hanging = threading.Event(), [True]

    def reader():                                  # a FIFO where /sys/.../capacity was
        if hanging[0]:
            release.wait(30)
        return (10.0, False)

    plugin, worker = _checked_worker(battery=reader)
    try:
        t = time.monotonic()
        for _ in range(getattr(power_policy, "MAX_STUCK_READS", 4) + 3):
            assert plugin.check()["battery_percent"] is None
        # each check waits READ_TIMEOUT at most, and not at all once MAX_STUCK_READS hang
        assert time.monotonic() - t < 0.2 * getattr(power_policy, "MAX_STUCK_READS", 4) + 2
        assert plugin._read_failed == {"battery"}
    finally:
        release.set()
    for thread in getattr(plugin, "_stuck_reads", []):
        thread.join(5)
    hanging[0] = False
    assert plugin.check()["policy"] == "paused"    # answering again: heard again


def test_a_sensor_that_stops_hanging_is_read_again(monkeypatch):
    from dask_research.montecarlo import power_policy

    monkeypatch.setattr(power_policy, "READ_TIMEOUT", 0.1, raising=False)
    monkeypatch.setattr(power_policy, "READ_RETRY", (0.5, 0.5), raising=False)
    stuck = getattr(power_policy, "MAX_STUCK_READS", 1)
    calls = []

    def reader():                                  # hangs `stuck` times, past those checks
        calls.append(1)
        if len(calls) <= stuck:
            time.sleep(5)
        return (10.0, False)

    plugin, worker = _checked_worker(battery=reader)
    for _ in range(stuck + 2):
        assert plugin.check()["policy"] == "running"
    assert len(calls) == stuck                     # not read while the hung ones hang...
    time.sleep(0.6)
    assert plugin.check()["policy"] == "paused" and worker.status == Status.paused  # ...until the retry


def test_budget_reaches_dask_worker_exactly():
    assert build_worker_command("tcp://h:8786", None, 1000001)[-2:] == ["--budget", "1000001"]
    assert build_worker_command("tcp://h:8786", None, "100000.5")[-1] == "100000.5"


def test_a_bad_configured_setting_stops_the_worker_before_it_starts(monkeypatch):
    from distributed.cli.dask_worker import main as dask_worker

    def no_worker(*args, **kwargs):
        raise AssertionError("a dask worker was started")

    monkeypatch.setattr(subprocess, "Popen", no_worker)
    for key, value in [("battery-floor", 30), ("budget", -1), ("interval", 0)]:
        with dask.config.set({f"research.power.{key}": value}):
            result = CliRunner().invoke(worker_command, ["tcp://127.0.0.1:1"])
            assert result.exit_code == 2, result.output
            assert f"config research.power.{key}={value!r} is invalid" in result.output
    with dask.config.set({"research.power.battery-floor": 30}):
        result = CliRunner().invoke(dask_worker, ["tcp://127.0.0.1:1", "--death-timeout", "1",
                                                  "--preload", "dask_research.montecarlo.power"])
    assert result.exit_code == 2 and "research.power.battery-floor=30 is invalid" in result.output


_FAKE_DASK_WORKER = """
import signal, sys, time
got = []
signal.signal(signal.SIGINT, lambda *a: got.append(1))
open(sys.argv[1], "w").close()
deadline = time.monotonic() + 20
while not got and time.monotonic() < deadline:
    time.sleep(0.01)
time.sleep(0.5)
sys.exit(10 + len(got))
"""


@pytest.mark.skipif(sys.platform == "win32", reason="process groups")
@pytest.mark.parametrize("how", ["kill -INT PID", "Ctrl-C"])
def test_sigint_reaches_dask_worker_once(tmp_path, how):
    ready = tmp_path / "ready"
    wrapper = (
        "import sys\nfrom dask_research.montecarlo import power_cli\n"
        f"power_cli.build_worker_command = lambda *a, **k: [sys.executable, '-c', {_FAKE_DASK_WORKER!r}, "
        f"{str(ready)!r}]\npower_cli.worker_command(['tcp://127.0.0.1:1'])\n")
    proc = subprocess.Popen([sys.executable, "-c", wrapper], start_new_session=True,  # as a shell
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        if how == "Ctrl-C":
            os.killpg(proc.pid, signal.SIGINT)     # the terminal's foreground group
        else:
            os.kill(proc.pid, signal.SIGINT)       # before: never forwarded; SIGKILL after 30 s
        assert proc.wait(timeout=15) == 11         # dask worker's exit code; one SIGINT
    finally:
        _stop(proc)


@pytest.mark.timeout(60, method="thread")
def test_the_periodic_check_awaits_a_hung_sensor_instead_of_blocking_the_workers_loop(monkeypatch):
    """The audit's left-over: a stuck battery sensor held the worker's event loop for up to
    READ_TIMEOUT per check (heartbeats, transfers and dispatch waited). The loop now keeps
    running other callbacks while the read is awaited; the policy still treats it as absent."""
    import asyncio
    import inspect
    import threading

    from dask_research.montecarlo import power_policy

    monkeypatch.setattr(power_policy, "READ_TIMEOUT", 1.0, raising=False)
    release = threading.Event()

    def reader():
        release.wait(30)
        return (10.0, False)

    plugin, worker = _checked_worker(battery=reader)
    plugin._ready = lambda: True

    async def scenario():
        beats = []

        async def heartbeat():
            while True:
                beats.append(1)
                await asyncio.sleep(0.01)

        hb = asyncio.create_task(heartbeat())
        await asyncio.sleep(0)
        before = len(beats)
        tick = plugin._tick()                  # the old tick joined the read thread right here
        if inspect.isawaitable(tick):
            await tick
        during = len(beats) - before
        hb.cancel()
        return during

    try:
        during = asyncio.run(scenario())
    finally:
        release.set()
    assert during >= 3, f"the loop ran {during} other callbacks while the sensor hung"
    assert plugin.battery_percent is None and plugin.policy == "running"
    assert plugin._read_failed == {"battery"}
    for thread in plugin._stuck_reads:
        thread.join(5)
    plugin.battery = lambda: (10.0, False)
    # An answering sensor is awaited until it answers; on a busy machine starting its thread
    # can take longer than the 1 s the hung phase needed.
    monkeypatch.setattr(power_policy, "READ_TIMEOUT", 30.0, raising=False)

    async def again():
        await plugin._tick()

    asyncio.run(again())                       # a sensor that answers is heard on the next tick
    assert plugin.policy == "paused" and worker.status == Status.paused
