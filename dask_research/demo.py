"""``dask-research demo``: all three capabilities on an embedded cluster, in one command.

1. **Monte-Carlo**: the 7-input saturating pipeline (320 shards x 65,536 draws), verified and
   stored; the delta method printed next to the sampled values.
2. **Experiments**: twelve research branches compete for three slots on the Dask cluster (one
   actor per slot); UCB1 finds the good ones, prunes the weak, triggers the paper stage.
3. **Replay**: actors ingest CartPole-sized transitions while a learner trains from prefetched
   prioritized batches; the learner's exposed latency is recorded every step.

While it runs, the dashboard (its address is printed) shows the Research Shards, Branches and
Experience pages; at the end a self-contained HTML report is written with the date, host,
versions and seeds, the Monte-Carlo histogram and the linearized normal, the branch scores and
regret, and the exposed-latency timeline.

The Monte-Carlo run is kept in a run store, ``dask-research-demo-store/`` next to the report
(or ``store=``); the demo prints its path and the command that replays one of its shards
alone, which works from any directory::

    dask-research mc replay RUN --shard 17 --store PATH --job dask_research.demo:quick_job

Examples
--------
.. code-block:: bash

    dask-research demo                        # writes dask-research-report.html
    dask-research demo --quick --out /tmp/r.html

The pieces it is made of, for ``mc replay`` and for tests:

>>> from dask_research import demo
>>> demo.quick_job().shards, demo.demo_job().shards
(64, 320)
>>> print(demo.replay_command("0123456789abcdef", "/tmp/store", quick=True))
dask-research mc replay 0123456789ab --shard 17 --store /tmp/store --job dask_research.demo:quick_job
>>> demo.check_store_path("s3://bucket/runs")         # URLs are checked when the store opens
's3://bucket/runs'
"""
from __future__ import annotations

import html
import math
import os
import shlex
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .montecarlo.job import job_factory

__all__ = ["run_demo", "DemoResult", "demo_job", "quick_job", "replay_command", "check_out_path",
           "check_store_path", "STORE_NAME", "SEED"]

#: The folder, next to the report, that keeps the demo's Monte-Carlo run (unless ``store=``).
STORE_NAME = "dask-research-demo-store"
#: The Monte-Carlo job's root seed.
SEED = 2026
#: The seed of the replay demo's actor.
ACTOR_SEED = 0

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


@job_factory
def demo_job(quick: bool = False):
    """The demo's Monte-Carlo job: 320 (``quick``: 64) shards x 65,536 draws, seed :data:`SEED`.

    Also what ``--job dask_research.demo:demo_job`` rebuilds for ``dask-research mc replay``.
    """
    from . import montecarlo as mc

    names = "abcdefg"
    mus = [1.0, 2.0, 0.5, 3.0, 0.8, 0.2, 0.0]
    sds = [0.1, 0.3, 0.05, 0.4, 0.1, 0.3, 1.0]
    return mc.Job(saturating, {n: mc.Normal(m, s) for n, m, s in zip(names, mus, sds)},
                  shards=64 if quick else 320, samples_per_shard=65_536, seed=SEED, name="saturating")


@job_factory
def quick_job():
    """The ``--quick`` demo's job (for ``--job dask_research.demo:quick_job``)."""
    return demo_job(quick=True)


def _writable_dir(path: str) -> bool:
    return os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)


def check_out_path(path: str) -> str:
    """Check, before anything runs, that the report can be written at ``path``; return it absolute.

    Raises
    ------
    InputError
        ``path`` is a directory, its directory does not exist or is not writable, or the file
        exists and is not writable.
    """
    from .exceptions import InputError

    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise InputError("out", path, "a file path for the HTML report", where="demo")
    full = os.path.abspath(os.fspath(path))
    parent = os.path.dirname(full)
    if os.path.isdir(full):
        raise InputError("out", str(path), "a file path for the HTML report, not a directory", where="demo")
    if not os.path.isdir(parent):
        raise InputError("out", str(path), f"a file in an existing directory ({parent} does not exist)",
                         where="demo")
    if not _writable_dir(parent) or (os.path.exists(full) and not os.access(full, os.W_OK)):
        raise InputError("out", str(path), f"a file this user can write ({parent} is not writable)"
                         if not _writable_dir(parent) else "a file this user can write", where="demo")
    return full


def check_store_path(store: str) -> str:
    """Check that ``store`` can hold the demo's run store (a local folder); return it absolute.

    URLs (``scheme://...``) are passed through for the store to check when it opens.
    """
    from .exceptions import InputError

    if "://" in str(store):
        return str(store)
    full = os.path.abspath(os.fspath(store))
    if os.path.exists(full) and not os.path.isdir(full):
        raise InputError("store", str(store), "a folder for the run store (this path is a file)", where="demo")
    probe = full
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise InputError("store", str(store), f"a folder for the run store ({probe} is a file)", where="demo")
    if not _writable_dir(probe):
        raise InputError("store", str(store), f"a folder this user can create or write ({probe} is not writable)",
                         where="demo")
    return full


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
    store: str | None = None
    replay_command: str | None = None


def _say(msg: str) -> None:
    print(msg, flush=True)


def _montecarlo(client, quick: bool, store: str):
    from . import montecarlo as mc

    job = demo_job(quick)
    _say(f"[1/3] Monte-Carlo: {job.total_samples:,} samples in {job.shards} shards, verified, "
         f"stored in {store}")
    result = mc.run(job, client=client, store=store, progress=True)
    _say("\n".join("      " + line for line in str(result).splitlines()))
    if result.computed_shards == 0:
        _say(f"      (all {result.shards} shards were already in the store: resumed, nothing recomputed; "
             f"remove {store} to compute them afresh)")
    return result


def replay_command(run_id: str, store: str, quick: bool, shard: int = 17) -> str:
    """The shell command that recomputes ``shard`` of the demo's run alone, from any directory."""
    ref = "dask_research.demo:quick_job" if quick else "dask_research.demo:demo_job"
    # a 12-digit prefix, as ``print(result)`` shows it: ``mc replay`` resolves it in the store
    return (f"dask-research mc replay {run_id[:12]} --shard {shard} --store {shlex.quote(store)} "
            f"--job {ref}")


def _experiments(client, quick: bool):
    from .experiments import Hypothesis, IterationScheduler, make_followup_expander

    budget = 60 if quick else 180
    _say(f"[2/3] Experiments: {len(BRANCH_MEANS)} research branches, 3 slots, {budget} experiments on the Dask cluster")
    sched = IterationScheduler(experiment, slots=3, client=client, max_experiments=budget,
                               paper_threshold=0.7, prune_floor=0.2, prune_after_runs=4,
                               expander=make_followup_expander(threshold=0.7, fanout=2), progress=True)
    sched.add([Hypothesis(f"{b}-{k}", b) for k in range(30) for b in BRANCH_MEANS])
    report = sched.run()
    best = max(BRANCH_MEANS, key=BRANCH_MEANS.__getitem__)
    runs = {b: s.runs for b, s in report.branches.items()}
    _say(f"      stop: {report.stop_reason}; {report.total_runs} runs; most-run branch "
         f"{max(runs, key=runs.__getitem__)} (best is {best}); papers: {', '.join(report.paper_triggers) or 'none'}; "
         f"pruned: {sum(1 for s in report.branches.values() if s.pruned)}")
    return report, sched.seed


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
    from .replay import publish_plane

    steps = 300 if quick else 1500
    _say(f"[3/3] Replay: actors ingest while a learner trains {steps} steps from prefetched prioritized batches")
    plane = replay.ExperiencePlane(SPEC, capacity=200_000,
                                   sampler=replay.PrioritizedSampler(alpha=0.6, beta=0.4))
    stop = threading.Event()
    actor = threading.Thread(target=_actor, args=(plane, stop, ACTOR_SEED), daemon=True)
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
         f"{np.mean(exposed):.3f} ms mean per step ({100 * np.mean(exposed) / max(float(np.mean(step_ms)), 1e-9):.1f} % "
         f"of a {np.mean(step_ms):.2f} ms learner step), p99 {d.get('exposed_p99_s', float('nan')) * 1e3:.3f} ms")
    return stats, exposed, step_ms


def _experiments_figures(report):
    from bokeh.layouts import column
    from bokeh.plotting import figure

    from .html_report import FRAME_WIDTH, outside_legend

    best = max(BRANCH_MEANS.values())
    t, regret, acc = [], [], 0.0
    for e in report.events:
        if e.kind == "dispatch" and e.branch in BRANCH_MEANS:
            acc += best - BRANCH_MEANS[e.branch]
            t.append(len(t) + 1)
            regret.append(acc)
    reg = figure(title="Cumulative pseudo-regret of the dispatches: UCB1 + gates vs round-robin",
                 frame_width=FRAME_WIDTH, frame_height=260, x_axis_label="experiments dispatched",
                 y_axis_label="cumulative pseudo-regret", toolbar_location=None)
    reg.line(t, regret, line_width=2, color="#4c72b0", legend_label="UCB1 + gates (this run)")
    rr = np.cumsum([best - np.mean(list(BRANCH_MEANS.values()))] * len(t))
    reg.line(t, rr, line_width=2, color="#8c8c8c", line_dash="dashed", legend_label="round-robin (expected)")
    outside_legend(reg)
    palette = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860"]
    names = list(report.branches)
    top = sorted(names, key=lambda n: -report.branches[n].runs)[:len(palette)]
    scores = figure(title=f"UCB1 score of the {len(top)} most-run branches at each selection",
                    frame_width=FRAME_WIDTH, frame_height=260, x_axis_label="seconds since the loop started",
                    y_axis_label="UCB1 score (mean + bonus)", toolbar_location=None)
    series: dict[str, tuple[list, list]] = {n: ([], []) for n in names}
    measured: set[str] = set()          # branches with a result so far: a score means something
    for e in report.events:
        if e.kind == "result" and e.branch is not None:
            measured.add(e.branch)
        elif e.kind == "select" and (e.scores is not None or e.top is not None):
            for n, s in report.events.scores(e).items():     # every branch, or the trace's top-k
                if n in measured and math.isfinite(s):
                    series[n][0].append(e.t)
                    series[n][1].append(s)
    for i, n in enumerate(top):         # a score holds until the next selection: steps
        scores.step(*series[n], mode="after", color=palette[i], line_width=2,
                    legend_label=f"{n} ({report.branches[n].runs} runs)")
    outside_legend(scores)
    return column(reg, scores)


def _latency_figure(exposed, step_ms):
    from bokeh.plotting import figure

    from .html_report import FRAME_WIDTH, outside_legend

    fig = figure(title=f"Learner: blocked in next() (mean {np.mean(exposed):.3f} ms) "
                       f"vs step compute (mean {np.mean(step_ms):.2f} ms)",
                 frame_width=FRAME_WIDTH, frame_height=240, x_axis_label="learner step",
                 y_axis_label="milliseconds (log scale)", y_axis_type="log", toolbar_location=None)
    floor = 1e-3            # a log axis: a step that never blocked is drawn at 1 microsecond
    fig.scatter(np.arange(len(exposed)), np.maximum(exposed, floor), size=3, color="#c44e52", alpha=0.7,
                legend_label="exposed latency (blocked in next())")
    fig.line(np.arange(len(step_ms)), np.maximum(step_ms, floor), color="#8c8c8c", alpha=0.7,
             legend_label="learner step compute")
    outside_legend(fig)
    return fig


def _pre(text: str) -> str:
    return f"<pre style='white-space:pre-wrap;overflow-wrap:anywhere'>{html.escape(text)}</pre>"


def run_demo(out: str = "dask-research-report.html", quick: bool = False, client=None,
             store: str | None = None) -> DemoResult:
    """Run the three capabilities and write the HTML report; returns what was produced.

    Parameters
    ----------
    out : str
        The report's path; checked (:func:`check_out_path`) before anything runs.
    quick : bool
        A smaller run of each part.
    client : distributed.Client, optional
        Run on this cluster; by default an embedded ``LocalCluster`` of 2 workers x 2 threads.
    store : str, optional
        The Monte-Carlo run store; by default :data:`STORE_NAME` next to the report. It is
        kept, so the printed replay command works afterwards (and a second demo resumes).
    """
    from distributed import Client, LocalCluster

    from . import dashboard  # noqa: F401  (registers the research pages before the scheduler starts)
    from .html_report import environment_facts, montecarlo_figure, write_report

    out = check_out_path(out)
    store = check_store_path(store if store is not None else os.path.join(os.path.dirname(out), STORE_NAME))
    res = DemoResult(store=store)
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
            if owns:
                _say("           (live while the demo runs: its embedded cluster closes at the end; "
                     "use --scheduler ADDRESS to keep the pages)")
        facts = environment_facts(client)
        if owns:
            facts["cluster"] = "embedded LocalCluster: " + facts["cluster"]
        t0 = time.perf_counter()
        res.montecarlo = _montecarlo(client, quick, store)
        res.replay_command = replay_command(res.montecarlo.run_id, store, quick)
        res.experiments, experiments_seed = _experiments(client, quick)
        res.replay_stats, res.exposed_ms, res.step_ms = _replay(client, quick)
        d = res.replay_stats.get("delivery", {})
        facts.update({
            "command": "dask-research demo" + (" --quick" if quick else ""),
            "seeds": (f"Monte-Carlo job seed {SEED}; experiment rewards seeded by crc32 of each hypothesis id, "
                      f"scheduler seed {experiments_seed}; replay actor seed {ACTOR_SEED}"),
            "run store": store,
            "Monte-Carlo run": res.montecarlo.run_id,
            "replay a shard": res.replay_command,
        })
        replay_text = (f"{res.replay_stats['inserted']:,} transitions ingested, {res.replay_stats['sampled']:,} "
                       f"sampled; exposed latency {np.mean(res.exposed_ms):.3f} ms mean per step, learner step "
                       f"{np.mean(res.step_ms):.2f} ms, p99 exposed "
                       f"{d.get('exposed_p99_s', float('nan')) * 1e3:.3f} ms")
        sections = [
            "<h2>1. Monte-Carlo</h2>" + _pre(str(res.montecarlo)),
            montecarlo_figure(res.montecarlo),
            "<p>Recompute shard 17 of this run alone and compare it bit for bit with the store:</p>"
            + _pre(res.replay_command),
            "<h2>2. Experiments</h2>" + _pre(str(res.experiments)),
            _experiments_figures(res.experiments),
            "<h2>3. Experience replay</h2>" + _pre(replay_text),
            _latency_figure(res.exposed_ms, res.step_ms),
        ]
        res.report_path = write_report(out, "dask-research demo", sections, facts=facts)
        _say(f"Report: {res.report_path}  ({time.perf_counter() - t0:.0f} s in all)")
        _say(f"Store:  {store}  (Monte-Carlo run {res.montecarlo.run_id[:12]})")
        _say(f"Replay shard 17 alone: {res.replay_command}")
    finally:
        if owns:
            client.close()
            cluster.close()
    return res
