"""Benchmark of the Shards dashboard page: the scheduler's CPU per page update, by run size.

A run of N shards (10^4 ... 10^8) whose event log holds its ``start`` and 1,000 ``accepted``
blocks; each row is the CPU time (``time.process_time``, so other load on a shared machine does
not count) of one :meth:`ShardBoard.update` in the steady state (nothing new logged, and one
new block logged since the last update), side by side with the per-shard array the page built
on every update before issue 28 (the peer: ``np.zeros(N)`` filled from every event, then grouped
into the same cells). The page must cost a few ms per update whatever N.

Needs bokeh (the ``[dashboard]`` extra). Run one benchmark at a time::

    flock /tmp/dask-research-bench.lock python benchmarks/bench_dashboard.py [--quick]

Figures in ``benchmarks/results/bench_dashboard.json``.
"""
from __future__ import annotations

import argparse
import math
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.harness import print_table, require, write_results  # noqa: E402

NOTES = ("CPU seconds (process_time) per update, median of 5; 'new block' = one accepted event logged "
         "since the last update; the per-shard peer is the page before issue 28")


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


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="Up to 10^7 shards only.")
    args = ap.parse_args(argv)
    if not require("bokeh", benchmark="bench_dashboard"):
        return
    from dask_research.dashboard.components import ShardBoard

    sizes = [10**4, 10**6, 10**7] + ([] if args.quick else [10**8])
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
    print(f"wrote {write_results('bench_dashboard', figures, NOTES)}")


if __name__ == "__main__":
    main()
