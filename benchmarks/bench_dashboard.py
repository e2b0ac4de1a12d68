"""Benchmark of the dashboard: the Shards page's CPU per update, and the research plugin's CPU per logged event.

A run of N shards (10^4 ... 10^8) whose event log holds its ``start`` and 1,000 ``accepted``
blocks; each row is the CPU time (``time.process_time``, so other load on a shared machine does
not count) of one :meth:`ShardBoard.update` in the steady state (nothing new logged, and one
new block logged since the last update), side by side with the per-shard array the page built
on every update before issue 28 (the peer: ``np.zeros(N)`` filled from every event, then grouped
into the same cells). The page must cost a few ms per update whatever N.

Second section, the research plugin (:class:`~dask_research.dashboard.plugin.ResearchEventsPlugin`,
whose ``log_event`` hook a scheduler calls for every event it logs): two real in-process
schedulers (``distributed.Scheduler``), one with the plugin installed (:func:`~dask_research.dashboard.plugin.install`)
and the peer without it, log the same events (``Scheduler.log_event`` called on the schedulers'
event loop, as the events handler does); each row is the thread CPU (``time.thread_time``) per
logged event, median over alternating repetitions, with and without the plugin. Event kinds:
Monte-Carlo ``accepted`` blocks of runs of 10^4, 10^6 and 10^8 shards (1,000 blocks a run),
experiments ``select`` / ``dispatch`` / ``result`` entries (8 slots, 100 branches, the best 32
scores in a ``select``) one log entry each and as ``batch`` entries of 30 (what the experiments
outbox ships), replay ``stats``, and an event of a topic the plugin does not read. Also the
memory the plugin allocates and keeps (tracemalloc) after 10^5 events of each kind.

The Shards section needs bokeh (the ``[dashboard]`` extra; without it only the plugin section
runs, and the Shards figures in the JSON stay as they were, as do those ``--quick`` leaves out).
Run one benchmark at a time::

    flock /tmp/dask-research-bench.lock python benchmarks/bench_dashboard.py [--quick]

Figures in ``benchmarks/results/bench_dashboard.json``.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import math
import pathlib
import random
import sys
import time
import tracemalloc

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.harness import (  # noqa: E402
    LoadMonitor,
    load_averages,
    print_table,
    require,
    update_results,
    write_results,
)

NOTES = ("Shards page (keys 10000 ... 100000000): CPU seconds (process_time) per update, median of 5; "
         "'new block' = one accepted event logged since the last update; the per-shard peer is the page "
         "before issue 28. plugin_per_event: thread CPU (thread_time) microseconds per Scheduler.log_event "
         "call on a real in-process distributed.Scheduler with the research plugin installed ('with') and "
         "on an identical one without it ('without', the peer), median over alternating repetitions; "
         "memory_after_1e5_events: bytes the plugin allocated and still holds (tracemalloc) after 10^5 "
         "events of a kind fed to its log_event hook")


class _Scheduler:
    """What the page reads of a scheduler: its event log (a real log's tuples), tasks and clients."""

    def __init__(self, events: list):
        self.log = [(float(i), m) for i, m in enumerate(events)]
        self.tasks: dict = {}
        self.clients: dict = {}

    def get_events(self, topic):
        return tuple(self.log)


def _events(n: int, blocks: int = 1000) -> list:
    step = max(1, n // blocks)
    out = [{"event": "start", "run": "r", "shards": n, "key_prefix": "p", "name": "bench"}]
    for a in range(0, min(n, step * (blocks - 1)), step):
        out.append({"event": "accepted", "run": "r", "start": a, "stop": a + step, "mean": 0.5, "stderr": 0.01,
                    "n": a + step})
    return out


def per_shard_peer(events: list, max_cells: int = 4096) -> list:
    """The page before issue 28: a per-shard array from every event, grouped into cells."""
    n = events[0]["shards"]
    states = np.zeros(n, dtype=np.int8)
    for msg in events[1:]:
        states[msg["start"]:msg["stop"]] = 2
    group = max(1, math.ceil(n / max_cells))
    cells = math.ceil(n / group)
    padded = np.full(cells * group, -1, dtype=np.int16)
    padded[:n] = states
    return padded.reshape(cells, group).max(axis=1).tolist()


def _cpu(fn, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return sorted(times)[len(times) // 2]


def shards_section(quick: bool) -> tuple[dict, list]:
    """The Shards page's update CPU by run size (needs bokeh)."""
    from dask_research.dashboard.components import ShardBoard

    sizes = [10**4, 10**6, 10**7] + ([] if quick else [10**8])
    rows, figures = [], {}
    for n in sizes:
        events = _events(n)
        sched = _Scheduler(events)
        board = ShardBoard(sched)
        board.update()                                   # the first look folds in the whole log
        idle = _cpu(board.update)
        new = _cpu(lambda sched=sched, board=board: (
            sched.log.append((1e6 + len(sched.log), {"event": "accepted", "run": "r", "start": 0, "stop": 1})),
            board.update()))
        peer = _cpu(lambda events=events: per_shard_peer(events), repeat=3 if n >= 10**8 else 5)
        figures[str(n)] = {"ours_idle_s": idle, "ours_new_block_s": new, "per_shard_peer_s": peer,
                           "peer_over_ours": peer / max(new, 1e-9)}
        rows.append((f"{n:,}", f"{idle * 1e3:.2f}", f"{new * 1e3:.2f}", f"{peer * 1e3:.1f}", f"{peer / max(new, 1e-9):.0f}x"))
    print_table(rows, ("shards", "ours, idle (ms)", "ours, 1 new block (ms)", "per-shard peer (ms)", "peer/ours"))
    return figures, rows


# -- the research plugin's CPU per logged event -------------------------------------------------

#: Slots, branches and scores per ``select`` of the experiments stream (LOG_TOP_SCORES is 32).
SLOTS, BRANCHES, TOP_SCORES = 8, 100, 32
#: Events per ``batch`` entry of the batched experiments stream.
BATCH = 30


def _mc_stream(n: int, count: int) -> tuple[list, list]:
    """A Monte-Carlo run of ``n`` shards: its ``start`` (set-up) and ``count`` ``accepted`` blocks
    (the 1,000-block run's blocks, again and again: full cells cost what empty ones do)."""
    events = _events(n)
    blocks = events[1:]
    return [events[0]], [blocks[i % len(blocks)] for i in range(count)]


def _experiment_events(count: int, run: str = "x") -> tuple[list, list]:
    """An experiments run as its driver logs it (:func:`dask_research.experiments.recorder.log_records`):
    an ``add`` and ``SLOTS`` dispatches (set-up), then ``result`` / ``select`` / ``dispatch`` per
    experiment, ``count`` events in all."""
    rng = random.Random(0)
    names = [f"branch-{i:03d}" for i in range(BRANCHES)]
    runs = dict.fromkeys(names, 0)
    seq, t, queued = 0, 0.0, 1000
    hyp = 0

    def ev(kind: str, **fields) -> dict:
        nonlocal seq
        seq += 1
        return {"seq": seq, "t": round(t, 9), "event": kind, "run": run, **fields, "queued": queued}

    def select_dispatch(slot: int) -> list:
        nonlocal hyp, queued
        b = names[rng.randrange(BRANCHES)]
        top = rng.sample(names, TOP_SCORES)
        scores = {name: 0.5 + rng.random() for name in top}
        h = f"{b}-h{hyp}"
        hyp += 1
        queued -= 1
        return [ev("select", branch=b, hypothesis=h, score=scores.get(b, 1.0), scores=scores,
                   scores_truncated=BRANCHES),
                ev("dispatch", branch=b, hypothesis=h, slot=slot)], (b, h)

    setup = [ev("add", n=queued, nbranches=BRANCHES)]
    holding = {}
    for slot in range(SLOTS):
        out, held = select_dispatch(slot)
        setup += out
        holding[slot] = held
    stream: list = []
    while len(stream) < count:
        t += 0.05
        slot = rng.randrange(SLOTS)
        b, h = holding[slot]
        runs[b] += 1
        stream.append(ev("result", branch=b, hypothesis=h, slot=slot, reward=rng.random(),
                         duration=0.4 + rng.random(), mean=rng.random(), runs=runs[b]))
        out, holding[slot] = select_dispatch(slot)
        stream += out
    return setup, stream[:count]


def _replay_stream(count: int) -> list:
    """``stats`` events of one plane every 0.5 s (what :mod:`dask_research.replay.stats_publisher` logs)."""
    from dask_research.events import envelope

    return [envelope("replay", "stats", None, time=1e9 + 0.5 * i, plane="learner-0", t=1e9 + 0.5 * i,
                     size=min(i * 100, 10**6), capacity=10**6, inserted=i * 100, sampled=i * 400,
                     tiers=[{"name": "device", "rows": 10**5, "used": min(i * 100, 10**5)},
                            {"name": "host", "rows": 9 * 10**5, "used": max(0, min(i * 100, 10**6) - 10**5)}],
                     exposed_mean_s=0.001, exposed_p99_s=0.004, step_mean_s=0.02, batches=i)
            for i in range(count)]


def _kinds(per_timing: int, reps: int) -> list[dict]:
    """Each event kind: its topic, the entries logged before timing, the entries timed (``reps``
    chunks of ``per_timing`` events: fewer entries where an entry holds several) and how many
    events each entry holds."""
    from dask_research.events import batch, topic

    mc, ex, rp = topic("montecarlo"), topic("experiments"), topic("replay")
    total = per_timing * reps
    kinds = []
    for n, label in ((10**4, "1e4"), (10**6, "1e6"), (10**8, "1e8")):
        setup, stream = _mc_stream(n, total)
        kinds.append({"key": f"montecarlo_accepted_{label}", "label": f"Monte-Carlo accepted, {n:,} shards",
                      "topic": mc, "setup": setup, "stream": stream, "events_per_entry": 1})
    setup, stream = _experiment_events(total)
    kinds.append({"key": "experiments_single", "label": "experiments select/dispatch/result, 1 per entry",
                  "topic": ex, "setup": setup, "stream": stream, "events_per_entry": 1})
    setup, stream = _experiment_events(total)
    kinds.append({"key": f"experiments_batch_{BATCH}",
                  "label": f"experiments, batch entries of {BATCH}",
                  "topic": ex, "setup": [batch("experiments", "x", setup)],
                  "stream": [batch("experiments", "x", stream[i:i + BATCH]) for i in range(0, len(stream), BATCH)],
                  "events_per_entry": BATCH, "per_timing": per_timing // BATCH})
    kinds.append({"key": "replay_stats", "label": "replay stats, 1 plane",
                  "topic": rp, "setup": [], "stream": _replay_stream(total), "events_per_entry": 1})
    kinds.append({"key": "other_topic", "label": "a topic the plugin does not read",
                  "topic": "dask-research-bench.other", "setup": [],
                  "stream": [{"action": "bench", "i": i} for i in range(total)], "events_per_entry": 1})
    return kinds


async def _time_plugin(kinds: list[dict], per_timing: int, reps: int) -> dict:
    """Per kind: median thread CPU per entry with the plugin and without (two real schedulers)."""
    from distributed import Scheduler

    kw = {"dashboard": False, "dashboard_address": "127.0.0.1:0", "host": "127.0.0.1", "port": 0,
          "validate": False}
    quiet = logging.getLogger("distributed.scheduler")
    level = quiet.level
    quiet.setLevel(logging.WARNING)              # not the schedulers' start and close lines
    try:
        async with Scheduler(**kw) as with_s, Scheduler(**kw) as without_s:
            return await _time_sides(with_s, without_s, kinds, per_timing, reps)
    finally:
        quiet.setLevel(level)


async def _time_sides(with_s, without_s, kinds: list[dict], per_timing: int, reps: int) -> dict:
    """:func:`_time_plugin` on its two schedulers: the plugin installed on ``with_s``; the entries of
    each kind logged in chunks on both, alternating which goes first."""
    from dask_research.dashboard.plugin import folds_of, install

    out: dict = {}
    if install(with_s) is None or folds_of(with_s) is None:
        raise SystemExit("bench_dashboard: the research plugin could not be installed on the scheduler")
    if folds_of(without_s) is not None:
        raise SystemExit("bench_dashboard: the peer scheduler runs the research plugin too")
    sides = {"with": with_s, "without": without_s}
    for kind in kinds:
        name, setup, stream = kind["topic"], kind["setup"], kind["stream"]
        per = kind.get("per_timing", per_timing)
        for s in sides.values():
            for msg in setup:
                s.log_event(name, msg)
        times: dict[str, list] = {"with": [], "without": []}
        for rep in range(reps):
            chunk = stream[rep * per:(rep + 1) * per]
            order = ("with", "without") if rep % 2 == 0 else ("without", "with")
            for side in order:
                log = sides[side].log_event
                t0 = time.thread_time()
                for msg in chunk:
                    log(name, msg)
                times[side].append((time.thread_time() - t0) / len(chunk))
            await asyncio.sleep(0)               # let the loop breathe between repetitions
        med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
        out[kind["key"]] = med
    fold = folds_of(with_s)
    out["_fed"] = {k: getattr(f, "fed", None) for k, f in fold.items()}
    return out


def _memory(count: int) -> dict:
    """Bytes the plugin allocated and still holds (tracemalloc) after ``count`` events of a kind
    fed to its ``log_event`` hook; the events themselves are made before tracing starts (the
    plugin's references to a few of them, such as the run's ``start``, are the producer's)."""
    from dask_research.dashboard.plugin import ResearchEventsPlugin
    from dask_research.events import topic

    streams = {
        "montecarlo_1e8": (topic("montecarlo"), sum(_mc_stream(10**8, count - 1), [])),
        "experiments": (topic("experiments"), sum(_experiment_events(count - 1 - SLOTS * 2), [])),
        "replay_stats": (topic("replay"), _replay_stream(count)),
    }
    out = {}
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        empty = ResearchEventsPlugin()
        gc.collect()
        out["empty_plugin"] = tracemalloc.get_traced_memory()[0] - base
        del empty
        for key, (name, events) in streams.items():
            gc.collect()
            base = tracemalloc.get_traced_memory()[0]
            plugin = ResearchEventsPlugin()
            for msg in events:
                plugin.log_event(name, msg)
            del msg
            gc.collect()
            out[key] = {"events": len(events), "bytes": tracemalloc.get_traced_memory()[0] - base}
            del plugin
    finally:
        tracemalloc.stop()
    return out


def plugin_section(quick: bool) -> tuple[dict, list]:
    """The research plugin's scheduler CPU per logged event, with and without it."""
    per_timing, reps = (1000, 7) if quick else (2000, 21)
    kinds = _kinds(per_timing, reps)
    with LoadMonitor() as load:
        timed = asyncio.run(_time_plugin(kinds, per_timing, reps))
    memory = _memory(10**5)
    kinds_out, rows = {}, []
    for kind in kinds:
        med = timed[kind["key"]]
        w, wo = med["with"] * 1e6, med["without"] * 1e6
        k = kind["events_per_entry"]
        kinds_out[kind["key"]] = {
            "label": kind["label"], "events_per_entry": k, "entries_per_timing": kind.get("per_timing", per_timing),
            "with_us_per_entry": w, "without_us_per_entry": wo, "added_us_per_entry": w - wo,
            "with_us_per_event": w / k, "without_us_per_event": wo / k, "added_us_per_event": (w - wo) / k,
            "with_over_without": w / max(wo, 1e-9)}
        rows.append((kind["label"], f"{w / k:.2f}", f"{wo / k:.2f}", f"{(w - wo) / k:+.2f}",
                     f"{w / max(wo, 1e-9):.2f}x", f"{(w - wo):+.1f}" if k > 1 else ""))
    print()
    print_table(rows, ("event kind", "with plugin (us/event)", "without (us/event)", "plugin adds (us/event)",
                       "with/without", "adds per entry (us)"))
    print("\nplugin memory after 10^5 events (tracemalloc, bytes it allocated and holds):")
    print(f"  empty plugin: {memory['empty_plugin']:,} B")
    for key, m in memory.items():
        if key != "empty_plugin":
            print(f"  {key}: {m['bytes']:,} B after {m['events']:,} events")
    print(f"machine busy {100 * load.machine_busy:.0f} % during the timing (load {load_averages()})")
    figures = {"unit": "microseconds of thread CPU (time.thread_time) per Scheduler.log_event call, median",
               "events_per_timing": per_timing, "repetitions": reps,
               "scheduler": "distributed.Scheduler in-process (dashboard off), plugin via "
                            "dask_research.dashboard.plugin.install; peer: the same scheduler without it",
               "kinds": kinds_out, "memory_after_1e5_events": memory,
               "memory_method": "tracemalloc: bytes allocated by ResearchEventsPlugin() and its log_event "
                                "calls that are still held after gc.collect()",
               "events_folded": timed["_fed"],
               "machine_busy": load.machine_busy, "load_averages": load_averages()}
    return figures, rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="Shards page up to 10^7 shards only; fewer repetitions of the plugin section.")
    args = ap.parse_args(argv)
    figures = {}
    shards = require("bokeh", benchmark="bench_dashboard", skipping="the Shards page section")
    if shards:
        figures.update(shards_section(args.quick)[0])
    figures["plugin_per_event"] = plugin_section(args.quick)[0]
    # without bokeh (or with --quick) the Shards figures not measured stay as they were
    if shards and not args.quick:
        path = write_results("bench_dashboard", figures, NOTES)
    else:
        path = update_results("bench_dashboard", figures, NOTES)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
