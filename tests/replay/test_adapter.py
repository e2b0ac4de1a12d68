"""The replay-buffer adapter: add / extend / sample / __len__ / get_state / set_state."""
import re

import numpy as np
import pytest
from replay_helpers import CARTPOLE, make_batch

from dask_research import replay
from dask_research.exceptions import InputError
from dask_research.replay import ExperiencePlane, PrioritizedSampler, ReplayBufferAdapter


def _one(i):
    b = make_batch(1, start=i, seed=i)
    return {k: v[0] for k, v in b.items()}


def test_interface_round_trip():
    rb = ReplayBufferAdapter(ExperiencePlane(CARTPOLE, capacity=64, seed=0,
                                             sampler=PrioritizedSampler()), batch_size=16)
    for i in range(10):
        rb.add(_one(i))
    rb.extend(make_batch(30, start=10))
    assert len(rb) == 40
    b = rb.sample()
    assert b.size == 16 and b.weights is not None
    np.testing.assert_array_equal(b.action, b.indices)
    assert rb.update_priority(b.indices, np.full(16, 2.0)) == 16
    state = rb.get_state()
    rb2 = ReplayBufferAdapter(ExperiencePlane(CARTPOLE, capacity=64, sampler=PrioritizedSampler()),
                              batch_size=16)
    rb2.load_state_dict(state)
    assert len(rb2) == 40
    np.testing.assert_array_equal(rb2.sample().indices, rb.sample().indices)


def test_torch_output_and_a_framework_style_loop():
    torch = pytest.importorskip("torch")
    rb = ReplayBufferAdapter(ExperiencePlane(CARTPOLE, capacity=1000, seed=0), batch_size=32,
                             to="torch")
    rb.extend({k: torch.from_numpy(v) for k, v in make_batch(200).items()})
    q = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(q.parameters(), lr=0.01)
    for _ in range(5):
        b = rb.sample()
        target = b.reward + 0.99 * (~b.done) * q(b.next_obs).max(1).values.detach()
        loss = ((q(b.obs).gather(1, b.action[:, None] % 2).squeeze(1) - target) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert torch.isfinite(loss)


def test_extend_over_capacity_keeps_the_newest_or_raises():
    from dask_research.exceptions import CapacityError

    rb = ReplayBufferAdapter(ExperiencePlane(CARTPOLE, capacity=16, seed=0), batch_size=4)
    rb.extend(make_batch(40))
    assert len(rb) == 16
    np.testing.assert_array_equal(np.sort(rb.plane.contents()["action"]), np.arange(24, 40))
    strict = ReplayBufferAdapter(ExperiencePlane(CARTPOLE, capacity=16), overflow="raise")
    with pytest.raises(CapacityError):
        strict.extend(make_batch(40))
    assert len(strict) == 0


def test_a_tensordict_is_accepted():
    torch = pytest.importorskip("torch")
    tensordict = pytest.importorskip("tensordict")
    b = make_batch(8)
    td = tensordict.TensorDict({k: torch.from_numpy(v) for k, v in b.items()}, batch_size=[8])
    rb = ReplayBufferAdapter(ExperiencePlane(CARTPOLE, capacity=16, seed=0), batch_size=4)
    rb.extend(td)
    rb.add(td[0])
    assert len(rb) == 9


@pytest.mark.parametrize("kwargs, bad", [({"batch_size": 0}, "batch_size=0"), ({"batch_size": 2.5}, "batch_size=2.5"),
                                         ({"batch_size": "8"}, "batch_size='8'")])
def test_bad_adapter_arguments_are_refused_when_it_is_made(kwargs, bad):
    """batch_size=0 was accepted and failed only at the first sample(); a plane of None raised
    AttributeError."""
    plane = replay.ExperiencePlane(CARTPOLE, capacity=10)
    try:
        with pytest.raises(InputError, match=f"ReplayBufferAdapter: {re.escape(bad)} is invalid"):
            replay.ReplayBufferAdapter(plane, **kwargs)
    finally:
        plane.close()
    with pytest.raises(InputError, match="plane=None is invalid; expected an ExperiencePlane"):
        replay.ReplayBufferAdapter(None)
