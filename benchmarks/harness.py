"""Common benchmark harness: timing, machine description and JSON figures.

Each benchmark script runs ours and the peer side by side in one process run, prints ratios
and writes its figures with :func:`write_results` to ``benchmarks/results/<name>.json``
together with the machine it ran on. Speed is never asserted in tests.

Run benchmarks one at a time (``flock /tmp/dask-research-bench.lock python benchmarks/x.py``)
so two of them do not share the cores.

What a benchmark needs beyond the package is declared in its docstring and in setup.cfg's
``bench`` extra; :func:`missing` and :func:`require` turn an absent optional dependency into
one line that says what is skipped and how to install it, instead of a traceback.

Example
-------
>>> from benchmarks.harness import median_time, missing
>>> t = median_time(lambda: sum(range(1000)), repeat=3, number=10)
>>> t > 0
True
>>> missing("numpy", "no_such_package")
'no_such_package'
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

RESULTS = pathlib.Path(__file__).resolve().parent / "results"


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _proc_stat_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine, for a foreign-load estimate."""
    try:
        fields = [float(x) for x in open("/proc/stat").readline().split()[1:]]
    except OSError:
        return 0.0, 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
    total = sum(fields)
    return total - idle, total


def missing(*modules: str) -> str | None:
    """The first of ``modules`` (import names) that is not installed here, or ``None``."""
    for name in modules:
        try:
            if importlib.util.find_spec(name) is None:
                return name
        except (ImportError, ValueError):
            return name
    return None


def require(*modules: str, benchmark: str, skipping: str | None = None) -> bool:
    """Whether ``modules`` are all installed; if not, print one line naming the missing one.

    ``skipping`` names the part of ``benchmark`` that is left out (the rest still runs); without
    it the benchmark cannot run at all and ``SystemExit`` ends it with status 2.
    """
    absent = missing(*modules)
    if absent is None:
        return True
    what = f"skipping {skipping}" if skipping else "cannot run"
    line = f"{benchmark}: {what}: {absent} is not installed (pip install -e '.[bench]')"
    print(line, file=sys.stdout if skipping else sys.stderr, flush=True)
    if skipping is None:
        raise SystemExit(2)
    return False


def machine() -> dict[str, Any]:
    """Describe the machine and software a figure was measured on."""
    versions = {}
    for mod in ("numpy", "dask", "distributed", "torch", "torchrl", "optuna", "cupy"):
        m = sys.modules.get(mod)
        if m is None:
            try:
                m = __import__(mod)
            except Exception:
                continue
        versions[mod] = getattr(m, "__version__", "?")
    try:
        import dask_research

        versions["dask_research"] = dask_research.__version__
    except Exception:
        pass
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        mem = None
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_bytes": mem,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": versions,
    }


def load_averages() -> str:
    """The 1, 5 and 15 minute load averages (``/proc/loadavg``), to record beside the figures."""
    try:
        return " ".join(pathlib.Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def median_time(fn: Callable[[], Any], repeat: int = 3, number: int = 1) -> float:
    """Median over ``repeat`` runs of the mean seconds per call of ``fn`` (``number`` calls)."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - t0) / number)
    return statistics.median(times)


class LoadMonitor:
    """Measure how busy the machine was during a block (all processes, 0..1 of all cores)."""

    def __enter__(self):
        self._b0, self._t0 = _proc_stat_busy()
        self._c0 = time.process_time()
        self._w0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        b1, t1 = _proc_stat_busy()
        self.machine_busy = (b1 - self._b0) / (t1 - self._t0) if t1 > self._t0 else float("nan")
        wall = time.perf_counter() - self._w0
        cores = os.cpu_count() or 1
        self.own_busy = (time.process_time() - self._c0) / (wall * cores) if wall > 0 else 0.0
        return False


def write_results(name: str, figures: dict[str, Any], notes: str = "") -> pathlib.Path:
    """Write ``figures`` with the machine description to ``benchmarks/results/<name>.json``."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {
        "benchmark": name,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        "figures": figures,
        "notes": notes,
    }
    path.write_text(json.dumps(payload, indent=2, sort_keys=False, default=float) + "\n")
    return path


def finish(args: argparse.Namespace, figures: dict[str, Any], load: LoadMonitor, notes: str = "") -> dict[str, Any]:
    """The end of a benchmark's ``main``: record how busy the machine was in ``figures``, write
    them to ``benchmarks/results/<args.name>.json`` unless ``args.no_write``, say where."""
    figures["machine_busy"] = load.machine_busy
    if not args.no_write:
        print(f"\nwrote {write_results(args.name, figures, notes=notes)}")
    return figures


def update_results(name: str, figures: dict[str, Any], notes: str = "") -> pathlib.Path:
    """Merge ``figures`` (top-level keys replaced) into ``benchmarks/results/<name>.json``.

    For re-running some sections of a benchmark: the other figures are kept, the machine
    description and ``measured_at`` of the updated keys go with them (``updated``).
    """
    path = RESULTS / f"{name}.json"
    try:
        payload = json.loads(path.read_text())
    except (OSError, ValueError):
        return write_results(name, figures, notes)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    payload.setdefault("figures", {}).update(figures)
    payload.setdefault("updated", {}).update(
        {k: {"measured_at": stamp, "machine": machine()} for k in figures})
    if notes:
        payload["notes"] = notes
    path.write_text(json.dumps(payload, indent=2, sort_keys=False, default=float) + "\n")
    return path


def print_table(rows: list[tuple], header: tuple) -> None:
    """Print a small aligned table."""
    rows = [tuple(str(c) for c in r) for r in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print("  ".join(str(h).ljust(w) for h, w in zip(header, widths)))
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))


def run_section(name: str, description: str, add_arguments: Callable[[argparse.ArgumentParser], None],
                measure: Callable[[argparse.Namespace], dict[str, Any]], notes: str = "",
                argv: list[str] | None = None) -> pathlib.Path:
    """Run one section of a benchmark that several scripts share (``bench_experiments_*``).

    Parses ``--quick`` and the section's own options, measures under a :class:`LoadMonitor`,
    prints the machine's load, and merges the section's figures into
    ``benchmarks/results/<name>.json`` with :func:`update_results` (the other sections'
    figures stay).
    """
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--quick", action="store_true", help="fewer reps and experiments")
    add_arguments(ap)
    args = ap.parse_args(argv)
    with LoadMonitor() as load:
        figures = measure(args)
    print(f"\nmachine busy {100 * load.machine_busy:.0f} %, this process {100 * load.own_busy:.0f} %")
    path = update_results(name, figures, notes=notes)
    print(f"wrote {path}")
    return path

