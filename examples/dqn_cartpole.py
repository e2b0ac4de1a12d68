"""Double DQN with prioritized replay on CartPole-v1, through the experience plane on Dask.

Actors run as Dask tasks on the workers, each with a vectorised gymnasium CartPole
(``gymnasium.make_vec``), acting with policy weights the learner broadcasts every few updates
(``client.scatter(weights, broadcast=True)``), and ingest into their worker's shard of a
:class:`dask_research.replay.ClusterPlane`. The learner (torch, CPU) runs here, in the client,
and draws prefetched prioritized batches from all shards; new priorities go back to the shards
that own the transitions. The run stops when the mean return of the last 20 episodes reaches
475 (CartPole-v1's "solved"), or after ``--max-steps`` environment steps.

    pip install dask-research[rl,torch]
    python examples/dqn_cartpole.py                        # LocalCluster, 2 workers
    python examples/dqn_cartpole.py --scheduler tcp://host:8786

The plane publishes its statistics to the scheduler every second, so the dashboard's
*Research Experience* page (under "More...") follows the run: on the LocalCluster's dashboard
(``--dashboard``, default ``:8787``; the page is registered by importing
``dask_research.dashboard`` before the cluster starts), or on a ``dask scheduler`` started with
``--preload dask_research.dashboard``.

The reusable code is in :mod:`dask_research.replay.rl` (workers must import it).
"""
from __future__ import annotations

import argparse
import json

from distributed import Client, LocalCluster

from dask_research.replay.rl import DQNConfig, train_dqn


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scheduler", help="address of a running scheduler (default: LocalCluster)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--target", type=float, default=475.0)
    ap.add_argument("--max-steps", type=int, default=150_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the result (returns, curve, stats) here")
    ap.add_argument("--dashboard", default=":8787",
                    help="dashboard address of the LocalCluster ('' for none)")
    args = ap.parse_args()
    cfg = DQNConfig(target_return=args.target, max_env_steps=args.max_steps, seed=args.seed)

    def progress(d: dict) -> None:
        if d["episodes"] and d["episodes"] % 50 == 0:
            print(f"  {d['env_steps']:>7,} env steps  {d['updates']:>6,} updates  "
                  f"mean return {d['mean_return']:6.1f}  epsilon {d['epsilon']:.2f}", flush=True)

    if args.scheduler:
        client, cluster = Client(args.scheduler), None
    else:
        if args.dashboard:
            import dask_research.dashboard  # noqa: F401  (the research pages, before the scheduler starts)
        cluster = LocalCluster(n_workers=args.workers, threads_per_worker=2,
                               dashboard_address=args.dashboard or None)
        client = Client(cluster)
        if args.dashboard:
            print(f"dashboard: {client.dashboard_link.replace('/status', '/individual-research-experience')}",
                  flush=True)
    try:
        result = train_dqn(client, cfg, progress=progress)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    print(result.summary())
    d = result.plane_stats.get("delivery", {})
    print(f"learner exposed latency: mean {d.get('exposed_mean_s', float('nan')) * 1e3:.2f} ms, "
          f"{d.get('exposed_fraction', float('nan')):.1%} of a step")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": result.summary(), "returns": result.returns,
                       "curve": result.curve, "config": result.config,
                       "solved_at_env_steps": result.solved_at_env_steps,
                       "final_mean_return": result.final_mean_return}, f, default=float)


if __name__ == "__main__":
    main()
