"""ExperienceSpec: construction, validation errors naming the field, no partial writes."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from replay_helpers import CARTPOLE, make_batch

from dask_research.exceptions import CapacityError, SpecError
from dask_research.replay import ExperiencePlane, ExperienceSpec
from dask_research.testing.replay import batches, specs


def test_record_layout_is_aligned_and_fields_are_views():
    spec = ExperienceSpec(CARTPOLE)
    assert spec.itemsize % 8 == 0
    for name, (dt, off) in spec.record_dtype.fields.items():
        assert off % dt.base.itemsize == 0, name
    rec = spec.empty(3)
    assert rec["obs"].base is not None  # a view into the records


@pytest.mark.parametrize("fields, match", [
    ({}, "non-empty mapping"),
    ({"obs": (4, "float32"), "indices": ((), "int64")}, "field 'indices': is reserved"),
    ({"obs": ((4,), "object")}, "not a plain numeric"),
    ({"obs": ((0,), "float32")}, "non-positive dimension"),
    ({"obs": "float32"}, r"described by \(shape, dtype\)"),
    ({"obs": {"shape": (4,), "type": "float32"}}, r"described by \(shape, dtype\) or \{'shape'"),
    ({"obs": ((2.5,), "float32")}, r"shape must be a tuple of whole numbers; got \(2.5,\)"),
    ({"obs": ("4", "float32")}, r"shape must be a tuple of whole numbers; got '4'"),
    ({"obs": ((True,), "float32")}, r"shape must be a tuple of whole numbers"),
])
def test_bad_specs(fields, match):
    with pytest.raises(SpecError, match=match):
        ExperienceSpec(fields)


def test_a_field_may_be_described_by_a_mapping():
    """``{"shape": ..., "dtype": ...}`` (how gymnasium and TorchRL users think of a field) was
    unpacked as its two keys and failed with a raw ValueError from int('s')."""
    spec = ExperienceSpec({"obs": {"shape": (4,), "dtype": "float32"}, "done": {"dtype": "bool", "shape": ()}})
    assert spec == ExperienceSpec({"obs": ((4,), "float32"), "done": ((), "bool")})


@pytest.mark.parametrize("mutate, match", [
    (lambda b: b.pop("reward"), "field 'reward': is missing from the batch"),
    (lambda b: b.update(extra=np.zeros(8)), "field 'extra': is not in the spec"),
    (lambda b: b.update(obs=np.zeros((8, 3), "float32")), r"field 'obs': shape \(8, 3\) is neither"),
    (lambda b: b.update(action=np.zeros(8, "float64")),
     "field 'action': dtype float64 cannot be stored as int64"),
    (lambda b: b.update(done=np.full(8, 2, "int64")), "field 'done': value 2 is not a flag"),
    (lambda b: b.update(done=np.full(8, 0.5)), "field 'done': value 0.5 is not a flag"),
    (lambda b: b.update(done=np.full(8, np.nan, "float32")), "field 'done': value nan is not a flag"),
    (lambda b: b.update(obs=np.zeros((8, 4), "complex64")),
     "field 'obs': dtype complex64 cannot be stored as float32"),
    (lambda b: b.update(reward=np.zeros(7, "float32")),
     "field 'reward': has 7 transitions but field 'obs' has 8"),
    (lambda b: b.update(next_obs=np.zeros(4, "float32")),
     "field 'next_obs': holds one transition but field 'obs' holds a batch of 8"),
    (lambda b: b.update(obs=np.array(["a"] * 32).reshape(8, 4)), "field 'obs': dtype <U1"),
])
def test_bad_batches_name_the_field_and_write_nothing(mutate, match):
    plane = ExperiencePlane(CARTPOLE, capacity=16, seed=0)
    plane.ingest(make_batch(10))
    before = plane.contents()
    bad = make_batch(8, start=100)
    mutate(bad)
    with pytest.raises(SpecError, match=match):
        plane.ingest(bad)
    after = plane.contents()
    assert plane.total == 10 and len(plane) == 10
    for k in before:
        np.testing.assert_array_equal(before[k], after[k])


NARROW = {"small": ((), "int8"), "count": ((), "uint8"), "obs": ((2,), "float32"),
          "half": ((), "float16"), "z": ((), "complex64")}


def _narrow_batch(n=4):
    return {"small": np.arange(n, dtype=np.int64), "count": np.arange(n, dtype=np.uint16),
            "obs": np.ones((n, 2)), "half": np.zeros(n, np.float32), "z": np.zeros(n, complex)}


@pytest.mark.parametrize("field, values, match", [
    ("small", np.array([1, 300, 2, 3]), r"field 'small': value 300 does not fit in int8 "
                                        r"\(range -128..127\)"),
    ("small", np.array([1, -129, 2, 3]), "value -129 does not fit in int8"),
    ("count", np.array([1, 256, 2, 3], np.uint16), r"field 'count': value 256 does not fit in "
                                                   r"uint8 \(range 0..255\)"),
    ("obs", np.array([[1e300, 0], [0, 0], [0, 0], [0, 0]]), r"field 'obs': value 1e\+300 "
                                                            "overflows float32"),
    ("obs", np.array([[np.nan, np.inf], [-1e39, 0], [0, 0], [0, 0]]), r"value -1e\+39 overflows"),
    ("half", np.array([1.0, 70000.0, 0, 0], np.float32), "field 'half': value 70000.0 overflows float16"),
    ("z", np.array([1, 1e300j, 0, 0]), "field 'z': value 1e\\+300 overflows complex64"),
])
def test_narrowing_casts_that_do_not_fit_are_refused_and_write_nothing(field, values, match):
    plane = ExperiencePlane(NARROW, capacity=16, seed=0)
    plane.ingest(_narrow_batch())
    before = plane.contents()
    bad = _narrow_batch()
    bad[field] = values
    with pytest.raises(SpecError, match=match):
        plane.ingest(bad)
    assert plane.total == 4
    after = plane.contents()
    for k in before:
        np.testing.assert_array_equal(before[k], after[k])
    with pytest.raises(SpecError, match="value 300 does not fit in int8"):     # one transition
        plane.ingest({**{k: v[0] for k, v in _narrow_batch().items()}, "small": 300})


def test_narrowing_casts_that_fit_are_stored():
    plane = ExperiencePlane(NARROW, capacity=16, seed=0)
    b = _narrow_batch()
    b["small"] = np.array([-128, 127, 0, 5])
    b["count"] = np.array([0, 255, 1, 2], np.uint16)
    b["obs"] = np.array([[np.nan, np.inf], [-np.inf, 3.4028235e38], [0.1, 1e-50], [0, 0]])
    b["half"] = np.array([65504.0, -65504.0, np.nan, 1e-3], np.float32)
    plane.ingest(b)
    c = plane.contents()
    np.testing.assert_array_equal(c["small"], [-128, 127, 0, 5])
    np.testing.assert_array_equal(c["count"], [0, 255, 1, 2])
    np.testing.assert_array_equal(c["obs"], b["obs"].astype(np.float32))    # rounding is fine
    assert np.isinf(c["obs"]).sum() == 2 and np.isnan(c["obs"]).sum() == 1
    np.testing.assert_array_equal(c["half"], b["half"].astype(np.float16))


def test_not_a_mapping():
    with pytest.raises(SpecError, match="a batch is a mapping"):
        ExperienceSpec(CARTPOLE).validate([1, 2, 3])


def test_one_transition_and_python_scalars():
    spec = ExperienceSpec(CARTPOLE)
    fields, n = spec.validate({"obs": [0.0, 1.0, 2.0, 3.0], "action": 1, "reward": 0.5,
                               "next_obs": np.zeros(4), "done": False})
    assert n == 1 and fields["obs"].shape == (1, 4) and fields["action"].shape == (1,)


def test_torch_tensors_are_accepted():
    torch = pytest.importorskip("torch")
    plane = ExperiencePlane(CARTPOLE, capacity=8, seed=0)
    b = {k: torch.from_numpy(v) for k, v in make_batch(5).items()}
    assert plane.ingest(b) == 5
    np.testing.assert_array_equal(plane.contents()["obs"], b["obs"].numpy())
    with pytest.raises(SpecError, match="field 'obs': torch tensor of dtype torch.bfloat16"):
        plane.ingest({**b, "obs": b["obs"].to(torch.bfloat16)})


def test_spec_json_roundtrip():
    spec = ExperienceSpec(CARTPOLE)
    assert ExperienceSpec.from_json(spec.to_json()) == spec
    assert ExperienceSpec(spec) == spec


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_ingested_batches_come_back_exactly(data):
    spec = data.draw(specs())
    cap = data.draw(st.integers(1, 40))
    plane = ExperiencePlane(spec, capacity=cap, seed=0)
    sent = []
    for _ in range(data.draw(st.integers(1, 4))):
        b = data.draw(batches(spec, max_size=30))
        n = len(next(iter(b.values()))) if b else 0
        if n > cap:                               # a batch larger than the plane is refused
            with pytest.raises(CapacityError, match=f"a batch of {n:,} transitions"):
                plane.ingest(b)
            continue
        plane.ingest(b)
        sent.append(b)
    if not sent:
        return
    got = plane.contents()
    for name, f in spec.fields.items():
        want = np.concatenate([b[name] for b in sent])[-cap:].astype(f.dtype)
        np.testing.assert_array_equal(got[name], want)


def test_a_mapping_whose_keys_are_not_names_is_refused_clearly():
    class Rows(dict):                      # iterates like a TensorDict: over rows, not keys
        def __iter__(self):
            return iter([{"obs": 1}])

    with pytest.raises(SpecError, match="a batch's keys are field names .str.; iterating the "
                                        "Rows gave a dict"):
        ExperienceSpec(CARTPOLE).validate(Rows(make_batch(2)))


def test_a_tensordict_is_ingested_by_its_leaves():
    torch = pytest.importorskip("torch")
    tensordict = pytest.importorskip("tensordict")
    spec = {"obs": ((4,), "float32"), "action": ((), "int64"), "next.obs": ((4,), "float32"),
            "next.done": ((), "bool")}
    plane = ExperiencePlane(spec, capacity=32, seed=0)
    td = tensordict.TensorDict({"obs": torch.arange(32.0).reshape(8, 4), "action": torch.arange(8),
                                "next": {"obs": torch.ones(8, 4), "done": torch.zeros(8, dtype=torch.bool)}},
                               batch_size=[8])
    assert plane.ingest(td) == 8
    assert plane.ingest(td[0]) == 1                        # batch_size [] is one transition
    c = plane.contents()
    np.testing.assert_array_equal(c["obs"][:8], np.arange(32.0).reshape(8, 4))
    np.testing.assert_array_equal(c["action"], [*range(8), 0])
    np.testing.assert_array_equal(c["next.obs"], np.ones((9, 4)))
    with pytest.raises(SpecError, match="field 'next.done': is missing from the batch"):
        plane.ingest(td.exclude(("next", "done")))
    bad = td.clone()
    bad["action"] = torch.full((8,), 2**40)
    with pytest.raises(SpecError, match="field .action.: value 1099511627776 does not fit in int8"):
        ExperiencePlane({**spec, "action": ((), "int8")}, capacity=32).ingest(bad)
    assert len(plane) == 9


# --- review findings 9 and 14 (third nit): casts that change a value -------------------------
def test_a_masked_array_is_refused_not_stored_unchecked():
    plane = ExperiencePlane({"x": ((), "int8")}, capacity=8)
    masked = np.ma.array([300, 1, 2, 3], mask=[True, False, False, False])  # was stored as 44
    with pytest.raises(SpecError, match=r"field 'x': is a masked array.*x\.filled\(0\)"):
        plane.ingest({"x": masked})
    assert len(plane) == 0
    assert plane.ingest({"x": masked.filled(0).astype(np.int8)}) == 4


@pytest.mark.parametrize("value, dtype, stored", [
    (16777217, "float32", 16777216), (2**53 + 1, "float64", 2**53),
    (-(2**31) + 1, "float32", -(2**31)), (2**64 - 1, "float64", 2**64), (2049, "float16", 2048),
    (16777217, "complex64", 16777216),
])
def test_int_to_float_rounding_that_changes_an_integer_is_refused(value, dtype, stored):
    src = np.uint64 if value >= 2**63 else np.int64
    spec = ExperienceSpec({"id": ((), dtype), "ok": ((), "float32")})
    batch = {"id": np.array([1, value], src), "ok": np.zeros(2, np.float32)}
    with pytest.raises(SpecError, match=rf"field 'id': integer {value} is not exactly "
                                        rf"representable in {dtype} \(it would be stored as "
                                        rf"{stored}\)"):
        spec.validate(batch)
    plane = ExperiencePlane(spec, capacity=4)
    with pytest.raises(SpecError):
        plane.ingest(batch)
    assert len(plane) == 0


def test_exact_int_to_float_casts_are_accepted():
    spec = ExperienceSpec({"f32": ((), "float32"), "f64": ((), "float64"), "f16": ((), "float16")})
    big = np.array([16777216, 2**40, -(2**63), 3], np.int64)     # powers of two times small odds
    fields, n = spec.validate({"f32": big, "f64": np.array([2**53, 2**62, -(2**63), 3]),
                               "f16": np.array([2048, 4096, -65504, 3], np.int32)})
    assert n == 4
    plane = ExperiencePlane(spec, capacity=4)
    plane.ingest({"f32": big, "f64": np.arange(4, dtype=np.int32),   # int32 -> float64: no check
                  "f16": np.arange(4, dtype=np.int8)})
    np.testing.assert_array_equal(plane.contents()["f32"].astype(np.float64), big.astype(np.float64))


def test_update_priorities_refuses_keys_that_a_cast_would_change():
    from dask_research.exceptions import InputError
    from dask_research.replay import PrioritizedSampler

    plane = ExperiencePlane({"x": ((), "float32")}, capacity=8, sampler=PrioritizedSampler(),
                            migrate="manual")
    plane.ingest({"x": np.arange(8, dtype=np.float32)})
    with pytest.raises(InputError, match=r"indices='float64 values such as 2.9' is invalid; "
                                         r"expected integer keys"):
        plane.update_priorities(np.array([2.9, 5.5]), np.array([1000.0, 1000.0]))  # keys 2, 5
    with pytest.raises(InputError, match=r"indices=18446744073709551615 is invalid; expected "
                                         r"integer keys below 2\*\*63"):
        plane.update_priorities(np.array([2**64 - 1], np.uint64), np.array([5.0]))
    with pytest.raises(InputError, match=r"priorities='complex128 values such as \(1\+2j\)'"):
        plane.update_priorities(np.array([1]), np.array([1 + 2j]))
    with pytest.raises(InputError, match=r"update_priorities: indices='\[1180591620717411303424\]' is "
                                         r"invalid; expected integer keys below 2\*\*63"):
        plane.update_priorities([2**70], [1.0])      # a list numpy holds only as objects
    with pytest.raises(InputError, match=r"priorities='\[1148130695.*\.\.\.' is invalid; expected real numbers"):
        plane.update_priorities([1], [2**2000])
    assert plane.update_priorities([], []) == 0
    assert plane.update_priorities(np.array([3, 6], np.uint32), np.array([7, 9])) == 2
    leaves = plane.sampler.tree.sum[plane.sampler.tree.L + np.arange(8)]
    assert leaves[3] > leaves[2] and leaves[6] > leaves[5]


@pytest.mark.parametrize("value", [16777217, np.int64(16777217), np.uint64(2**63 + 1)])
def test_add_refuses_an_integer_that_a_float_field_would_round(value):
    plane = ExperiencePlane({"id": ((), "float32"), "obs": ((2,), "float32")}, capacity=4)
    with pytest.raises(SpecError, match="field 'id': integer .* is not exactly representable in float32"):
        plane.add(id=value, obs=np.zeros(2, np.float32))
    assert len(plane) == 0
    assert plane.add(id=16777216, obs=np.zeros(2, np.float32)) == 1     # exact: the fast path
    assert plane.add(id=np.int64(-5), obs=np.zeros(2, np.float32)) == 1
    np.testing.assert_array_equal(plane.contents()["id"], [16777216, -5])
    with pytest.raises(SpecError, match="field 'obs': is a masked array"):
        plane.add(id=1, obs=np.ma.array([1.0, 300.0], mask=[False, True]))


def test_a_field_or_record_of_2_gib_or_more_is_refused_in_one_line():
    """numpy refused the field with its own ValueError, and a record of several large fields
    wrapped its offsets round (a negative itemsize, then a MemoryError of -1 GiB)."""
    with pytest.raises(SpecError, match=r"field 'x': shape \(536870912,\) of float64 is "
                                        r"4,294,967,296 bytes per transition"):
        ExperienceSpec({"x": ((2**29,), "float64")})
    with pytest.raises(SpecError, match="a record holds less than 2 GiB"):
        ExperienceSpec({k: ((2**28,), "float32") for k in "xyz"})
