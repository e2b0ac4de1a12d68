"""DQN on CartPole with SB3ReplayBuffer reaches SB3's own return band (slow: ~1-3 minutes)."""
import numpy as np
import pytest

th = pytest.importorskip("torch")
pytest.importorskip("stable_baselines3")

from stable_baselines3 import DQN  # noqa: E402
from stable_baselines3.common.evaluation import evaluate_policy  # noqa: E402

from dask_research.replay.integrations import SB3ReplayBuffer  # noqa: E402

#: SB3 RL-zoo DQN CartPole-v1 hyperparameters, 64x64 MLP (benchmarks/bench_integrations.py)
ZOO = dict(learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1_000,
           gamma=0.99, target_update_interval=10, train_freq=256, gradient_steps=128,
           exploration_fraction=0.16, exploration_final_eps=0.04,
           policy_kwargs={"net_arch": [64, 64]})
STEPS = 20_000          # measured: enough for SB3's buffer to leave the random band (~20)


def _run(seed, **kw):
    th.manual_seed(seed)
    model = DQN("MlpPolicy", "CartPole-v1", seed=seed, device="cpu", **ZOO, **kw)
    model.learn(STEPS)
    mean, _ = evaluate_policy(model, model.get_env(), n_eval_episodes=10, deterministic=True)
    return model, mean


@pytest.mark.slow
@pytest.mark.timeout(600, method="thread")
def test_dqn_cartpole_return_band_same_seeds_and_budget():
    threads = th.get_num_threads()
    th.set_num_threads(1)            # deterministic on one thread
    try:
        # 1. SB3's draw: the run is SB3's own, bit for bit, so the return is the same
        ref, ret_sb3 = _run(0)
        ours, ret_ours = _run(0, replay_buffer_class=SB3ReplayBuffer,
                              replay_buffer_kwargs={"sb3_sampling": True})
        for (name, p), (_, q) in zip(ref.policy.state_dict().items(),
                                     ours.policy.state_dict().items()):
            assert th.equal(p, q), name
        assert ret_ours == ret_sb3 and ret_sb3 > 60, (ret_sb3, ret_ours)
        # 2. the plane's own sampler and generator: a different random stream, same band
        plane_returns = [_run(s, replay_buffer_class=SB3ReplayBuffer)[1] for s in (0, 1)]
    finally:
        th.set_num_threads(threads)
    print(f"SB3 buffer seed 0: {ret_sb3:.0f}; plane sampler seeds 0, 1: {plane_returns}")
    assert np.mean(plane_returns) > 60 and min(plane_returns) > 40, plane_returns
