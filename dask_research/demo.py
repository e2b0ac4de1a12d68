"""``dask-research demo``: all three capabilities on an embedded cluster in about a minute.

1. **Monte-Carlo**: the 7-input saturating pipeline (320 shards x 65,536 draws), verified and
   stored; the delta method printed next to the sampled values.
2. **Experiments**: twelve research branches compete for three slots on Dask futures; UCB1
   finds the good ones, prunes the weak, triggers the paper stage.
3. **Replay**: actors ingest CartPole-sized transitions while a learner trains from prefetched
   prioritized batches; the learner's exposed latency is recorded every step.

While it runs, the dashboard (its address is printed) shows the Research Shards, Branches and
Experience pages; at the end a self-contained HTML report is written with the Monte-Carlo
histogram and the linearized normal, the branch scores and regret, and the exposed-latency
timeline.

Examples
--------
.. code-block:: bash

    dask-research demo                        # writes dask-research-report.html
    dask-research demo --quick --out /tmp/r.html
"""
from __future__ import annotations

import math
import tempfile
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["run_demo", "DemoResult"]

BRANCH_MEANS = {"attention": 0.78, "state-space": 0.66, "mixture": 0.55, "retrieval": 0.5,
                "distillation": 0.45, "sparse": 0.4, "curriculum": 0.35, "dropout-v2": 0.3,
                "wider": 0.25, "deeper": 0.2, "bigger-lr": 0.12, "no-norm": 0.05}


def saturating(a, b, c, d, e, f, g):
    """The demo's Monte-Carlo pipeline (same as examples/saturating_pipeline.py)."""
    t1 = a * b / (c + 1)
    t3 = np.tanh(1.5 * t1)
    return (t3 + 0.1 * np.log1p(np.abs(d)) * e) / (1 + np.exp(-f)) + 0.01 * g


def experiment(h) -> Any:
    """A synthetic experiment: a noisy reward around the branch's true mean, a little work."""
    from .experiments import Result

    seed = zlib.crc32(h.id.encode())
    rng = np.random.default_rng(seed)
    m = np.linalg.qr(rng.standard_normal((120, 120)))[0]          # some real work
    time.sleep(0.02)
    reward = float(np.clip(rng.normal(BRANCH_MEANS[h.branch], 0.15), 0.0, 1.0))
    return Result(h, reward, {"work": float(np.abs(m).sum())})


@dataclass
class DemoResult:
    """What the demo produced (for tests and notebooks)."""

    montecarlo: Any = None
    experiments: Any = None
    replay_stats: dict = field(default_factory=dict)
    exposed_ms: list = field(default_factory=list)
    step_ms: list = field(default_factory=list)
    report_path: str | None = None
    dashboard: str | None = None


def _say(msg: str) -> None:
    print(msg, flush=True)


def _montecarlo(client, quick: bool, store: str):
    from . import montecarlo as mc

    names = "abcdefg"
    mus = [1.0, 2.0, 0.5, 3.0, 0.8, 0.2, 0.0]
    sds = [0.1, 0.3, 0.05, 0.4, 0.1, 0.3, 1.0]
    job = mc.Job(saturating, {n: mc.Normal(m, s) for n, m, s in zip(names, mus, sds)},
                 shards=64 if quick else 320, samples_per_shard=65_536, seed=2026, name="saturating")
    _say(f"[1/3] Monte-Carlo: {job.total_samples:,} samples in {job.shards} shards, verified on other workers")
    result = mc.run(job, client=client, store=store, progress=True)
    _say("\n".join("      " + line for line in str(result).splitlines()))
    return result


def _experiments(client, quick: bool):
    from .experiments import Hypothesis, IterationScheduler, make_followup_expander

    budget = 60 if quick else 180
    _say(f"[2/3] Experiments: {len(BRANCH_MEANS)} research branches, 3 slots, {budget} experiments on Dask futures")
    sched = IterationScheduler(experiment, slots=3, client=client, max_experiments=budget,
                               paper_threshold=0.7, prune_floor=0.2, prune_after_runs=4,
                               expander=make_followup_expander(threshold=0.7, fanout=2), progress=True)
    sched.add([Hypothesis(f"{b}-{k}", b) for k in range(30) for b in BRANCH_MEANS])
    report = sched.run()
    best = max(BRANCH_MEANS, key=BRANCH_MEANS.get)
    runs = {b: s.runs for b, s in report.branches.items()}
    _say(f"      stop: {report.stop_reason}; {report.total_runs} runs; most-run branch "
         f"{max(runs, key=runs.get)} (best is {best}); papers: {', '.join(report.paper_triggers) or 'none'}; "
         f"pruned: {sum(1 for s in report.branches.values() if s.pruned)}")
    return report


SPEC = {"obs": ((4,), "float32"), "action": ((), "int64"), "reward": ((), "float32"),
        "next_obs": ((4,), "float32"), "done": ((), "bool")}


def _actor(plane, stop: threading.Event, seed: int) -> None:
    rng = np.random.default_rng(seed)
    while not stop.is_set():
        n = 512
        obs = rng.normal(0, 0.05, (n, 4)).astype(np.float32)
        act = rng.integers(0, 2, n)
        nxt = obs + rng.normal(0, 0.02, (n, 4)).astype(np.float32)
        done = np.abs(nxt[:, 2]) > 0.1
        try:
            plane.ingest({"obs": obs, "action": act, "reward": np.ones(n, np.float32), "next_obs": nxt,
                          "done": done}, timeout=0.5)
        except Exception:
            if stop.is_set():
                return
        time.sleep(0.002)


def _replay(client, quick: bool):
    from . import replay
    from .dashboard.publish import publish_plane

    steps = 300 if quick else 1500
    _say(f"[3/3] Replay: actors ingest while a learner trains {steps} steps from prefetched prioritized batches")
    plane = replay.ExperiencePlane(SPEC, capacity=200_000,
                                   sampler=replay.PrioritizedSampler(alpha=0.6, beta=0.4))
    stop = threading.Event()
    actor = threading.Thread(target=_actor, args=(plane, stop, 0), daemon=True)
    actor.start()
    while len(plane) < 4096:
        time.sleep(0.01)
    pub = publish_plane(plane, client, interval=0.5, name="demo-learner")
    w = np.zeros((4, 2), dtype=np.float32)
    exposed, step_ms = [], []
    it = plane.batches(batch_size=256, prefetch=2)
    try:
        for _ in range(steps):
            t0 = time.perf_counter()
            batch = next(it)
            t1 = time.perf_counter()
            # The learner's step: a linear Q update (a stand-in for a network's forward/backward).
            q = batch.obs @ w
            target = batch.reward + 0.99 * (batch.next_obs @ w).max(axis=1) * (~batch.done)
            td = target - q[np.arange(q.shape[0]), batch.action]
            for a in (0, 1):
                m = batch.action == a
                w[:, a] += 1e-3 * (batch.obs[m] * (td[m] * batch.weights[m])[:, None]).mean(axis=0) if m.any() else 0
            plane.update_priorities(batch.indices, np.abs(td) + 1e-3)
            sum(np.linalg.norm(batch.obs, axis=1))       # a little more learner work
            t2 = time.perf_counter()
            exposed.append((t1 - t0) * 1e3)
            step_ms.append((t2 - t1) * 1e3)
    finally:
        it.close()
        stop.set()
        actor.join(timeout=5)
        pub.stop()
    stats = plane.stats()
    d = stats["delivery"]
    _say(f"      {stats['inserted']:,} transitions ingested, {stats['sampled']:,} sampled; exposed latency "
         f"{np.mean(exposed):.3f} ms mean per step ({100 * np.mean(exposed) / max(np.mean(step_ms), 1e-9):.1f} % "
         f"of a {np.mean(step_ms):.2f} ms learner step), p99 {d.get('exposed_p99_s', float('nan')) * 1e3:.3f} ms")
    return stats, exposed, step_ms


def _experiments_figures(report):
    from bokeh.layouts import row
    from bokeh.plotting import figure

    best = max(BRANCH_MEANS.values())
    t, regret, acc = [], [], 0.0
    for e in report.events:
        if e.kind == "dispatch" and e.branch in BRANCH_MEANS:
            acc += best - BRANCH_MEANS[e.branch]
            t.append(len(t) + 1)
            regret.append(acc)
    reg = figure(title="Cumulative pseudo-regret of the dispatches (UCB1 vs round-robin)", height=300,
                 width=380, x_axis_label="experiments dispatched", toolbar_location=None)
    reg.line(t, regret, line_width=2, color="#4c72b0", legend_label="UCB1 + gates")
    rr = np.cumsum([best - np.mean(list(BRANCH_MEANS.values()))] * len(t))
    reg.line(t, rr, line_width=2, color="#8c8c8c", line_dash="dashed", legend_label="round-robin (expected)")
    reg.legend.location = "top_left"
    scores = figure(title="UCB score of each branch at each selection", height=300, width=380,
                    x_axis_label="seconds", toolbar_location=None)
    palette = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860"]
    names = list(report.branches)
    series: dict[str, tuple[list, list]] = {n: ([], []) for n in names}
    for e in report.events:
        if e.kind == "select" and e.scores is not None:
            for n, s in zip(names, e.scores.tolist()):
                if math.isfinite(s):
                    series[n][0].append(e.t)
                    series[n][1].append(s)
    top = sorted(names, key=lambda n: -report.branches[n].runs)[:6]
    for i, n in enumerate(top):
        scores.line(*series[n], color=palette[i], line_width=2, legend_label=n)
    scores.legend.label_text_font_size = "8pt"
    return row(reg, scores)


def _latency_figure(exposed, step_ms):
    from bokeh.plotting import figure

    fig = figure(title=f"Learner exposed latency per step (mean {np.mean(exposed):.3f} ms; "
                       f"learner step mean {np.mean(step_ms):.2f} ms)", height=280, width=760,
                 x_axis_label="learner step", y_axis_label="ms blocked in next()", toolbar_location=None)
    fig.scatter(np.arange(len(exposed)), exposed, size=3, color="#c44e52", alpha=0.6)
    fig.line(np.arange(len(step_ms)), step_ms, color="#8c8c8c", alpha=0.5, legend_label="learner step (ms)")
    return fig


def run_demo(out: str = "dask-research-report.html", quick: bool = False, client=None) -> DemoResult:
    """Run the three capabilities and write the HTML report; returns what was produced."""
    from distributed import Client, LocalCluster

    from . import dashboard  # noqa: F401  (registers the research pages before the scheduler starts)
    from .report import montecarlo_figure, write_report

    res = DemoResult()
    owns = client is None
    if owns:
        cluster = LocalCluster(n_workers=2, threads_per_worker=2, processes=False, dashboard_address=":0")
        client = Client(cluster)
    try:
        link = getattr(client, "dashboard_link", None)
        res.dashboard = link
        if link:
            base = link.rsplit("/", 1)[0]
            _say(f"Dashboard: {link}  (research pages: {base}/individual-research-shards, "
                 f"{base}/individual-research-branches, {base}/individual-research-experience)")
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="dask-research-demo-") as store:
            res.montecarlo = _montecarlo(client, quick, store)
        res.experiments = _experiments(client, quick)
        res.replay_stats, res.exposed_ms, res.step_ms = _replay(client, quick)
        sections = [
            "<h2>1. Monte-Carlo</h2><pre>" + str(res.montecarlo) + "</pre>",
            montecarlo_figure(res.montecarlo),
            "<h2>2. Experiments</h2><pre>" + str(res.experiments) + "</pre>",
            _experiments_figures(res.experiments),
            "<h2>3. Experience replay</h2>",
            _latency_figure(res.exposed_ms, res.step_ms),
        ]
        res.report_path = write_report(out, "dask-research demo", sections)
        _say(f"Report: {res.report_path}  ({time.perf_counter() - t0:.0f} s in all)")
    finally:
        if owns:
            client.close()
            cluster.close()
    return res
