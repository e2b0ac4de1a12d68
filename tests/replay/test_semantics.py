"""Semantics RL frameworks rely on: one-transition add, over-capacity ingest, float and bool
dones, termination vs truncation in n-step returns, prioritized batch order."""
import dask
import numpy as np
import pytest
from replay_helpers import CARTPOLE, make_batch

from dask_research.exceptions import CapacityError, InputError, SpecError
from dask_research.replay import ExperiencePlane, NStepReturn, PrioritizedSampler


def _rows(n, seed=0):
    b = make_batch(n, seed=seed)
    return [{k: v[i] for k, v in b.items()} for i in range(n)], b


# --- add(): the one-transition fast path ------------------------------------------------------
@pytest.mark.parametrize("prioritized", [False, True])
def test_add_stores_exactly_what_ingest_stores(prioritized):
    rows, b = _rows(300)
    kw = {"sampler": PrioritizedSampler(0.6, 0.4)} if prioritized else {}
    a = ExperiencePlane(CARTPOLE, capacity=128, seed=0, **kw)
    i = ExperiencePlane(CARTPOLE, capacity=128, seed=0, **kw)
    try:
        for k, r in enumerate(rows):
            # numpy arrays and numpy scalars, Python scalars, a float done (0.0 / 1.0)
            v = dict(r) if k % 3 else {**r, "action": int(r["action"]), "reward": float(r["reward"]),
                                       "done": float(r["done"])}
            assert a.add(**v) == 1
            i.ingest(r)
        ca, ci = a.contents(), i.contents()
        for name in CARTPOLE:
            assert ca[name].dtype == ci[name].dtype
            np.testing.assert_array_equal(ca[name], ci[name])
        assert (a.total, a.size, a.cursor) == (i.total, i.size, i.cursor) == (300, 128, 300 % 128)
        np.testing.assert_array_equal(ca["action"], np.arange(172, 300))
        if prioritized:                     # new transitions get the largest priority
            np.testing.assert_array_equal(a.sampler.tree.leaves(), i.sampler.tree.leaves())
        np.testing.assert_array_equal(a.sample(64).indices, i.sample(64).indices)
        assert a.stats()["ingest_calls"] == 300
    finally:
        a.close()
        i.close()


def test_add_takes_torch_and_other_dtypes_through_the_general_path():
    torch = pytest.importorskip("torch")
    p = ExperiencePlane(CARTPOLE, capacity=8, seed=0)
    try:
        p.add(obs=torch.ones(4), action=torch.tensor(3), reward=np.float64(0.5),
              next_obs=np.ones(4, np.float64), done=torch.tensor(True))
        c = p.contents()
        assert c["action"].tolist() == [3] and c["done"].tolist() == [True]
        assert c["obs"].dtype == np.float32 and c["reward"].tolist() == [0.5]
    finally:
        p.close()


@pytest.mark.parametrize("change, match", [
    ({"action": 1.5}, "field 'action': dtype float64 cannot be stored as int64"),
    ({"action": 2 ** 70}, "field 'action'"),
    ({"reward": 1e300}, "field 'reward': value 1e\\+300 overflows float32"),
    ({"reward": np.float64(1e300)}, "field 'reward': value 1e\\+300 overflows float32"),
    ({"done": 0.5}, "field 'done': value 0.5 is not a flag"),
    ({"done": 2}, "field 'done': value 2 is not a flag"),
    ({"obs": np.zeros(3, np.float32)}, r"field 'obs': shape \(3,\) is neither"),
    ({"obs": np.zeros((2, 4), np.float32)}, "holds one transition but field 'obs' holds a batch of 2"),
    ({"extra": 1}, "field 'extra': is not in the spec"),
    ({"done": None}, "field 'done'"),
])
def test_add_refuses_what_ingest_refuses_and_writes_nothing(change, match):
    rows, _ = _rows(3)
    p = ExperiencePlane(CARTPOLE, capacity=8, seed=0)
    try:
        p.add(**rows[0])
        before = p.contents()
        with pytest.raises(SpecError, match=match):
            p.add(**{**rows[1], **change})
        assert len(p) == 1 and p.total == 1
        for k, v in p.contents().items():
            np.testing.assert_array_equal(v, before[k])
    finally:
        p.close()


def test_add_of_a_missing_field_and_of_a_batch():
    rows, b = _rows(2)
    p = ExperiencePlane(CARTPOLE, capacity=8, seed=0)
    try:
        r = dict(rows[0])
        r.pop("done")
        with pytest.raises(SpecError, match="field 'done': is missing"):
            p.add(**r)
        with pytest.raises(SpecError, match="add\\(\\) takes one transition; got a batch of 2"):
            p.add(**b)
        assert len(p) == 0
    finally:
        p.close()


# --- over-capacity ingest ---------------------------------------------------------------------
@pytest.mark.parametrize("prioritized", [False, True])
def test_keep_newest_keeps_the_newest_and_counts_all(prioritized):
    kw = {"sampler": PrioritizedSampler(0.6, 0.4)} if prioritized else {}
    p = ExperiencePlane(CARTPOLE, capacity=100, seed=0, **kw)
    try:
        p.ingest(make_batch(30))
        assert p.ingest(make_batch(250, start=30), overflow="keep-newest") == 250
        assert (len(p), p.total) == (100, 280)
        np.testing.assert_array_equal(p.contents()["action"], np.arange(180, 280))
        b = p.sample(2000)
        np.testing.assert_array_equal(b.action, b.indices)          # key k in slot k % cap
        assert b.indices.min() >= 180 and b.indices.max() < 280
        assert p.stats()["inserted"] == 280
        p.ingest(make_batch(10, start=280))                         # the ring goes on from there
        np.testing.assert_array_equal(p.contents()["action"], np.arange(190, 290))
        assert p.update_priorities(p.sample(5).indices, np.ones(5)) == (5 if prioritized else 0)
    finally:
        p.close()


def test_over_capacity_raises_by_default_and_the_config_chooses():
    p = ExperiencePlane(CARTPOLE, capacity=10, seed=0)
    try:
        with pytest.raises(CapacityError, match="overflow='keep-newest'"):
            p.ingest(make_batch(11))
        with pytest.raises(InputError, match="overflow"):
            p.ingest(make_batch(11), overflow="drop")
        assert len(p) == 0
        with dask.config.set({"research.replay.overflow": "keep-newest"}):
            p.ingest(make_batch(11))
        np.testing.assert_array_equal(p.contents()["action"], np.arange(1, 11))
    finally:
        p.close()


# --- float and bool dones ----------------------------------------------------------------------
def test_float_dones_into_a_bool_field_and_a_float_field():
    spec_b = dict(CARTPOLE)
    spec_f = {**CARTPOLE, "done": ((), "float32")}
    b = make_batch(50)
    fdone = b["done"].astype(np.float32)
    pb, pf = ExperiencePlane(spec_b, 128, seed=0), ExperiencePlane(spec_f, 128, seed=0)
    try:
        pb.ingest({**b, "done": fdone})              # refused before: float -> bool
        pb.ingest({**b, "done": b["done"].astype(np.int64)})
        assert pb.contents()["done"].dtype == np.bool_
        np.testing.assert_array_equal(pb.contents()["done"], np.r_[b["done"], b["done"]])
        pf.ingest({**b, "done": fdone})
        pf.ingest(b)                                 # bool into a float field: 0.0 / 1.0
        s = pf.sample(32)
        assert s.done.dtype == np.float32            # what was given comes back
        with pf.batches(32, prefetch=0, max_batches=1,
                        transforms=[NStepReturn(3, 0.9)]) as it:
            assert next(it).done.dtype == np.float32     # n-step keeps the stored dtype
    finally:
        pb.close()
        pf.close()


def test_bool_as_delivers_flags_a_torch_learner_can_subtract():
    torch = pytest.importorskip("torch")
    p = ExperiencePlane(CARTPOLE, 200, seed=0)
    try:
        p.ingest(make_batch(200))
        with p.batches(16, prefetch=0, to="torch", max_batches=1) as it:
            d = next(it).done
        assert d.dtype == torch.bool
        with pytest.raises(RuntimeError):
            1 - d                                                  # torch refuses it
        for pf, tf in ((0, ()), (2, ()), (1, [NStepReturn(2, 0.9)])):
            with p.batches(16, prefetch=pf, to="torch", max_batches=2, bool_as="float32",
                           transforms=tf) as it:
                for b in it:
                    assert b.done.dtype == torch.float32
                    np.testing.assert_array_equal((1 - b.done).numpy(),
                                                  1 - p.gather_keys(b.indices)[0]["done"]
                                                  if not tf else (1 - b.done).numpy())
                    assert b.obs.dtype == torch.float32 and b.action.dtype == torch.int64
        with pytest.raises(InputError, match="bool_as"):
            p.batches(16, bool_as="U3")
    finally:
        p.close()


# --- termination vs truncation ------------------------------------------------------------------
def _reference(rows, key, n, gamma, newest):
    """Per-transition n-step reference: stop at termination or truncation or the newest."""
    r, disc, m = 0.0, 1.0, 0
    k = key
    while True:
        t = rows[k]
        r += disc * t["reward"]
        disc *= gamma
        m += 1
        if t["terminated"] or t["truncated"] or m == n or k + 1 >= newest:
            return r, t["terminated"], t["truncated"], t["next_obs"], gamma ** m
        k += 1


@pytest.mark.parametrize("n", [1, 3, 5])
def test_nstep_bootstraps_through_truncation_not_termination(n):
    spec = {"reward": ((), "float64"), "terminated": ((), "bool"), "truncated": ((), "bool"),
            "next_obs": ((2,), "float32")}
    rng = np.random.default_rng(1)
    N = 400
    term = rng.random(N) < 0.08
    trunc = ~term & (rng.random(N) < 0.08)
    data = {"reward": rng.random(N), "terminated": term, "truncated": trunc,
            "next_obs": rng.standard_normal((N, 2)).astype(np.float32)}
    rows = [{k: v[i] for k, v in data.items()} for i in range(N)]
    p = ExperiencePlane(spec, N, seed=0)
    try:
        p.ingest(data)
        ns = NStepReturn(n, 0.9, done="terminated", truncated="truncated")
        with p.batches(256, prefetch=0, max_batches=4, transforms=[ns]) as it:
            for b in it:
                for j, key in enumerate(b.indices):
                    r, te, tr, nx, d = _reference(rows, int(key), n, 0.9, N)
                    assert b.reward[j] == pytest.approx(r)
                    assert (bool(b.terminated[j]), bool(b.truncated[j])) == (bool(te), bool(tr))
                    np.testing.assert_array_equal(b.next_obs[j], nx)
                    assert b.discount[j] == pytest.approx(d, rel=1e-6)
                assert b.terminated.dtype == np.bool_ and b.truncated.dtype == np.bool_
        with pytest.raises(InputError, match="field"):
            NStepReturn(3, 0.9, done="terminated", truncated="cut").bind(p)
    finally:
        p.close()


# --- prioritized batch order ---------------------------------------------------------------------
def test_prioritized_batches_come_in_draw_order_reproducibly():
    def plane(shuffle):
        p = ExperiencePlane(CARTPOLE, 5000, seed=3, sampler=PrioritizedSampler(0.6, 0.4, shuffle=shuffle))
        p.ingest(make_batch(5000))
        p.update_priorities(np.arange(5000), np.random.default_rng(0).random(5000) + 0.1)
        return p

    a, b, s = plane(True), plane(True), plane(False)
    try:
        for _ in range(5):
            x, y, z = a.sample(256), b.sample(256), s.sample(256)
            np.testing.assert_array_equal(x.indices, y.indices)        # the seed decides
            np.testing.assert_array_equal(x.weights, y.weights)
            assert (np.diff(z.indices % 5000) >= 0).all()              # shuffle=False: sorted
            assert not (np.diff(x.indices) >= 0).all()
            o = np.argsort(x.indices, kind="stable")                   # the same draws
            np.testing.assert_array_equal(x.indices[o], np.sort(z.indices))
            np.testing.assert_array_equal(x.action, x.indices)
            np.testing.assert_array_equal(np.sort(x.weights), np.sort(z.weights))
    finally:
        for p in (a, b, s):
            p.close()


def test_prioritized_shuffle_survives_a_checkpoint(tmp_path):
    p = ExperiencePlane(CARTPOLE, 100, seed=0, sampler=PrioritizedSampler(0.6, 0.4, shuffle=False))
    try:
        p.ingest(make_batch(100))
        p.checkpoint(tmp_path / "ck")
        q = ExperiencePlane.restore(tmp_path / "ck")
        assert q.sampler.shuffle is False
        np.testing.assert_array_equal(p.sample(64).indices, q.sample(64).indices)
        q.close()
    finally:
        p.close()


def test_add_on_a_tiered_plane_goes_through_ingest():
    from dask_research.replay import HostTier

    rows, _ = _rows(50)
    p = ExperiencePlane(CARTPOLE, tiers=[HostTier(20 * 48, name="fast"), HostTier(80 * 48)],
                        migrate="manual", seed=0)
    try:
        for r in rows:
            p.add(**r)
        assert (len(p), p.total) == (50, 50) and p._add_plan is None
        np.testing.assert_array_equal(p.contents()["action"], np.arange(50))
        with pytest.raises(SpecError, match="not a flag"):
            p.add(**{**rows[0], "done": 0.5})
        assert p.total == 50
    finally:
        p.close()
