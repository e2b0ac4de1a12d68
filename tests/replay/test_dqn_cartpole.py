"""Integration: double DQN with prioritized replay through the cluster plane actually learns.

Actors on two worker processes, the learner here. Learning is judged on a step budget, never
on the clock: with seed 0, CartPole-v1's mean return over the last 20 episodes reaches 150
(random play: about 22) within 100,000 environment steps, however slow the machine (measured:
13k to 20k steps for seed 0, at most 37k over seeds 0-3; the run stops when it gets there).
A short run of the same path (3,000 steps) checks the plumbing in the fast lane.
"""
import pytest

pytest.importorskip("gymnasium")
pytest.importorskip("torch")

from distributed import Client, LocalCluster  # noqa: E402

from dask_research.replay.rl import DQNConfig, train_dqn  # noqa: E402

#: A 64-unit network: the same learning in a quarter of the learner's time of the default 256.
SMALL = dict(hidden=64, seed=0)


def _open_envs(dask_worker=None):
    from dask_research.replay.rl import actor

    return len(actor._ENVS)


def _train(cfg, left_open=None):
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True,
                      dashboard_address=None) as cluster, Client(cluster, set_as_default=False) as c:
        result = train_dqn(c, cfg)
        if left_open is not None:
            left_open.update(c.run(_open_envs))
        return result


def _both_shards_served(result):
    s = result.plane_stats
    assert s["live_shards"] == 2 and not s["lost_shards"]
    assert all(sh["size"] > 0 and sh["sampled"] > 0 for sh in s["shards"])   # both shards serve
    assert s["updates_applied"] > 0.9 * s["updates_queued"] > 0


@pytest.mark.timeout(300, method="thread")
def test_a_short_double_dqn_run_feeds_the_learner_from_both_shards_and_routes_priorities():
    left_open: dict = {}
    result = _train(DQNConfig(target_return=500.0, max_env_steps=3_000, learning_starts=1_000, **SMALL), left_open)
    assert not result.solved and result.env_steps >= 3_000
    assert len(left_open) == 2 and set(left_open.values()) == {0}    # the actors' environments are closed
    # Half an update per step after learning starts; the actors run at most two rollouts of
    # 8 x 32 steps each ahead of the learner (the loop's throttle), whatever the speed.
    assert result.updates >= (result.env_steps - 1_000 - 2 * 2 * 8 * 32) * 0.5 > 0
    assert len(result.returns) >= 20 and result.curve                     # episodes were recorded
    _both_shards_served(result)


@pytest.mark.slow
@pytest.mark.timeout(1200, method="thread")
def test_double_dqn_with_prioritized_cluster_replay_learns_cartpole():
    result = _train(DQNConfig(target_return=150.0, max_env_steps=100_000, **SMALL))
    assert result.solved, result.summary()
    assert result.final_mean_return >= 150 and result.solved_at_env_steps <= 100_000
    assert result.updates > 1000
    _both_shards_served(result)


@pytest.mark.timeout(300, method="thread")
def test_a_rollout_that_dask_cancels_is_run_again_and_the_run_goes_on(caplog):
    """A rollout future that comes back cancelled (a lost dependency, an operator's cancel) is
    submitted again with fresh weights instead of read (reading it raised inside Dask)."""
    from distributed import Future

    cancelled: list = []

    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True,
                      dashboard_address=None) as cluster, Client(cluster, set_as_default=False) as c:
        def progress(_counters):
            if cancelled:
                return
            keys = [k for ks in c.processing().values() for k in ks if str(k).startswith("rollout-")]
            if keys:
                c.cancel([Future(keys[0], client=c)], reason="the test cancels it")
                cancelled.append(keys[0])

        with caplog.at_level("WARNING", logger="dask_research.replay.rl.dqn"):
            result = train_dqn(c, DQNConfig(target_return=500.0, max_env_steps=2_000,
                                            learning_starts=1_000, **SMALL), progress=progress)
    assert cancelled, "no rollout was in flight to cancel"
    said = [r.getMessage() for r in caplog.records if "was cancelled by Dask" in r.getMessage()]
    assert len(said) == 1 and str(cancelled[0]) in said[0] and "the test cancels it" in said[0]
    assert result.env_steps >= 2_000 and result.updates > 0      # the run went on to its budget


class _Cancelled:
    def __init__(self, key, reason):
        self.key, self.reason, self.status = key, reason, "cancelled"

    def result(self, timeout=None):
        from dask_research._compat import FutureCancelledError

        raise FutureCancelledError(self.key, reason=self.reason)


def test_a_cancelled_rollout_stops_the_run_in_one_line_when_retrying_cannot_help():
    from types import SimpleNamespace

    from dask_research.exceptions import ResearchError
    from dask_research.replay.rl import dqn

    live, lost = SimpleNamespace(status="running"), SimpleNamespace(status="closed")
    dqn._resubmittable(live, _Cancelled("rollout-a", "lost dependencies"), 0)    # retried: no error
    with pytest.raises(ResearchError, match=r"lost its scheduler .*rollout-a.*reason: gone"):
        dqn._resubmittable(lost, _Cancelled("rollout-a", "gone"), 0)
    with pytest.raises(ResearchError, match=r"lost its scheduler .*scheduler-connection-lost"):
        dqn._resubmittable(live, _Cancelled("rollout-a", "scheduler-connection-lost"), 0)   # reconnected
    with pytest.raises(ResearchError, match=r"cancelled 32 rollouts of one actor in a row .*rollout-b"):
        dqn._resubmittable(live, _Cancelled("rollout-b", None), dqn.MAX_CANCELLED_IN_A_ROW - 1)


def test_an_actor_reports_the_episodes_of_a_rollout_whose_result_never_arrived():
    """The learner passes how many of an actor's episodes it has received; a rollout Dask
    cancelled while it ran still stepped its environments, and the next one reports those too."""
    from dask_research.replay.rl.actor import _unseen_episodes

    st = {"episodes": [], "episodes_base": 0}
    assert _unseen_episodes(st, [10.0, 11.0], 0) == [10.0, 11.0]          # received: 2
    assert _unseen_episodes(st, [12.0], 2) == [12.0]                       # its result is lost
    assert _unseen_episodes(st, [13.0], 2) == [12.0, 13.0]                 # the next one has both
    assert st == {"episodes": [12.0, 13.0], "episodes_base": 2}            # what was received is gone
    assert _unseen_episodes(st, [14.0], None) == [14.0]                    # no count: this call's only


def test_actors_of_a_worker_that_left_stop_and_training_goes_on_with_the_others(monkeypatch, caplog):
    from dask_research.exceptions import ResearchError
    from dask_research.replay.rl import dqn

    class _F:
        cancelled = False

        def cancel(self):
            self.cancelled = True

    addr_of = {0: "tcp://a:1", 1: "tcp://b:1", 2: "tcp://a:1", 3: "tcp://b:1"}
    running, idle = {0: _F(), 1: _F()}, [2, 3]
    monkeypatch.setattr(dqn, "workers_info", lambda client: {"tcp://a:1": {}})
    lost = running[1]
    with caplog.at_level("WARNING", logger="dask_research.replay.rl.dqn"):
        dqn._drop_lost_actors(None, addr_of, running, idle)
        dqn._drop_lost_actors(None, addr_of, running, idle)                # said once
    assert list(running) == [0] and idle == [2] and lost.cancelled
    assert [r.getMessage() for r in caplog.records] == [
        "worker(s) tcp://b:1 left the cluster: their actors stop; training goes on with 2 actors"]
    monkeypatch.setattr(dqn, "workers_info", lambda client: {})
    with pytest.raises(ResearchError, match="the workers of every actor left the cluster"):
        dqn._drop_lost_actors(None, addr_of, running, idle)
