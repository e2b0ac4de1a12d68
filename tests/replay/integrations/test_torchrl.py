"""TensorDict in and out of a plane; PlaneStorage/PlaneSampler inside torchrl.data.ReplayBuffer."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tensordict")
pytest.importorskip("torchrl.data")

from tensordict import TensorDict  # noqa: E402
from torchrl.data import ReplayBuffer  # noqa: E402

from dask_research.exceptions import InputError  # noqa: E402
from dask_research.replay import ExperiencePlane, PrioritizedSampler  # noqa: E402
from dask_research.replay.integrations.torchrl import (  # noqa: E402
    PlaneSampler,
    PlaneStorage,
    from_tensordict,
    ingest_tensordict,
    plane_replay_buffer,
    tensordict_batches,
    to_tensordict,
)

SPEC = {"observation": ((4,), "float32"), "action": ((), "int64"),
        "next.observation": ((4,), "float32"), "next.reward": ((1,), "float32"),
        "next.terminated": ((1,), "bool"), "next.truncated": ((1,), "bool")}


def _td(n, start=0):
    k = torch.arange(start, start + n)
    return TensorDict({"observation": k[:, None].float().expand(n, 4).clone(), "action": k,
                       "next": {"observation": k[:, None].float().expand(n, 4) + 1,
                                "reward": k[:, None].float(),
                                "terminated": (k % 5 == 4)[:, None],
                                "truncated": torch.zeros(n, 1, dtype=torch.bool)}},
                      batch_size=[n])


def test_tensordict_in_and_out_round_trip():
    plane = ExperiencePlane(SPEC, capacity=100, seed=0)
    assert ingest_tensordict(plane, _td(10)) == 10
    assert ingest_tensordict(plane, _td(1, 10)[0]) == 1          # one transition, batch_size []
    b = plane.sample(16)
    td = to_tensordict(b)
    assert td.batch_size == torch.Size([16])
    assert td["next", "terminated"].dtype == torch.bool and td["next", "reward"].shape == (16, 1)
    assert torch.equal(td["index"], torch.from_numpy(b.indices))
    assert torch.equal(td["action"], td["index"])              # key k holds action k
    assert torch.equal(td["next", "observation"], td["observation"] + 1)
    back = from_tensordict(td)
    assert set(back) == set(SPEC)


def test_a_tensordict_that_does_not_fit_gets_a_spec_error():
    from dask_research.exceptions import SpecError

    plane = ExperiencePlane(SPEC, capacity=100)
    bad = _td(3)
    bad["extra"] = torch.zeros(3)
    with pytest.raises(SpecError, match="'extra': is not in the spec"):
        ingest_tensordict(plane, bad)
    assert len(plane) == 0


def test_tensordict_batches_prefetched():
    plane = ExperiencePlane(SPEC, capacity=100, seed=0)
    ingest_tensordict(plane, _td(50))
    with tensordict_batches(plane, batch_size=8, prefetch=2, max_batches=3) as it:
        tds = list(it)
    assert len(tds) == 3 and all(isinstance(t, TensorDict) and t.batch_size == (8,) for t in tds)
    assert tds[0]["next", "observation"].dtype == torch.float32
    plane.close()


@pytest.mark.parametrize("tensordict_rb", [False, True])
def test_torchrl_replay_buffer_on_the_plane(tensordict_rb):
    plane = ExperiencePlane(SPEC, capacity=32, seed=0, sampler=PrioritizedSampler(alpha=1.0, beta=0.5))
    rb = plane_replay_buffer(plane, batch_size=16, tensordict=tensordict_rb)
    rb.extend(_td(20))
    rb.extend(_td(20, 20))                      # wraps the ring: keys 8..39 are stored
    assert len(rb) == 32
    td, info = rb.sample(return_info=True)
    keys = info["index"]
    assert td.batch_size == (16,) and ((keys >= 8) & (keys < 40)).all()
    assert torch.equal(td["action"], keys) and info["priority_weight"].shape == (16,)
    stored = torch.arange(8, 40)
    rb.update_priority(stored, torch.where(stored == 30, 1e4, 1e-4).float())
    assert (rb.sample()["action"] == 30).float().mean() > 0.9
    # a stale key (overwritten since sampled) is dropped, not applied to its successor
    rb.extend(_td(32, 40))
    rb.update_priority(torch.tensor([30]), torch.tensor([1e6]))
    assert plane.stats()["stale_priority_updates"] >= 1
    rb.empty()
    assert len(rb) == 0
    rb.extend(_td(4, 100))
    assert (rb.sample()["action"] >= 100).all()


def test_plain_replay_buffer_with_explicit_pair_and_checkpoint(tmp_path):
    plane = ExperiencePlane(SPEC, capacity=64, seed=0)
    rb = ReplayBuffer(storage=PlaneStorage(plane), sampler=PlaneSampler(), batch_size=8,
                      collate_fn=lambda x: x)
    rb.extend(_td(40))
    rb.dumps(tmp_path / "rb")
    plane2 = ExperiencePlane(SPEC, capacity=64, seed=1)
    rb2 = plane_replay_buffer(plane2, batch_size=8)
    rb2.loads(tmp_path / "rb")
    assert len(rb2) == 40
    rb2.extend(_td(4, 40))                       # the writer goes on where it stopped
    assert len(rb2) == 44
    np.testing.assert_array_equal(plane2.contents()["action"], np.arange(44))
    sd = rb.state_dict()
    plane3 = ExperiencePlane(SPEC, capacity=64)
    rb3 = plane_replay_buffer(plane3)
    rb3.load_state_dict(sd)
    assert len(rb3) == 40


def test_extend_larger_than_the_plane_keeps_the_newest_as_torchrl_does():
    """700 rows into a 500-row ring: TorchRL's LazyTensorStorage keeps the newest 500; so does
    a plane behind PlaneStorage (it raised CapacityError)."""
    from torchrl.data import LazyTensorStorage

    theirs = ReplayBuffer(storage=LazyTensorStorage(500), batch_size=8)
    theirs.extend(_td(700))
    plane = ExperiencePlane(SPEC, capacity=500)
    ours = plane_replay_buffer(plane, batch_size=8)
    ours.extend(_td(700))
    assert len(ours) == len(theirs) == 500
    np.testing.assert_array_equal(np.sort(plane.contents()["action"]), np.arange(200, 700))
    assert set(theirs[:]["action"].tolist()) == set(range(200, 700))
    ours.extend(_td(3, 700))                     # and the writer goes on from there
    assert sorted(plane.contents()["action"].tolist()) == list(range(203, 703))


def test_non_round_robin_writes_are_refused():
    plane = ExperiencePlane(SPEC, capacity=16)
    storage = PlaneStorage(plane)
    with pytest.raises(InputError, match="RoundRobinWriter"):
        storage.set(torch.tensor([3, 4]), _td(2))
    with pytest.raises(InputError, match="set_cursor"):
        storage[0] = _td(1)[0]
    assert len(plane) == 0
