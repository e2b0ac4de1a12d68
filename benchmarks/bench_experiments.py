"""Benchmark of ``dask_research.experiments``: decision overhead, slot occupancy, regret.

Every section, one after the other, in one process run; each section is also a benchmark of
its own (one subject each), which refreshes only its figures:

1. ``bench_experiments_decision.py``: decision overhead with 10,000 queued hypotheses over
   1,000 branches (goal < 100 us): the decision alone and the live loop's result-to-refill gap.
2. ``bench_experiments_occupancy.py``: slot occupancy while work is queued (goal >= 99 %),
   asyncio tasks and Dask futures, with the runner share and the hand-off cost.
3. ``bench_experiments_bandit.py``: the peers' bandit problem (UCB1, round-robin,
   greedy, Optuna TPE ask/tell; horizons 300 and 3000).
4. ``bench_experiments_suite.py``: the research-problem suite of issue 6 (four scenarios, every
   strategy and policy, 30 seeds by default); regret curves to ``docs/_static/regret_curves.html``.
5. ``bench_experiments_costs.py``: what ``apply_order="dispatch"`` and the checkpoint journal cost.
6. ``bench_experiments_memory.py``: memory per experiment of the trace and of a resume. Only this
   section: ``--memory-only`` (figures to ``bench_experiments_memory.json``, as that script).

Needs: ``scipy`` (section 4); ``optuna`` (the Optuna columns of 3 and 4) and ``bokeh`` (the
regret curves) are optional: without them those parts are left out with one line saying so.
All three come with the ``bench`` extra. Run one benchmark at a time::

    flock /tmp/dask-research-bench.lock python benchmarks/bench_experiments.py [--quick]

Figures: ``benchmarks/results/bench_experiments.json``.
"""
from __future__ import annotations

import argparse
import math
import pathlib
import sys
import warnings

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks import (  # noqa: E402
    bench_experiments_bandit,
    bench_experiments_costs,
    bench_experiments_decision,
    bench_experiments_memory,
    bench_experiments_occupancy,
    bench_experiments_suite,
)
from benchmarks.harness import LoadMonitor, write_results  # noqa: E402

#: the sections in the order they run
SECTIONS = (bench_experiments_decision, bench_experiments_occupancy, bench_experiments_bandit,
            bench_experiments_suite, bench_experiments_costs, bench_experiments_memory)

NOTES = (bench_experiments_occupancy.NOTES
         + " Regret is pseudo-regret sum(max p - p_chosen).")


def main(argv: list[str] | None = None) -> None:
    # the scheduler's HTTP server falls back to a free port when 8787 is taken: harmless here
    warnings.filterwarnings("ignore", message="Port .* is already in use")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer reps and experiments")
    ap.add_argument("--memory-only", action="store_true",
                    help="only section 6, memory per experiment (short)")
    for section in SECTIONS:
        section.add_arguments(ap)
    args = ap.parse_args(argv)
    if args.memory_only:
        mem = bench_experiments_memory.measure(args)
        path = write_results("bench_experiments_memory", mem, notes=bench_experiments_memory.NOTES)
        print(f"wrote {path}")
        return
    figures: dict = {}
    with LoadMonitor() as load:
        for section in SECTIONS:
            figures.update(section.measure(args))
    figures["load"] = {"machine_busy": load.machine_busy, "own_busy": load.own_busy}
    foreign = load.machine_busy - load.own_busy
    print(f"\nmachine busy {100 * load.machine_busy:.0f} %, this process "
          f"{100 * load.own_busy:.0f} % (foreign load ~{100 * max(foreign, 0):.0f} %)")
    notes = NOTES
    if not math.isnan(load.machine_busy) and foreign > 0.05:
        notes += f" Foreign load during the run: {100 * foreign:.0f} % of the machine."
    path = write_results("bench_experiments", figures, notes=notes)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
