"""Benchmark of ``dask_research.experiments``: the research-problem suite of issue 6.

20 branches; Bernoulli, Beta and clipped-Gaussian rewards with branch means drawn per seed,
and a scenario whose branches improve as they are refined; 3 slots with exponential experiment
durations on a simulated clock (so completion order varies, without real sleeps); horizons 300
and 3000; 30 seeds (``--seeds``). Every strategy sees the same coins (common random numbers per
seed). Strategies: FIFO, round-robin, greedy, naive UCB1 (ignores experiments in flight), the
scheduler's policies (pending-aware UCB1, UCB1-Tuned, KL-UCB, Thompson, discounted UCB: the real
``Policy`` objects) and Optuna TPE by ask/tell when importable, on fewer seeds (its cost grows
with history: ``--optuna-seeds-300``, ``--optuna-seeds-3000``). Cumulative pseudo-regret (mean,
95 % interval, worst seed), first paper trigger, best branch found (the most-pulled one),
decision overhead; regret curves to ``docs/_static/regret_curves.html``.

Needs ``scipy`` (the ``bench`` extra); ``optuna`` for the Optuna column and ``bokeh`` for the
regret curves (also ``bench``): without either, that part is left out with one line saying so
and the figures are still written. Run one benchmark at a time::

    flock /tmp/dask-research-bench.lock python benchmarks/bench_experiments_suite.py [--quick]

Figures ``suite``, ``suite_goals`` and ``suite_overhead`` (with Optuna) in
``benchmarks/results/bench_experiments.json``.
"""
from __future__ import annotations

import argparse
import math
import pathlib
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.experiment_simulation import (  # noqa: E402
    OURS,
    SCENARIOS,
    SUITE_CHECKS,
    SUITE_H,
    SUITE_K,
    SUITE_SLOTS,
    SUITE_STRATEGIES,
    OptunaTPE,
    Problem,
    simulate,
)
from benchmarks.harness import print_table, require, run_section  # noqa: E402

CURVES = pathlib.Path(__file__).resolve().parents[1] / "docs" / "_static" / "regret_curves.html"


def _interval(x: list[float]) -> tuple[float, float]:
    m = statistics.mean(x)
    half = 1.96 * statistics.stdev(x) / math.sqrt(len(x)) if len(x) > 1 else math.nan
    return m - half, m + half


def _summary(runs: list[dict], horizon: int) -> dict:
    r = [x["regret"][horizon] for x in runs if horizon in x["regret"]]
    trig = [x["trigger_step"] for x in runs if x["trigger_step"] is not None]
    lo, hi = _interval(r)
    return {"seeds": len(r), "regret_mean": statistics.mean(r), "regret_ci95": [lo, hi],
            "regret_worst": max(r), "regret_per_seed": [round(v, 2) for v in r],
            "first_trigger_median": statistics.median(trig) if trig else None,
            "trigger_rate": len(trig) / len(runs),
            "trigger_on_best": (sum(bool(x["trigger_on_best"]) for x in runs
                                    if x["trigger_step"] is not None) / len(trig)
                                if trig else None),
            "found_best": sum(x["found_best"] for x in runs if horizon in x["regret"])
            / len(r),
            "us_per_decision": statistics.median(x["us_per_decision"] for x in runs)}


def suite(seeds: int, optuna_seeds_300: int, optuna_seeds_3000: int, with_optuna: bool,
          curve_points: int = 120) -> dict:
    """Every strategy on every scenario; returns figures and mean regret curves."""
    out: dict = {"setup": {
        "branches": SUITE_K, "slots": SUITE_SLOTS, "horizons": list(SUITE_CHECKS),
        "seeds": seeds, "durations": "exponential, mean 1, simulated clock",
        "optuna_seeds": {"300": optuna_seeds_300, "3000": optuna_seeds_3000},
        "paper_trigger": "first time a branch with >= 5 results has mean >= 0.9 x the best "
                         "true mean; step = results applied so far"}}
    grid = np.unique(np.geomspace(1, SUITE_H, curve_points).astype(int)) - 1
    curves: dict = {}
    for scenario in SCENARIOS:
        probs = [Problem(scenario, s) for s in range(seeds)]
        res: dict = {}
        for name, make in SUITE_STRATEGIES.items():
            t0 = time.perf_counter()
            runs = [simulate(make(SUITE_K, s), probs[s], SUITE_H) for s in range(seeds)]
            res[name] = {str(h): _summary(runs, h) for h in SUITE_CHECKS}
            res[name]["seconds"] = time.perf_counter() - t0
            curves.setdefault(scenario, {})[name] = np.mean([r["curve"] for r in runs],
                                                            axis=0)[grid].tolist()
        if with_optuna:
            n_all = max(optuna_seeds_300, optuna_seeds_3000)
            runs = []
            t0 = time.perf_counter()
            for s in range(n_all):
                h = SUITE_H if s < optuna_seeds_3000 else 300
                runs.append(simulate(OptunaTPE(SUITE_K, s), probs[s], h))
            res["Optuna TPE (ask/tell)"] = {
                "300": _summary(runs[:optuna_seeds_300], 300),
                "3000": _summary(runs[:optuna_seeds_3000], 3000) if optuna_seeds_3000 else None,
                "seconds": time.perf_counter() - t0}
            if optuna_seeds_3000:
                curves[scenario]["Optuna TPE (ask/tell)"] = np.mean(
                    [r["curve"] for r in runs[:optuna_seeds_3000]], axis=0)[grid].tolist()
            # our policies on exactly the Optuna seeds, for a paired comparison at 3000
            paired = {}
            for name in OURS:
                sub = [simulate(SUITE_STRATEGIES[name](SUITE_K, s), probs[s], SUITE_H)
                       for s in range(optuna_seeds_3000)]
                paired[name] = statistics.mean(x["regret"][3000] for x in sub) if sub else None
            res["paired_with_optuna_3000"] = paired
        out[scenario] = res
        print(f"   {scenario}: done")
    out["curve_steps"] = (grid + 1).tolist()
    return out, curves


def suite_goals(figs: dict) -> dict:
    goals: dict = {}
    for scenario in SCENARIOS:
        res = figs[scenario]
        naive = res["naive UCB1 (no pending)"]["3000"]["regret_mean"]
        pend = res["UCB1 (pending-aware, default)"]["3000"]["regret_mean"]
        naive3 = res["naive UCB1 (no pending)"]["300"]["regret_mean"]
        pend3 = res["UCB1 (pending-aware, default)"]["300"]["regret_mean"]
        ours = {n: res[n]["3000"]["regret_mean"] for n in OURS}
        best = min(ours, key=ours.get)
        others = {n: v["3000"]["regret_mean"] for n, v in res.items()
                  if isinstance(v, dict) and n not in OURS and "3000" in v
                  and isinstance(v["3000"], dict) and not n.startswith("Optuna")}
        worst_best = res[best]["3000"]["regret_worst"]
        goals[scenario] = {
            "pending_beats_naive_300": pend3 < naive3, "pending_beats_naive_3000": pend < naive,
            "best_of_ours": best, "best_regret": ours[best],
            "lowest_of_all": all(ours[best] <= v for v in others.values()),
            "runner_up": min(others, key=others.get) if others else None,
            "worst_seed_of_best": worst_best,
            "worst_seed_over_mean": worst_best / ours[best] if ours[best] > 0 else None,
        }
        paired = res.get("paired_with_optuna_3000")
        opt = res.get("Optuna TPE (ask/tell)", {}).get("3000")
        if paired and opt:
            goals[scenario]["optuna_3000_paired"] = {"optuna": opt["regret_mean"],
                                                     "best_of_ours_same_seeds": paired[best]}
            goals[scenario]["lowest_of_all"] = (goals[scenario]["lowest_of_all"]
                                                and paired[best] <= opt["regret_mean"])
    return goals


def plot_curves(curves: dict, steps: list[int], path: pathlib.Path, figs: dict) -> None:
    """Mean cumulative regret against the number of experiments, one panel per scenario."""
    from bokeh.io import save
    from bokeh.layouts import gridplot
    from bokeh.models import Legend
    from bokeh.palettes import Category10_10, Category20_20
    from bokeh.plotting import figure
    from bokeh.resources import INLINE

    panels = []
    for scenario in SCENARIOS:
        p = figure(title=f"{scenario}: mean cumulative regret, {figs['setup']['seeds']} seeds, "
                         f"{SUITE_K} branches, {SUITE_SLOTS} slots", x_axis_type="log",
                   width=620, height=380, x_axis_label="experiments",
                   y_axis_label="pseudo-regret")
        items = []
        # one colour per curve (Category10 repeats after ten: round-robin and Optuna TPE once
        # shared an orange dashed line)
        palette = Category10_10 if len(curves[scenario]) <= 10 else Category20_20
        for j, (name, ys) in enumerate(curves[scenario].items()):
            dash = "solid" if name in OURS else "dashed"
            r = p.line(steps[:len(ys)], ys, color=palette[j % len(palette)], line_width=2,
                       line_dash=dash)
            label = name
            if name.startswith("Optuna"):
                label += f" ({figs['setup']['optuna_seeds']['3000']} seeds)"
            items.append((label, [r]))
        p.add_layout(Legend(items=items, label_text_font_size="8pt"), "right")
        panels.append(p)
    grid = gridplot(panels, ncols=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    save(grid, filename=str(path), resources=INLINE, title="dask-research: regret curves")




def _print_suite(figures: dict, opt3000: int) -> None:
    goals = figures["suite_goals"]
    for scenario in SCENARIOS:
        res = figures["suite"][scenario]
        rows = []
        for name, f in res.items():
            if not isinstance(f, dict) or "300" not in f:
                continue
            cells = [name]
            for h in ("300", "3000"):
                x = f.get(h)
                if not x:
                    cells += ["-", "-"]
                    continue
                lo, hi = x["regret_ci95"]
                ci = f" [{lo:.1f}, {hi:.1f}]" if x["seeds"] > 1 else f" ({x['seeds']} seed)"
                cells += [f"{x['regret_mean']:.1f}{ci}", f"{x['regret_worst']:.1f}"]
            x = f["3000"] or f["300"]
            trig = x["first_trigger_median"]
            cells += [f"{x['found_best']:.0%}", "-" if trig is None else f"{trig:.0f}",
                      f"{x['us_per_decision']:.1f}"]
            rows.append(tuple(cells))
        print(f"\n   {scenario}")
        print_table(rows, ("strategy", "regret@300 [95% CI]", "worst", "regret@3000 [95% CI]",
                           "worst", "found best", "1st trigger", "us/decision"))
        g = goals[scenario]
        print(f"   best of ours at 3000: {g['best_of_ours']} ({g['best_regret']:.1f}); "
              f"lowest of all: {g['lowest_of_all']}; pending-aware < naive UCB1: "
              f"{g['pending_beats_naive_300']} at 300, {g['pending_beats_naive_3000']} at "
              f"3000; worst seed / mean {g['worst_seed_over_mean']:.2f}")
        if "optuna_3000_paired" in g:
            pr = g["optuna_3000_paired"]
            print(f"   paired on Optuna's {opt3000} seeds at 3000: Optuna "
                  f"{pr['optuna']:.1f}, {g['best_of_ours']} "
                  f"{pr['best_of_ours_same_seeds']:.1f}")


def _suite_overhead(figures: dict) -> dict:
    """Decision time of our policies against Optuna's (mean over scenarios), and its table."""
    opt = {h: statistics.mean(
        figures["suite"][sc]["Optuna TPE (ask/tell)"][h]["us_per_decision"]
        for sc in SCENARIOS) for h in ("300", "3000")
        if figures["suite"][SCENARIOS[0]]["Optuna TPE (ask/tell)"][h]}
    over = {}
    rows = []
    for n in OURS:
        us = statistics.mean(figures["suite"][sc][n]["3000"]["us_per_decision"]
                             for sc in SCENARIOS)
        over[n] = {"us_per_decision": us,
                   **{f"optuna_{h}_over_ours": v / us for h, v in opt.items()}}
        rows.append((n, f"{us:.1f}", *(f"{v / us:.0f}x" for v in opt.values())))
    print("\n   decision overhead (mean over scenarios, 3 slots, select + update)")
    print_table(rows + [("Optuna TPE", *(f"{v:.0f}" for v in opt.values()), "")],
                ("policy", "us/decision", *(f"Optuna@{h} / ours" for h in opt)))
    return {"optuna_us_per_decision": opt, "ours": over}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """``--seeds``, ``--optuna-seeds-300``, ``--optuna-seeds-3000`` (``--quick``: 5, 3, 1)."""
    ap.add_argument("--seeds", type=int, default=30, help="seeds of the research suite")
    ap.add_argument("--optuna-seeds-300", type=int, default=10,
                    help="seeds on which Optuna runs to horizon 300")
    ap.add_argument("--optuna-seeds-3000", type=int, default=2,
                    help="seeds on which Optuna runs to horizon 3000 (about 15 s each)")


def measure(args: argparse.Namespace) -> dict:
    """Section 4 of ``bench_experiments``: ``suite``, ``suite_goals``, ``suite_overhead``."""
    seeds, opt300, opt3000 = args.seeds, args.optuna_seeds_300, args.optuna_seeds_3000
    if args.quick:
        seeds, opt300, opt3000 = 5, 3, 1
    require("scipy", benchmark="bench_experiments_suite")
    with_optuna = require("optuna", benchmark="bench_experiments_suite", skipping="the Optuna column")
    print(f"\n4. research-problem suite: {SUITE_K} branches, {SUITE_SLOTS} slots, random "
          f"durations (simulated clock), horizons {SUITE_CHECKS}, {seeds} seeds")
    opt300, opt3000 = min(seeds, opt300), min(seeds, opt3000)
    if with_optuna:
        print(f"   (Optuna TPE is slow at long horizons: {opt300} seeds at 300, "
              f"{opt3000} at 3000; ours are also run on those seeds for a paired figure)")
    figures: dict = {}
    figures["suite"], curves = suite(seeds, opt300, opt3000, with_optuna)
    figures["suite_goals"] = suite_goals(figures["suite"])
    _print_suite(figures, opt3000)
    if with_optuna:
        figures["suite_overhead"] = _suite_overhead(figures)
    if require("bokeh", benchmark="bench_experiments_suite", skipping=f"the regret curves ({CURVES.name})"):
        plot_curves(curves, figures["suite"]["curve_steps"], CURVES, figures["suite"])
        print(f"   regret curves: {CURVES}")
    return figures


def main(argv: list[str] | None = None) -> None:
    run_section("bench_experiments", __doc__.splitlines()[0], add_arguments, measure, argv=argv)


if __name__ == "__main__":
    main()
