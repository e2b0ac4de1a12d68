"""A single-node SLURM of this machine, for tests: ``munged``, ``slurmctld`` and ``slurmd``.

:func:`start_slurm` writes a ``slurm.conf`` in a temporary directory (one node with the cores
and memory ``slurmd -C`` reads from this machine, ``ProctrackType=proctrack/linuxproc``,
``TaskPlugin=task/none``), creates a MUNGE key, starts ``munged`` as user ``munge`` and the two
SLURM daemons in the foreground, and waits until ``sinfo`` shows the node idle. Nothing is
shared with a SLURM someone else runs on the machine: the ports are free ones picked now, the
MUNGE socket, state, spool, pid and log files are in the temporary directory, and clients find
the configuration through ``SLURM_CONF`` (:attr:`Slurm.env`). :meth:`Slurm.stop` stops every
daemon it started by its pid.

**Every exit path stops it.** A watchdog process starts first, in a session of its own, and
holds the read end of a pipe whose write end only this process has. When this process ends,
however it ends (a normal stop, Ctrl-C, SIGTERM, pytest-timeout's ``os._exit``, SIGKILL), the
pipe closes and the watchdog cancels the SLURM's jobs, stops its daemons (SIGTERM, then
SIGKILL), kills every process left whose environment names this SLURM's ``SLURM_CONF`` (the
jobs' processes and ``slurmstepd``) and removes the MUNGE directory. A daemon is only ever
signalled by its pid together with its start time, so a reused pid is never hit.

The pytest fixture ``slurm`` (session scope) is registered by ``tests/deploy/conftest.py``
from :func:`slurm_fixture`; it skips, saying why, where the packages (Debian ``slurm-wlm``
and ``munge``), dask-jobqueue or root are missing.

Examples
--------
>>> slurm = start_slurm("/tmp/slurm-test")           # doctest: +SKIP
>>> subprocess.run(["sinfo"], env=slurm.env)          # doctest: +SKIP
>>> slurm.stop()                                      # doctest: +SKIP
"""
from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from .processes import free_ports

__all__ = ["Slurm", "SlurmUnavailable", "missing", "node_hardware", "start_slurm", "slurm_fixture"]

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scancel", "sinfo")
PARTITION = "debug"


class SlurmUnavailable(RuntimeError):
    """This machine cannot run the test SLURM (packages or privileges missing)."""


def _which(name: str) -> str | None:
    return shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/sbin/{name}")
                                       if os.access(p, os.X_OK)), None)


def _program(name: str) -> str:
    """The path of SLURM or MUNGE program ``name``; :class:`SlurmUnavailable` when absent."""
    path = _which(name)
    if path is None:
        raise SlurmUnavailable(f"{name} is not installed (apt-get install slurm-wlm munge)")
    return path


def missing() -> str | None:
    """Why a test SLURM cannot start here, or ``None`` if it can."""
    absent = [n for n in DAEMONS + CLIENTS if _which(n) is None]
    if absent:
        return (f"SLURM is not installed ({', '.join(absent)} missing): "
                "apt-get install slurm-wlm munge")
    if os.geteuid() != 0:
        return "the test SLURM needs root (slurmd starts jobs, munged runs as user munge)"
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return "there is no user munge (the munge package creates it)"
    return None


def node_hardware() -> dict[str, int]:
    """CPUs and RealMemory (MiB) of this machine, as ``slurmd -C`` reads them."""
    out = subprocess.run([_program("slurmd"), "-C"], capture_output=True, text=True, timeout=30).stdout
    fields = dict(re.findall(r"(\w+)=(\S+)", out.splitlines()[0] if out else ""))
    cpus = int(fields.get("CPUs") or os.cpu_count() or 1)
    memory = int(fields.get("RealMemory") or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20)
    return {"CPUs": cpus, "RealMemory": memory}


@dataclass
class Slurm:
    """A running test SLURM: its directory, configuration, node and daemons."""

    root: str
    conf: str
    node: str
    partition: str
    cpus: int
    memory_mb: int
    munge_dir: str = ""
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    watchdog: subprocess.Popen | None = None
    _watch_fd: int | None = None

    @property
    def env(self) -> dict[str, str]:
        """This process's environment with ``SLURM_CONF`` pointing at this SLURM (and
        dask-jobqueue's worker-job logs going to its ``jobs`` directory)."""
        return {**os.environ, "SLURM_CONF": self.conf,
                "DASK_JOBQUEUE__SLURM__LOG_DIRECTORY": os.path.join(self.root, "jobs")}

    def run(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
        """Run a SLURM client command (``squeue``, ``scancel``, ...) against this SLURM."""
        return subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=timeout)

    def jobs(self, state: str | None = None) -> list[dict[str, str]]:
        """The jobs in the queue: ``{"id", "name", "state"}`` each (``state``: only those)."""
        out = self.run("squeue", "-h", "-o", "%i|%j|%T").stdout
        rows = [dict(zip(("id", "name", "state"), line.split("|"))) for line in out.splitlines() if line]
        return [r for r in rows if state is None or r["state"] == state]

    def node_state(self) -> str:
        return self.run("sinfo", "-h", "-N", "-o", "%t").stdout.strip()

    def wait_idle(self, timeout: float = 60.0) -> None:
        """Wait until no job is queued and the node is idle."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.jobs() and self.node_state() == "idle":
                return
            time.sleep(0.25)
        raise AssertionError(f"SLURM not idle after {timeout} s: {self.jobs()} node {self.node_state()!r}")

    def log(self, daemon: str) -> str:
        path = os.path.join(self.root, "log", f"{daemon}.log")
        try:
            with open(path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def stop(self) -> None:
        """Cancel every job, then stop each daemon this SLURM started, by its pid."""
        if self.procs.get("slurmctld") is not None and self.procs["slurmctld"].poll() is None:
            try:
                self.run("scancel", "--full", f"--partition={self.partition}", timeout=10)
            except (OSError, subprocess.SubprocessError):
                pass
        for name in ("slurmd", "slurmctld", "munged"):
            p = self.procs.get(name)
            if p is None or p.poll() is not None:
                continue
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
        if self.munge_dir and all(p.poll() is not None for p in self.procs.values()):
            shutil.rmtree(self.munge_dir, ignore_errors=True)
        self._release_watchdog()

    def _tell_watchdog(self, line: str) -> None:
        if self._watch_fd is not None:
            os.write(self._watch_fd, (line + "\n").encode())

    def _release_watchdog(self) -> None:
        """Close the watchdog's pipe: it sweeps whatever is left (nothing, after a stop) and exits."""
        fd, self._watch_fd = self._watch_fd, None
        if fd is not None:
            os.close(fd)
        if self.watchdog is not None:
            try:
                self.watchdog.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.watchdog.kill()
                self.watchdog.wait(timeout=10)


#: The watchdog (run as ``python -c``, stdlib only): reads ``pid PID START``, ``conf PATH``,
#: ``munge DIR``, ``scancel PATH`` and ``partition NAME`` lines from the pipe until it closes or its parent is gone,
#: then stops everything it was told about (see the module docstring).
_WATCHDOG = r"""
import os, select, shutil, signal, subprocess, sys, time

fd, parent = int(sys.argv[1]), int(sys.argv[2])

def start_time(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == b"Z" else fields[19].decode()   # a zombie has ended

parent_start = start_time(parent)
pids, confs, munge, scancel, partition, buf = [], [], [], [], [], b""
while True:
    ready, _, _ = select.select([fd], [], [], 1.0)
    if ready:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            kind, _, rest = line.decode().partition(" ")
            if kind == "pid":
                pid, start = rest.split()
                pids.append((int(pid), start))
            elif kind == "conf":
                confs.append(rest)
            elif kind == "munge":
                munge.append(rest)
            elif kind == "scancel":
                scancel.append(rest)
            elif kind == "partition":
                partition.append(rest)
    elif start_time(parent) != parent_start:
        break                        # the parent ended while a forked child still holds the pipe

def alive():
    return [(pid, start) for pid, start in pids if start_time(pid) == start]

def strays():
    # Every process whose environment names this SLURM: its jobs, slurmstepd, the daemons.
    marks = [b"\0SLURM_CONF=" + c.encode() + b"\0" for c in confs]
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in (os.getpid(), 1):
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = b"\0" + f.read() + b"\0"
        except OSError:
            continue
        if any(m in env for m in marks):
            start = start_time(int(name))
            if start is not None:
                out.append((int(name), start))
    return out

def signal_all(targets, sig):
    for pid, start in targets:
        if start_time(pid) == start:
            try:
                os.kill(pid, sig)
            except OSError:
                pass

if alive() and confs and scancel and partition:
    for conf in confs:
        try:
            subprocess.run([scancel[0], "--full", "--quiet", f"--partition={partition[0]}"],
                           env={**os.environ, "SLURM_CONF": conf},
                           timeout=10, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except Exception:
            pass
signal_all(alive(), signal.SIGTERM)
deadline = time.monotonic() + 20
while alive() and time.monotonic() < deadline:
    time.sleep(0.1)
for _ in range(3):
    left = alive() + strays()
    if not left:
        break
    signal_all(left, signal.SIGKILL)
    time.sleep(0.2)
for d in munge:
    shutil.rmtree(d, ignore_errors=True)
"""


def _start_time(pid: int) -> str | None:
    """Field 22 of ``/proc/PID/stat`` (when the process started, in clock ticks after boot)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def _start_watchdog(slurm: Slurm) -> None:
    """Start the watchdog of ``slurm`` (before any daemon): see the module docstring."""
    read_fd, write_fd = os.pipe()                 # neither end is inherited by exec'd children
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    log = open(os.path.join(slurm.root, "log", "watchdog.log"), "wb")
    try:
        slurm.watchdog = subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(read_fd), str(os.getpid())],
                                          pass_fds=(read_fd,), stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT, env=env, start_new_session=True)
    finally:
        os.close(read_fd)
        log.close()
    slurm._watch_fd = write_fd
    slurm._tell_watchdog(f"conf {slurm.conf}")
    slurm._tell_watchdog(f"munge {slurm.munge_dir}")
    scancel = _which("scancel")
    if scancel:
        slurm._tell_watchdog(f"scancel {scancel}")
    slurm._tell_watchdog(f"partition {slurm.partition}")


def _conf_text(root: str, node: str, hw: dict[str, int], ports: list[int], munge_socket: str) -> str:
    d = lambda *p: os.path.join(root, *p)  # noqa: E731
    return f"""# A single-node SLURM for dask-research's tests (dask_research.testing.slurm)
ClusterName=daskresearch{ports[0]}
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ports[0]}
SlurmdPort={ports[1]}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={d('state')}
SlurmdSpoolDir={d('spool', '%n')}
SlurmctldPidFile={d('run', 'slurmctld.pid')}
SlurmdPidFile={d('run', 'slurmd.pid')}
SlurmctldLogFile={d('log', 'slurmctld.log')}
SlurmdLogFile={d('log', 'slurmd.log')}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=5
SlurmctldDebug=info
SlurmdDebug=info
NodeName={node} NodeAddr=127.0.0.1 CPUs={hw['CPUs']} RealMemory={hw['RealMemory']} State=UNKNOWN
PartitionName={PARTITION} Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
"""


def start_slurm(root: str, timeout: float = 60.0) -> Slurm:
    """Start a single-node SLURM whose files all live under ``root``; see the module docs.

    Raises :class:`SlurmUnavailable` (with the reason) where this machine cannot run it, and
    ``RuntimeError`` with the daemons' logs if it does not come up within ``timeout`` seconds.
    """
    why = missing()
    if why:
        raise SlurmUnavailable(why)
    root = os.path.abspath(root)
    munge = pwd.getpwnam("munge")
    for sub in ("state", "spool", "run", "log", "jobs"):
        os.makedirs(os.path.join(root, sub), exist_ok=True)
    # MUNGE's files in a directory of their own that user munge can reach (``root`` may lie
    # under a private directory, such as pytest's); a short path, for the socket's sake.
    mdir = tempfile.mkdtemp(prefix="dask-research-munge-")
    os.chmod(mdir, 0o700)
    key = os.path.join(mdir, "munge.key")
    with open(key, "wb") as f:
        f.write(os.urandom(1024))
    os.chmod(key, 0o600)
    for path in (mdir, key):
        os.chown(path, munge.pw_uid, munge.pw_gid)
    munge_socket = os.path.join(mdir, "munge.socket")
    node = socket.gethostname().split(".")[0]
    hw = node_hardware()
    ports = free_ports(2)
    conf = os.path.join(root, "slurm.conf")
    with open(conf, "w") as conf_file:
        conf_file.write(_conf_text(root, node, hw, ports, munge_socket))
    slurm = Slurm(root=root, conf=conf, node=node, partition=PARTITION, cpus=hw["CPUs"],
                  memory_mb=hw["RealMemory"], munge_dir=mdir)
    env = slurm.env
    logs = os.path.join(root, "log")

    def spawn(name: str, args: list[str], **kw) -> None:
        out = open(os.path.join(logs, f"{name}.stdout"), "wb")
        try:
            p = slurm.procs[name] = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT,
                                                     cwd=root, start_new_session=True, **kw)
        finally:
            out.close()
        start = _start_time(p.pid)
        if start is not None:
            slurm._tell_watchdog(f"pid {p.pid} {start}")

    try:
        _start_watchdog(slurm)
        spawn("munged", [_program("munged"), "--foreground", "--force", f"--socket={munge_socket}",
                         f"--key-file={key}", f"--pid-file={os.path.join(mdir, 'munged.pid')}",
                         f"--log-file={os.path.join(mdir, 'munged.log')}",
                         f"--seed-file={os.path.join(mdir, 'munged.seed')}"],
              user=munge.pw_uid, group=munge.pw_gid, extra_groups=[])
        _wait(lambda: os.path.exists(munge_socket), 20, "munged's socket", slurm)
        spawn("slurmctld", [_program("slurmctld"), "-D", "-i", "-f", conf])
        spawn("slurmd", [_program("slurmd"), "-D", "-f", conf, "-N", node])
        _wait(lambda: slurm.node_state() == "idle", timeout, "sinfo to show the node idle", slurm)
    except BaseException:
        slurm.stop()
        raise
    return slurm


def _wait(predicate, timeout: float, what: str, slurm: Slurm) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name, p in slurm.procs.items():
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited with {p.returncode} while waiting for {what}:\n"
                                   f"{_logs(slurm)}")
        try:
            if predicate():
                return
        except (OSError, subprocess.SubprocessError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"timed out after {timeout} s waiting for {what}:\n{_logs(slurm)}")


def _logs(slurm: Slurm) -> str:
    parts = []
    for name in ("munged", "slurmctld", "slurmd"):
        for path in (os.path.join(slurm.root, "log", f"{name}.log"), os.path.join(slurm.root, "log", f"{name}.stdout"),
                     os.path.join(slurm.munge_dir, "munged.log")):
            if name in os.path.basename(path) and os.path.exists(path):
                with open(path, errors="replace") as f:
                    parts.append(f"--- {path}\n" + "".join(f.readlines()[-15:]))
    return "\n".join(parts)


def slurm_fixture(tmp_path_factory) -> Iterator[Slurm]:
    """Body of the session fixture ``slurm``: start it (or skip, saying why), stop it after.

    While it lives, ``SLURM_CONF`` in this process points at it (so in-process dask-jobqueue
    clusters and the clients they call find it) and dask-jobqueue writes the worker jobs' logs
    into its directory, not the working directory.
    """
    import pytest

    why = missing()
    if why is None:
        try:
            import dask_jobqueue  # noqa: F401
        except ImportError:
            why = "dask-jobqueue is not installed: pip install 'dask-research[hpc]'"
    if why:
        pytest.skip(why)
    import dask

    slurm = start_slurm(str(tmp_path_factory.mktemp("slurm")))
    saved = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = slurm.conf
    jobs_dir = os.path.join(slurm.root, "jobs")
    try:
        with dask.config.set({"jobqueue.slurm.log-directory": jobs_dir}):
            yield slurm
    finally:
        slurm.stop()
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved
