"""PlaneEpisodeReplayBuffer: RLlib's episode buffer interface (skipped without ray[rllib])."""
import numpy as np
import pytest

pytest.importorskip("ray.rllib")

from ray.rllib.env.single_agent_episode import SingleAgentEpisode  # noqa: E402

from dask_research.exceptions import InputError  # noqa: E402
from dask_research.replay.integrations.rllib import PlaneEpisodeReplayBuffer  # noqa: E402


def _episode(n, start=0, terminated=True):
    obs = [np.full(4, start + t, np.float32) for t in range(n + 1)]
    return SingleAgentEpisode(observations=obs, actions=[start + t for t in range(n)],
                              rewards=[float(start + t) for t in range(n)],
                              terminated=terminated, len_lookback_buffer=0)


def test_add_and_sample_one_step_episodes():
    rb = PlaneEpisodeReplayBuffer(capacity=100, seed=0)
    rb.add([_episode(5), _episode(3, start=10, terminated=False)])
    assert len(rb) == 8
    eps = rb.sample(num_items=32, n_step=1, sample_episodes=True, gamma=0.99)
    assert len(eps) == 32
    for ep in eps:
        o, o2 = ep.get_observations(0), ep.get_observations(-1)
        a, r = ep.get_actions(0), ep.get_rewards(0)
        assert o[0] == a == r and o2[0] == a + 1
        assert ep.is_terminated == (a == 4)           # only the last step of the finished one
        assert ep.get_extra_model_outputs("n_step", 0) == 1
    state = rb.get_state()
    rb2 = PlaneEpisodeReplayBuffer(capacity=100)
    rb2.set_state(state)
    assert len(rb2) == 8


def test_unsupported_sampling_is_refused():
    rb = PlaneEpisodeReplayBuffer(capacity=10)
    rb.add(_episode(3))
    with pytest.raises(InputError, match="n_step"):
        rb.sample(num_items=2, n_step=3, sample_episodes=True)
    with pytest.raises(InputError, match="batch_length_T"):
        rb.sample(num_items=2, n_step=1, batch_length_T=8, sample_episodes=True)


# The RLlib DQN run on CartPole with this buffer is the integrations page's own block, run as
# written in a fresh directory: tests/test_docs_blocks.py::test_a_block_runs_as_written.
