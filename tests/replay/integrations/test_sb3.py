"""SB3ReplayBuffer: every call Stable-Baselines3 makes, against SB3's own ReplayBuffer."""
import pickle
import threading

import numpy as np
import pytest

th = pytest.importorskip("torch")
pytest.importorskip("stable_baselines3")
gym = pytest.importorskip("gymnasium")

from distributed.utils_test import cleanup, client, cluster_fixture, loop, loop_in_thread  # noqa: E402,F401
from gymnasium import spaces  # noqa: E402
from stable_baselines3 import DQN, SAC, TD3  # noqa: E402
from stable_baselines3.common.buffers import ReplayBuffer  # noqa: E402
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402
from stable_baselines3.common.type_aliases import ReplayBufferSamples  # noqa: E402
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize  # noqa: E402

from dask_research.exceptions import InputError, ResearchError  # noqa: E402
from dask_research.replay import PrioritizedSampler  # noqa: E402
from dask_research.replay.integrations import SB3ReplayBuffer  # noqa: E402

BOX = spaces.Box(-10, 10, (3,), np.float32)
CASES = {
    "discrete-action": (BOX, spaces.Discrete(4)),
    "box-action-f64": (BOX, spaces.Box(-1, 1, (2,), np.float64)),   # stored as float32 by SB3
    "discrete-obs": (spaces.Discrete(7), spaces.Discrete(3)),
    "image-uint8": (spaces.Box(0, 255, (2, 3, 3), np.uint8), spaces.MultiDiscrete([2, 3])),
}


def _fill(buffers, obs_space, act_space, n_envs, steps, seed=0):
    """The same transitions, with terminations and time limits, into every buffer."""
    rng = np.random.default_rng(seed)
    obs_space.seed(seed)
    act_space.seed(seed)
    for _ in range(steps):
        obs = np.stack([obs_space.sample() for _ in range(n_envs)])
        nxt = np.stack([obs_space.sample() for _ in range(n_envs)])
        act = np.stack([act_space.sample() for _ in range(n_envs)])
        rew = rng.normal(size=n_envs).astype(np.float32)
        done = rng.random(n_envs) < 0.3
        infos = [{"TimeLimit.truncated": bool(d and rng.random() < 0.5)} if d else {} for d in done]
        for b in buffers:
            b.add(obs, nxt, act, rew, done, infos)


def _assert_same(ours, theirs):
    assert isinstance(ours, ReplayBufferSamples)
    for name in ReplayBufferSamples._fields:
        a, b = getattr(ours, name), getattr(theirs, name)
        if b is None:
            assert a is None, name
            continue
        assert a.shape == b.shape, (name, a.shape, b.shape)
        assert a.dtype == b.dtype, (name, a.dtype, b.dtype)
        assert a.device == b.device, name
        assert th.equal(a, b), name


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("n_envs", [1, 2])
@pytest.mark.parametrize("timeouts", [True, False])
def test_samples_match_sb3_field_by_field(case, n_envs, timeouts):
    """Same transitions (wrapping the ring), same rows: every field equal in shape, dtype,
    device and value; our own ``sample()`` draws only stored transitions, mapped by key."""
    obs_space, act_space = CASES[case]
    kw = dict(device="cpu", n_envs=n_envs, handle_timeout_termination=timeouts)
    sb = ReplayBuffer(20, obs_space, act_space, **kw)
    ours = SB3ReplayBuffer(20, obs_space, act_space, seed=1, flush_every=3, **kw)
    _fill([sb, ours], obs_space, act_space, n_envs, steps=27)
    assert (ours.pos, ours.full, ours.size(), ours.buffer_size) == (sb.pos, sb.full, sb.size(),
                                                                    sb.buffer_size)
    rows = np.arange(sb.size())
    np.random.seed(5)
    want = sb._get_samples(rows)
    np.random.seed(5)
    _assert_same(ours._get_samples(rows), want)

    s = ours.sample(64)
    keys = ours.last_indices
    r, e = (keys // n_envs) % sb.buffer_size, keys % n_envs
    dones = sb.dones[r, e] * (1 - sb.timeouts[r, e])
    np.testing.assert_array_equal(s.observations.numpy(), sb.observations[r, e].reshape(64, *sb.obs_shape))
    np.testing.assert_array_equal(s.next_observations.numpy(),
                                  sb.next_observations[r, e].reshape(64, *sb.obs_shape))
    np.testing.assert_array_equal(s.actions.numpy(), sb.actions[r, e])
    np.testing.assert_array_equal(s.rewards.numpy(), sb.rewards[r, e][:, None])
    np.testing.assert_array_equal(s.dones.numpy(), dones[:, None])
    assert s.rewards.shape == s.dones.shape == (64, 1)
    assert s.rewards.dtype == s.dones.dtype == th.float32
    assert s.discounts is None


def test_timeouts_bootstrap_and_both_flags_are_kept():
    obs_space, act_space = BOX, spaces.Discrete(2)
    rb = SB3ReplayBuffer(100, obs_space, act_space, device="cpu", seed=0)
    o = np.zeros((1, 3), np.float32)
    rb.add(o, o, np.array([0]), np.array([1.0]), np.array([True]), [{"TimeLimit.truncated": True}])
    rb.add(o, o, np.array([0]), np.array([1.0]), np.array([True]), [{}])
    rb.add(o, o, np.array([0]), np.array([1.0]), np.array([False]), [{}])
    rb.flush()
    c = rb.plane.contents()
    np.testing.assert_array_equal(c["done"], [1, 1, 0])
    np.testing.assert_array_equal(c["truncated"], [1, 0, 0])
    s = rb._get_samples(np.array([0, 1, 2]))
    np.testing.assert_array_equal(s.dones.numpy()[:, 0], [0, 1, 0])   # time limit: bootstrap
    off = SB3ReplayBuffer(100, obs_space, act_space, device="cpu", handle_timeout_termination=False)
    off.add(o, o, np.array([0]), np.array([1.0]), np.array([True]), [{"TimeLimit.truncated": True}])
    assert off._get_samples(np.array([0])).dones.item() == 1.0


def test_float_dones_and_bool_dones_both_accepted():
    rb = SB3ReplayBuffer(10, BOX, spaces.Discrete(2), device="cpu", seed=0)
    o = np.zeros((1, 3), np.float32)
    rb.add(o, o, np.array([1]), np.array([0.5]), np.array([1.0]), [{}])
    rb.add(o, o, np.array([1]), np.array([0.5]), np.array([False]), [{}])
    s = rb._get_samples(np.array([0, 1]))
    assert s.dones.dtype == th.float32
    target = s.rewards + 0.99 * (1 - s.dones)         # SB3's TD target: (B, 1), no broadcasting
    assert target.shape == (2, 1)


def test_optimize_memory_usage_is_refused_clearly():
    with pytest.raises(InputError, match="optimize_memory_usage=True.*pass optimize_memory_usage=False"):
        DQN("MlpPolicy", "CartPole-v1", buffer_size=100, optimize_memory_usage=True,
            replay_buffer_class=SB3ReplayBuffer,
            replay_buffer_kwargs={"handle_timeout_termination": False})


def test_n_step_returns_are_refused_clearly():
    """SB3's replay_buffer_kwargs={"n_steps": 3} (its NStepReplayBuffer's argument) reached the
    buffer as a bare TypeError; now one line that says what is not provided and what to do."""
    with pytest.raises(InputError, match="n_steps.*not provided.*NStepReplayBuffer.*NStepReturn"):
        DQN("MlpPolicy", "CartPole-v1", buffer_size=100, replay_buffer_class=SB3ReplayBuffer,
            replay_buffer_kwargs={"n_steps": 3, "gamma": 0.99})
    with pytest.raises(InputError, match="colour.*one of SB3ReplayBuffer's arguments"):
        SB3ReplayBuffer(10, BOX, spaces.Discrete(2), device="cpu", colour="red")


def test_dict_observations_are_refused_clearly():
    with pytest.raises(InputError, match="DictReplayBuffer"):
        SB3ReplayBuffer(10, spaces.Dict({"a": BOX}), spaces.Discrete(2), device="cpu")


@pytest.mark.timeout(240, method="thread")
@pytest.mark.parametrize("algo", ["DQN", "SAC", "TD3"])
def test_learn_with_two_envs(algo):
    """SB3's own call path: construction with its kwargs, add from collect_rollouts with
    n_envs=2 (DummyVecEnv), sample from train."""
    env_id, cls = {"DQN": ("CartPole-v1", DQN), "SAC": ("Pendulum-v1", SAC),
                   "TD3": ("Pendulum-v1", TD3)}[algo]
    env = make_vec_env(env_id, n_envs=2, seed=0, vec_env_cls=DummyVecEnv)
    model = cls("MlpPolicy", env, buffer_size=1_000, learning_starts=64, batch_size=32,
                train_freq=4, gradient_steps=1, policy_kwargs={"net_arch": [16]}, seed=0,
                replay_buffer_class=SB3ReplayBuffer,
                replay_buffer_kwargs={"handle_timeout_termination": True})
    model.learn(300)
    rb = model.replay_buffer
    assert isinstance(rb, SB3ReplayBuffer) and rb.n_envs == 2 and rb.buffer_size == 500
    assert model.num_timesteps >= 300
    assert rb.size() * 2 == len(rb.plane) == model.num_timesteps
    assert model._n_updates > 0


@pytest.mark.timeout(240, method="thread")
def test_vecnormalize_normalizes_samples_as_sb3_does():
    venv = VecNormalize(make_vec_env("Pendulum-v1", n_envs=1, seed=0), norm_obs=True, norm_reward=True)
    model = SAC("MlpPolicy", venv, buffer_size=500, learning_starts=50, batch_size=16,
                policy_kwargs={"net_arch": [16]}, seed=0, replay_buffer_class=SB3ReplayBuffer)
    model.learn(120)
    rb = model.replay_buffer
    sb = ReplayBuffer(500, venv.observation_space, venv.action_space, device=rb.device)
    c = rb.plane.contents()
    for i in range(len(c["obs"])):
        sb.add(c["obs"][i:i + 1], c["next_obs"][i:i + 1], c["action"][i:i + 1], c["reward"][i:i + 1],
               c["done"][i:i + 1], [{"TimeLimit.truncated": bool(c["truncated"][i])}])
    rows = np.arange(sb.size())
    _assert_same(rb._get_samples(rows, env=venv), sb._get_samples(rows, env=venv))
    s = rb.sample(16, env=venv)
    assert s.observations.dtype == th.float32 and s.rewards.shape == (16, 1)
    raw = rb._get_samples(rows)
    assert not th.equal(raw.observations, rb._get_samples(rows, env=venv).observations)


@pytest.mark.timeout(240, method="thread")
def test_save_and_load_replay_buffer_round_trip(tmp_path):
    model = DQN("MlpPolicy", "CartPole-v1", buffer_size=500, learning_starts=50,
                policy_kwargs={"net_arch": [16]}, seed=0, replay_buffer_class=SB3ReplayBuffer,
                replay_buffer_kwargs={"sampler": PrioritizedSampler(alpha=0.6, beta=0.4), "seed": 3})
    model.learn(130)
    rb = model.replay_buffer
    rb.add(*[np.zeros((1, 4), np.float32)] * 2, np.array([1]), np.array([2.0]), np.array([0.0]), [{}])
    state = rb.__getstate__()
    assert not any(isinstance(v, (type(threading.Lock()), type(threading.RLock()), threading.Thread,
                                  threading.Event)) for v in state.values())
    path = tmp_path / "rb.pkl"
    model.save_replay_buffer(path)
    expect = rb.sample(32)
    keys = rb.last_indices.copy()

    other = DQN("MlpPolicy", "CartPole-v1", buffer_size=500, seed=1,
                replay_buffer_class=SB3ReplayBuffer)
    other.load_replay_buffer(path)
    rb2 = other.replay_buffer
    assert isinstance(rb2, SB3ReplayBuffer) and rb2 is not rb
    assert (rb2.pos, rb2.full, rb2.size(), len(rb2.plane)) == (rb.pos, rb.full, rb.size(), len(rb.plane))
    assert type(rb2.plane.sampler).__name__ == "PrioritizedSampler"
    got = rb2.sample(32)                       # same generator state: the same batch
    np.testing.assert_array_equal(rb2.last_indices, keys)
    _assert_same(got, expect)
    other.learn(50, reset_num_timesteps=False)   # and training goes on with it
    assert rb2.size() == rb.size() + other.num_timesteps


def test_reset_and_extend():
    rb = SB3ReplayBuffer(8, BOX, spaces.Discrete(2), device="cpu", seed=0)
    o = np.ones((5, 1, 3), np.float32)
    rb.extend(o, o, np.zeros((5, 1)), np.ones((5, 1)), np.zeros((5, 1)), [[{}]] * 5)
    assert rb.size() == 5 and rb.sample(4).observations.shape == (4, 3)
    rb.reset()
    assert (rb.pos, rb.full, rb.size(), len(rb.plane)) == (0, False, 0, 0)
    rb.add(o[0], o[0], np.zeros(1), np.ones(1), np.zeros(1), [{}])
    assert len(rb.plane.contents()["obs"]) == 1


def test_every_added_transition_is_sampled_before_a_flush():
    """Staged rows reach the plane before any read: a fresh transition is sampleable at once."""
    rb = SB3ReplayBuffer(1000, BOX, spaces.Discrete(2), device="cpu", seed=0, flush_every=64)
    o = np.zeros((1, 3), np.float32)
    rb.add(o, o + 7, np.array([1]), np.array([3.0]), np.array([0]), [{}])
    s = rb.sample(5)
    assert (s.next_observations == 7).all() and (s.rewards == 3).all()


def test_prioritized_sampling_with_user_fed_priorities():
    rb = SB3ReplayBuffer(100, BOX, spaces.Discrete(2), device="cpu", seed=0,
                         sampler=PrioritizedSampler(alpha=1.0, beta=0.4))
    for i in range(50):
        o = np.full((1, 3), i, np.float32)
        rb.add(o, o, np.array([0]), np.array([float(i)]), np.array([0]), [{}])
    rb.sample(50)
    assert rb.last_weights.shape == (50, 1) and rb.last_weights.dtype == th.float32
    keys = np.arange(50)
    rb.update_priorities(keys, np.where(keys == 7, 1000.0, 1e-3))
    s = rb.sample(200)
    assert (s.rewards == 7).float().mean() > 0.9


@pytest.mark.slow
def test_cluster_plane_backing(client):  # noqa: F811
    rb = SB3ReplayBuffer(64, BOX, spaces.Discrete(2), device="cpu", seed=0, client=client,
                         flush_every=8)
    assert not rb.is_local
    o = np.zeros((1, 3), np.float32)
    for i in range(20):
        rb.add(o + i, o, np.array([1]), np.array([1.0]), np.array([0]), [{}])
    s = rb.sample(16)
    assert s.observations.shape == (16, 3) and s.rewards.shape == (16, 1)
    assert len(rb.plane) == 20 and rb.size() == 20
    with pytest.raises(ResearchError, match="plane.checkpoint"):
        pickle.dumps(rb)
    rb.plane.close(drop=True)



def _dqn(seed, **kw):
    th.manual_seed(seed)
    return DQN("MlpPolicy", "CartPole-v1", buffer_size=2_000, learning_starts=200, batch_size=32,
               train_freq=4, target_update_interval=100, policy_kwargs={"net_arch": [32]},
               seed=seed, device="cpu", **kw)


@pytest.mark.timeout(240, method="thread")
def test_sb3_sampling_trains_bit_for_bit_like_sb3s_own_buffer():
    """With SB3's draw (sb3_sampling=True), DQN on CartPole with our buffer ends with exactly
    the weights SB3's own buffer gives: same transitions, same batches, same shapes/dtypes."""
    threads = th.get_num_threads()
    th.set_num_threads(1)
    try:
        a = _dqn(0)
        a.learn(1_500)
        b = _dqn(0, replay_buffer_class=SB3ReplayBuffer, replay_buffer_kwargs={"sb3_sampling": True})
        b.learn(1_500)
    finally:
        th.set_num_threads(threads)
    assert b.replay_buffer.size() == a.replay_buffer.size() and b._n_updates == a._n_updates > 0
    for (name, p), (_, q) in zip(a.policy.state_dict().items(), b.policy.state_dict().items()):
        assert th.equal(p, q), name
    c = b.replay_buffer.plane.contents()
    np.testing.assert_array_equal(c["obs"], a.replay_buffer.observations[:1_500, 0])
    np.testing.assert_array_equal(c["truncated"], a.replay_buffer.timeouts[:1_500, 0])


def test_default_seed_leaves_numpy_global_stream_alone():
    np.random.seed(3)
    expect = np.random.random(3)
    np.random.seed(3)
    rb1 = SB3ReplayBuffer(10, BOX, spaces.Discrete(2), device="cpu")
    assert np.array_equal(np.random.random(3), expect)
    np.random.seed(3)
    rb2 = SB3ReplayBuffer(10, BOX, spaces.Discrete(2), device="cpu")
    assert rb1._seed == rb2._seed


@pytest.mark.timeout(240, method="thread")
def test_prioritized_dqn_weights_the_loss_and_sends_td_errors_back():
    from dask_research.replay.integrations import PrioritizedDQN

    model = PrioritizedDQN("MlpPolicy", "CartPole-v1", buffer_size=1_000, learning_starts=100,
                           batch_size=32, train_freq=4, policy_kwargs={"net_arch": [16]}, seed=0,
                           alpha=0.6, beta=0.4)
    model.learn(400)
    rb = model.replay_buffer
    assert isinstance(rb, SB3ReplayBuffer) and rb.last_weights is not None
    st = rb.plane.stats()
    assert st["priority_updates"] == 32 * model._n_updates > 0
    leaf = rb.plane.sampler.tree.sum[rb.plane.sampler.tree.L:][:len(rb.plane)]
    assert len(np.unique(np.round(leaf, 9))) > 10          # priorities now differ per transition


@pytest.mark.gpu
@pytest.mark.skipif(not th.cuda.is_available(), reason="needs a CUDA device")
def test_samples_on_cuda_match_sb3():
    obs_space, act_space = CASES["box-action-f64"]
    sb = ReplayBuffer(20, obs_space, act_space, device="cuda")
    ours = SB3ReplayBuffer(20, obs_space, act_space, device="cuda", seed=0)
    _fill([sb, ours], obs_space, act_space, 1, steps=25)
    rows = np.arange(sb.size())
    np.random.seed(1)
    want = sb._get_samples(rows)
    np.random.seed(1)
    got = ours._get_samples(rows)
    _assert_same(got, want)
    assert got.observations.device.type == "cuda"
