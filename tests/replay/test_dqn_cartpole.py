"""Integration: double DQN with prioritized replay through the cluster plane actually learns.

Actors on two worker processes, the learner here. CartPole-v1's mean return over the last 20
episodes must reach 150 (random play: about 22) within 60,000 environment steps.
"""
import pytest

pytest.importorskip("gymnasium")
pytest.importorskip("torch")

from distributed import Client, LocalCluster  # noqa: E402

from dask_research.replay.rl import DQNConfig, train_dqn  # noqa: E402


@pytest.mark.timeout(240)
def test_double_dqn_with_prioritized_cluster_replay_learns_cartpole():
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True,
                      dashboard_address=None) as cluster, Client(cluster, set_as_default=False) as c:
        result = train_dqn(c, DQNConfig(target_return=150.0, max_env_steps=60_000, seed=0,
                                        max_seconds=170))
    assert result.solved, result.summary()
    assert result.final_mean_return >= 150
    assert result.updates > 1000
    s = result.plane_stats
    assert s["live_shards"] == 2 and not s["lost_shards"]
    assert all(sh["size"] > 0 and sh["sampled"] > 0 for sh in s["shards"])   # both shards serve
    assert s["updates_applied"] > 0.9 * s["updates_queued"] > 0
